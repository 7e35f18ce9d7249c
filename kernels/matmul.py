"""A batch-invariant linear layer: y = x @ weight.T (+ bias), bf16/fp16, fp32 accumulation.

Why: the engine verifies a tree of N tokens in one [N, K] GEMM and decodes AR in [1, K] GEMVs.
cuBLAS picks its algorithm (tile, split-K) from M, so a row's dot products are summed in a
different order at M=1 than at M=128, and a near-tie between two logits can flip: greedy
speculative answers then differ from greedy AR answers in bf16. Here every row of
the output is bitwise the same whatever M is and whatever the other rows hold:

  * One tile config per (N, K) (`choose_config`), never chosen from M. Every output element is
    accumulated by the same m64 MMA instruction sequence whatever M is: on Hopper Triton emits
    wgmma for a 64-row warpgroup tile (and mma.sync below 64 rows with 4 warps, which may round
    differently), so a program covers 64 rows with 4 warps (one warpgroup), or, past 64 rows
    (`block_m_for`), 128 rows with 8 warps: two warpgroups, each running the 64-row program's
    m64nNk16 wgmma steps (N = BLOCK_N in both: Triton picks the instruction's N from the tile
    width per warpgroup) on its own 64 rows. A weight in one K group may take another tile where
    WIDE_PICKS lists it (`WideTile`: 64, 128 or 256 rows, up to 256 columns, 64- or 128-deep K
    blocks): each of its elements is one chain of k16 steps over K in order whatever the tile. AR (M=1) wastes
    63/64 of the MMA work, which is free there: the GEMV is bound by streaming the weight.
  * K is cut into `groups` consecutive groups of whole BLOCK_K blocks (a function of N and K).
    Each group is accumulated alone in fp32 (tl.dot over its blocks in order, from zero), and
    the group sums are added in group order to a zero fp32 total; the bias is added once to
    the total; then the cast. That arithmetic is fixed; only where it runs depends on M:
      - split launch (`use_split`: few output tiles, e.g. AR): one program per (tile, group) writes its
        group sum to an fp32 partial buffer [groups, M, N]; `_sum_groups_kernel` adds them in
        group order (no atomics), adds the bias and casts. `linear_partials_triton` skips that
        second launch and hands the buffer on (`Partials`) to a consumer that does the same adds
        as it loads its input (kernels/fused.py: add_rms_norm, qkv_rope_write): one launch fewer.
      - fused launch (otherwise): one program per tile runs every group and
        adds each finished group sum to its total in the same order.
    Both launches execute the same dots on the same operands and the same fp32 adds in the same
    order, so they give the same bits; the CUDA tests check it on the real shapes.
  * M is not specialised on (do_not_specialize): one compiled kernel for every row count.
  * `enable_fp_fusion=False`: no FMA contraction that could differ between the two kernels.

A row's result does not depend on its position in the tile either: the MMA computes each
output element from its own row and column with the same instruction sequence.

Under TRITON_INTERPRET=1 (CPU tests) the operands are upcast to fp32 before tl.dot: the
interpreter's bf16 dot returns garbage (triton 3.9), and bf16/fp16 products are exact in fp32.

CUDA-graph safe: no host syncs; the grids and the partial buffer depend on shapes only.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .launch import interpreting, launch_args, wait_for_previous
from .matmul_tma import available as tma_available
from .matmul_tma import launch_tma
from .matmul_ws import available as ws_available
from .matmul_ws import fits as ws_fits
from .matmul_ws import launch_ws

try:  # triton is optional: CPU-only installs use F.linear.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None

BLOCK_M = 64  # rows per warpgroup, for every M: see the module docstring (wgmma on Hopper)
WIDE_BLOCK_M = 128  # rows per program past BLOCK_M rows: two warpgroups (`block_m_for`)
WIDE_NUM_STAGES = 3  # `stages_for`
WIDE_WARPS = 8  # warps of a `WideTile` program: two warpgroups
SUM_BLOCK = 256  # columns per program of the group-sum pass

# The GPU the rules are written for: an H100/H200 has 132 SMs. A constant, not the device's
# count, so that the numerics (the group count) are the same on every GPU.
SMS = 132
# Groups, only for weights with under one wave of N tiles at M=1 (o_proj, down, small qkv):
# enough (N tile, group) programs for two per SM, so the weight streams from every SM with
# several tiles in flight; each group at least MIN_GROUP_BLOCKS K blocks, so the fused launch
# pays a group boundary rarely and the partials stay small.
TARGET_PROGRAMS = 2 * SMS
MIN_GROUP_BLOCKS = 2
# The launch choice (`use_split`; speed only, never bits), read off the H200 timings of both
# launches (linear_variants.py): splitting over the K groups wins while the fused launch leaves
# SMs idle and the fp32 partials (8 * groups * M * N bytes, written and read back) stay within
# 1.5x the weight's bytes.
SPLIT_MAX_PARTIAL_RATIO = 1.5
# Fused launches of 128-row programs with at least this many output tiles run the persistent
# TMA-fed form (matmul_tma.py: the same arithmetic, the same bits). Read off the H200 timings of
# benchmarks/kernels_vs_vendor.py: it won only where tiles are plentiful (the lm_heads at M = 128
# and 256: 8B 677 -> 603 us at M = 256, 30B-A3B 370 -> 287) and lost at the per-layer linears.
TMA_MIN_TILES = 8 * SMS
# The warp-specialized Gluon form (matmul_ws.py: the same arithmetic, the same bits) for every
# launch on an sm_90 GPU. Off: as every launch it measured slower (the 8B AR step 1.40x,
# docs/kernels.md); the engine takes it only where WS_PICKS (below) says it won.
USE_WS = False
WS_SHARED_BYTES = 192 * 1024  # the stage ring of one warp-specialized program (`ws_stages`)
WS_MAX_STAGES = 8


@dataclass(frozen=True)
class WsPick:
    """A launch the warp-specialized form won for rows in (after_rows, up_to_rows] of one
    weight shape: `linear_ws` options (split / block_m / block_n / programs_per_sm: speed
    only, never bits)."""

    after_rows: int
    up_to_rows: int
    options: tuple[tuple[str, object], ...]


# Where the warp-specialized form beat the engine's launch by >= 8% at one real shape and row
# count (H200, 2026-11-27, benchmarks/kernels_vs_vendor.py on cdc000b, µs per call: engine ->
# pick), the engine takes it on an sm_90 GPU even with USE_WS off. Keyed by the weight's (N, K).
WS_PICKS: dict[tuple[int, int], tuple[WsPick, ...]] = {
    # Qwen3-8B qkv at 128 rows, 128-wide tiles: 27.5 -> 24.6
    (6144, 4096): (WsPick(64, 128, (("block_n", 128),)),),
    # Qwen3-8B o_proj at 256 rows, two 64-row programs an SM: 26.6 -> 24.4
    (4096, 4096): (WsPick(128, 256, (("programs_per_sm", 2), ("block_m", 64))),),
    # Qwen3-8B gate_up at 256 rows, two 64-row programs an SM: 105.9 -> 92.5
    (24576, 4096): (WsPick(128, 256, (("programs_per_sm", 2), ("block_m", 64))),),
    # Qwen3-8B down at 256 rows, split over its K groups: 77.1 -> 62.4 (group sum included)
    (4096, 12288): (WsPick(128, 256, (("split", True),)),),
    # Qwen2.5-1.5B o_proj at 128 rows, split: 9.6 -> 8.2
    (1536, 1536): (WsPick(64, 128, (("split", True),)),),
    # Qwen2.5-1.5B down at 256 rows, 128-wide tiles: 26.7 -> 22.0
    (1536, 8960): (WsPick(128, 256, (("block_n", 128),)),),
    # Qwen3-30B-A3B o_proj at 256 rows, fused: 22.5 -> 19.8
    (2048, 4096): (WsPick(128, 256, (("split", False),)),),
}


def ws_pick(m: int, n: int, k: int) -> dict | None:
    """The `linear_ws` options WS_PICKS holds for M rows of an [N, K] weight, or None."""
    for pick in WS_PICKS.get((n, k), ()):
        if pick.after_rows < m <= pick.up_to_rows:
            return dict(pick.options)
    return None


@dataclass(frozen=True)
class WideTile:
    """The launch of a weight in ONE K group where WIDE_PICKS lists it: speed only, never bits.
    Such an output element is one fp32 chain of m64nNk16 wgmma steps over K in order (then the
    bias, then the cast), and the chain is the same whatever the tile: every 64 rows are one
    warpgroup's slab (warps stacked on M: [4, 1] at 64 rows, [8, 1] past them), a wider BLOCK_N
    only widens each instruction's N (measured on Hopper: not a bit changes), and with one group a
    BLOCK_K of 128 is the same k16 steps as two blocks of 64. block_m: 64 (one warpgroup: the
    AR step and trees of up to 64 rows, with another width, depth or stage count than the
    config's), 128 (two warpgroups of 64 rows) or 256 (two of 128 rows, two m64 slabs each);
    block_n up to 256; tma: the persistent TMA-fed form (matmul_tma.py: the same tl.dot on the
    same tiles) with programs_per_sm programs an SM, else `_linear_kernel`'s grid (also where the
    TMA form cannot run: pre-sm_90).
    tail: the tile of the columns past this one's last whole wave (`head_columns`), launched
    after it. Where the output tiles fill one wave and a sliver of the next (the 1.5B gate_up at
    256 rows in 128 x 256 tiles: 140 on 132 SMs), the sliver's few big tiles would take as long
    as the whole wave; smaller tiles spread it over the SMs. Column ranges change no bit (each
    element is the same chain whichever tile computes it)."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    stages: int = WIDE_NUM_STAGES
    tma: bool = False
    programs_per_sm: int = 1
    tail: WideTile | None = None

    def shared_bytes(self) -> int:
        """The stage ring's shared memory (bf16/fp16 x and weight tiles)."""
        return 2 * self.block_k * (self.block_m + self.block_n) * self.stages

    @property
    def num_warps(self) -> int:
        """One warpgroup for a 64-row tile, two (WIDE_WARPS) for a taller one."""
        return 4 if self.block_m == BLOCK_M else WIDE_WARPS


def head_columns(m: int, n: int, tile: WideTile) -> int:
    """The columns of an [M, N] output that `tile` computes itself when it has a tail: those of
    its whole waves (SMS x programs_per_sm programs a wave), the rest going to tile.tail. All N
    without a tail, within one wave, when the tiles end on a whole wave, or when the whole waves
    hold no whole column of tiles (more M tiles than a wave has programs)."""
    slots = SMS * tile.programs_per_sm
    m_tiles, n_tiles = _cdiv(m, tile.block_m), _cdiv(n, tile.block_n)
    tiles = m_tiles * n_tiles
    if tile.tail is None or tiles <= slots or tiles % slots == 0:
        return n
    # Fewer than n_tiles columns of tiles (the last wave is part-filled), possibly none.
    return (tiles // slots) * slots // m_tiles * tile.block_n or n


@dataclass(frozen=True)
class WidePick:
    """The wide tile a one-group weight takes for rows in (after_rows, up_to_rows]."""

    after_rows: int
    up_to_rows: int
    tile: WideTile


# The wide tiles of one-group weights by (N, K) and rows (`wide_tile_for`; speed only, never
# bits): picked from `python3 benchmarks/kernels_vs_vendor.py --wide` (the fastest candidate
# whose every row equals the engine's launch bitwise). A shape or row count not listed takes the
# launch `block_m_for` / `stages_for` / `use_tma` choose. Rows listed here must not also be in
# WS_PICKS (a test checks).
# H200, 2026-11-27 (kernels_vs_vendor.py --wide on 4c4131e, µs per call: engine's launch -> pick; every
# candidate bitwise equal to the engine's launch at every point). At 256 rows the gate_ups found no
# tile 5% faster (1.5B 37.6 vs best 37.3, 8B 92.0 vs 88.8; cuBLAS 22.6 / 75.7). Up to 64 rows: H200,
# 2026-11-28 (the same sweep with its 64-row candidates, --rows 1,16,32,64): the 8B gate_up's
# 128-wide tiles (the rule's: 192 programs, two an SM, on 132 SMs) end on a part-filled wave; in
# 64-wide ones (384 programs, three an SM) it streams at cuBLAS's speed.
# H200, 2026-12-07 (the same sweep with its head + tail candidates on 487ad91, --rows 128,192,256
# --linears gate_up,lm_head): the 1.5B gate_up's part-filled last wave in 64 x 64 tiles
# (`WideTile.tail`). The lm_heads' tiles fill whole waves at these rows (no tail applies), and the
# same launch measured 206-240 µs across the sweep's columns: nothing there to pick from.
TAIL_64 = WideTile(64, 64, 64, 4)
WIDE_PICKS: dict[tuple[int, int], tuple[WidePick, ...]] = {
    # Qwen2.5-1.5B gate_up at 65-128 rows: 25.0 -> 21.7; 129-256 rows, the columns past the
    # first wave (140 tiles on 132 SMs) in 64 x 64 tiles: 192 / 256 rows 37.6 / 37.5 -> 30.4 / 31.1
    (17920, 1536): (WidePick(64, 128, WideTile(128, 256, 64, 4, tma=True, programs_per_sm=1)),
                    WidePick(128, 256, WideTile(128, 256, 64, 4, tma=True, programs_per_sm=1, tail=TAIL_64))),
    # Qwen2.5 lm_head (K 1536) at 129-192 rows: 258.4 -> 207.7
    (151936, 1536): (WidePick(128, 192, WideTile(128, 256, 64, 3, tma=True, programs_per_sm=1)),),
    # Qwen3-8B gate_up: 1 / 16 / 32 / 64 rows 58.4 / 58.7 / 59.2 / 59.9 -> 50.5 / 51.3 / 51.6 / 52.5
    # (cuBLAS 49.7 / 51.0 / 51.6 / 52.3); 65-128 rows 62.9 -> 57.8
    (24576, 4096): (WidePick(0, 64, WideTile(64, 64, 64, 4)),
                    WidePick(64, 128, WideTile(128, 256, 64, 4, tma=True, programs_per_sm=1))),
    # Qwen3-8B lm_head: 33-64 rows 333.2 -> 309.8; 129-192 rows 701.4 -> 513.1; 193-256 rows 602.2 -> 536.6
    (151936, 4096): (WidePick(32, 64, WideTile(64, 128, 64, 6, tma=True, programs_per_sm=1)),
                     WidePick(128, 192, WideTile(128, 256, 64, 3, tma=True, programs_per_sm=1)),
                     WidePick(192, 256, WideTile(256, 128, 64, 4, tma=True, programs_per_sm=1))),
    # Qwen3-30B-A3B lm_head: 129-192 rows 336.2 -> 276.6; 193-256 rows 300.7 -> 280.7
    (151936, 2048): (WidePick(128, 192, WideTile(128, 256, 64, 3, tma=True, programs_per_sm=1)),
                     WidePick(192, 256, WideTile(256, 128, 64, 4, tma=True, programs_per_sm=1))),
}


def wide_tile_for(m: int, n: int, k: int, config: LinearConfig) -> WideTile | None:
    """The wide tile for M rows of an [N, K] weight: WIDE_PICKS's entry for these rows, else None
    (the launch `block_m_for` / `stages_for` / `use_tma` choose: the 64-row one up to BLOCK_M rows,
    and for weights in several K groups `use_split`'s)."""
    if config.num_groups(k) != 1:
        return None
    for pick in WIDE_PICKS.get((n, k), ()):
        if pick.after_rows < m <= pick.up_to_rows:
            return pick.tile
    return None


@dataclass(frozen=True)
class Partials:
    """A linear's output before its sum: G parts [M, N] (a split launch's fp32 group sums; the
    tensor-parallel ranks' partials), the bias [N] or None, and the output dtype. Its value is
    `sum()`: the parts added in order to a zero fp32 total, the bias added, one cast. A consumer
    that takes Partials (rather than the linear's output) does exactly these adds per element as
    it loads.

    The parts live in one of two forms. `groups` a tensor [G, M, N] (one buffer); or, with
    `group_ptrs`, a tuple of G tensors [M, N], each dense (row stride N) and 16-byte aligned at
    its own address (a peer GPU's symmetric buffer, read in place), and `group_ptrs` their G
    addresses (int64, on their device) from which the kernels load them. Indexing `groups[g]` gives part g in both."""

    groups: torch.Tensor | tuple[torch.Tensor, ...]
    bias: torch.Tensor | None
    dtype: torch.dtype
    group_ptrs: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self.groups[0].shape

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def stacked(self) -> torch.Tensor:
        """The parts as one tensor [G, M, N] (a new one in the address-table form)."""
        return torch.stack(self.groups) if isinstance(self.groups, tuple) else self.groups

    def sum(self) -> torch.Tensor:
        """The linear's output [M, N], `_sum_groups_kernel`'s arithmetic in torch (tests, CPU)."""
        total = torch.zeros(self.shape, device=self.groups[0].device, dtype=torch.float32)
        for g in range(self.num_groups):
            total += self.groups[g]
        if self.bias is not None:
            total += self.bias.float()
        return total.to(self.dtype)


@dataclass(frozen=True)
class LinearConfig:
    """Launch shape for one (N, K). `groups` and block_k set the order of the sum (module
    docstring); block_n, num_warps and num_stages only change how the same per-element MMA
    steps are tiled, but they too are fixed per (N, K), never chosen from M."""

    block_n: int
    block_k: int
    groups: int  # K groups, each a run of ceil(k_blocks / groups) BLOCK_K blocks
    num_warps: int = 4
    num_stages: int = 4

    def group_blocks(self, k: int) -> int:
        """BLOCK_K blocks per group (the last group may have fewer)."""
        return -(-_cdiv(k, self.block_k) // self.groups)

    def num_groups(self, k: int) -> int:
        """Groups actually launched: `groups` rounded so that no group is empty."""
        return _cdiv(_cdiv(k, self.block_k), self.group_blocks(k))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def groups_for(n: int, k: int, block_n: int, block_k: int, target_programs: int = TARGET_PROGRAMS) -> int:
    """K groups for an [N, K] weight: 1 if its N tiles fill a wave of SMs, else enough for
    `target_programs` (N tile, group) programs at M=1, each group >= MIN_GROUP_BLOCKS blocks."""
    tiles = _cdiv(n, block_n)
    if tiles >= SMS:
        return 1
    return max(1, min(_cdiv(k, block_k) // MIN_GROUP_BLOCKS, _cdiv(target_programs, tiles)))


# Measured overrides of the rule below, by (N, K): the picks of `benchmarks/linear.py --sweep` (H200,
# µs at M = 1 / 64 / 128, rule -> tuned, split launches timed without the group-sum
# pass their consumer does) that also won inside the decoder stack (`benchmarks/linear_in_stack.py`: the
# 1.5B's forward 3.4% / 4.3% / 1.6% faster at T = 1 / 64 / 128). Shapes not listed (other models)
# use the rule. An entry changes the order of the sum for that weight at every M alike: a row
# stays the same in AR and in verify. Left out: the 8B's picks (o_proj and down in 128x128 tiles
# over 4 groups: 2-3% faster verifies, but the AR forward 1.9% slower in the stack, 147 KB of
# shared memory a program) and the 0.5B's other picks (< 0.5 µs a call).
TUNED: dict[tuple[int, int], LinearConfig] = {
    # Qwen2.5-1.5B. qkv: 6 stages, 4.8 / 5.5 / 7.2 -> 4.2 / 4.9 / 7.2.
    (2048, 1536): LinearConfig(block_n=64, block_k=64, groups=8, num_stages=6),
    # o_proj: 5 K groups of 5 blocks, 3.9 / 4.6 / 6.6 -> 3.7 / 4.3 / 6.4.
    (1536, 1536): LinearConfig(block_n=64, block_k=64, groups=5),
    # gate_up: 64-wide tiles (280 programs, up to 3 an SM), 19.1 / 20.0 / 26.3 -> 18.3 / 19.4 / 26.4.
    (17920, 1536): LinearConfig(block_n=64, block_k=64, groups=1),
    # down: 6 stages, 11.0 / 12.3 / 14.9 -> 10.4 / 11.8 / 15.2.
    (1536, 8960): LinearConfig(block_n=64, block_k=64, groups=11, num_stages=6),
    # lm_head: 3 stages, 118.9 / 129.0 / 149.1 -> 117.1 / 126.8 / 149.7.
    (151936, 1536): LinearConfig(block_n=128, block_k=64, groups=1, num_stages=3),
    # Qwen2.5-0.5B. lm_head: 3 stages, 73.0 / 81.2 / 96.7 -> 68.6 / 77.1 / 94.2.
    (151936, 896): LinearConfig(block_n=128, block_k=64, groups=1, num_stages=3),
}


@functools.lru_cache(maxsize=None)
def choose_config(n: int, k: int) -> LinearConfig:
    """The one config for an [N, K] weight (bf16/fp16; both are 2-byte types): TUNED if listed,
    else `rule_config`."""
    return TUNED.get((n, k)) or rule_config(n, k)


def rule_config(n: int, k: int) -> LinearConfig:
    """The config of a weight not in TUNED: 64x64 tiles (x 128 when N alone fills a wave of SMs),
    4 warps, 4 stages, and `groups_for` K groups. Measured on an H200 (linear_variants.py): for
    the weights that need K groups, 64-wide tiles were as fast at M=1 and 1.1-1.5x faster at
    M=128-256 than 128-wide ones (1.5B qkv M=256 fused 9.7 vs 13.9 us). Qwen2.5-1.5B: qkv 2048x1536 -> 8 groups,
    o_proj -> 8, gate_up 17920x1536 -> 1 (128 wide), down 1536x8960 -> 11, lm_head -> 1 (128
    wide). Qwen3-8B: qkv 6144x4096 -> 3, o -> 5, gate_up -> 1, down 4096x12288 -> 5, lm_head -> 1.
    Re-tune with  python3 benchmarks/linear.py --sweep
    """
    block_k = 64
    block_n = 128 if _cdiv(n, 128) >= SMS else 64
    return LinearConfig(block_n=block_n, block_k=block_k, groups=groups_for(n, k, block_n, block_k))


def block_m_for(m: int, groups: int, split: bool) -> int:
    """Rows per program for M rows (speed only, never bits: each 64-row warpgroup runs the same
    wgmma steps). Past 64 rows a 128-row program shares each weight tile in shared memory between
    two warpgroups, halving the programs and the weight reads from L2. Measured on an H200
    (benchmarks/linear.py) it pays where programs are plentiful: weights in one K group
    (gate_up, lm_head: 8B gate_up at M=128 65.9 vs 80.3 us) and split launches (1.5B down at
    M=256 27.0 vs 31.0); a fused launch over K groups has few N tiles, and halving its programs
    lost (1.5B qkv at M=128 15.2 vs 10.2 us), so it keeps 64 rows."""
    return WIDE_BLOCK_M if m > BLOCK_M and (groups == 1 or split) else BLOCK_M


def warps_for(block_m: int, config: LinearConfig) -> int:
    """config.num_warps per 64 rows: every warpgroup holds 64 rows of the tile."""
    return config.num_warps * block_m // BLOCK_M


def stages_for(block_m: int, config: LinearConfig) -> int:
    """Pipeline depth (speed only). The 128-row program keeps WIDE_NUM_STAGES: four 128x128 tile
    stages take 128 KB of shared memory, one program per SM (8B gate_up at M=128: 192 programs
    in 1.45 waves of 132); three take 96 KB, two per SM, one wave of 264."""
    return WIDE_NUM_STAGES if block_m == WIDE_BLOCK_M else config.num_stages


def use_split(m: int, n: int, k: int, config: LinearConfig) -> bool:
    """Launch choice for M rows (never changes the result). Measured on an H200 with the
    64-wide configs: 1.5B qkv splits up to M=64 (7.7 vs 9.5 us at M=1) and fuses from 128
    (9.6 vs 14.9); down splits at every M up to 256 (36.6 vs 43.3); 8B qkv splits up to 64
    (20.0 vs 25.2 at M=1) and fuses from 128, where its fused launch fills the SMs. The fused
    launch this weighs against is a 64-row one (`block_m_for`: a fused launch over K groups)."""
    groups = config.num_groups(k)
    fused_programs = _cdiv(m, BLOCK_M) * _cdiv(n, config.block_n)
    partial_bytes, weight_bytes = 8 * groups * m * n, 2 * n * k
    return groups > 1 and fused_programs <= SMS and partial_bytes <= SPLIT_MAX_PARTIAL_RATIO * weight_bytes


def use_tma(m: int, n: int, k: int, config: LinearConfig, block_m: int | None, device: torch.device) -> bool:
    """Whether a fused launch runs the persistent TMA form (TMA_MIN_TILES; speed only, never bits)."""
    block_m = block_m or block_m_for(m, config.num_groups(k), False)
    if block_m != WIDE_BLOCK_M or not tma_available(device):
        return False
    return _cdiv(m, block_m) * _cdiv(n, config.block_n) >= TMA_MIN_TILES


def ws_stages(block_m: int, block_n: int, block_k: int, programs_per_sm: int = 1) -> int:
    """Slots in a warp-specialized program's ring: as many x + weight tiles as WS_SHARED_BYTES
    (shared by `programs_per_sm` programs) holds, 2 to WS_MAX_STAGES. Speed only."""
    stage = 2 * block_k * (block_m + block_n)
    return max(2, min(WS_MAX_STAGES, WS_SHARED_BYTES // programs_per_sm // stage))


def _ws_runs(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the warp-specialized form can run this launch (an sm_90 GPU, Gluon, aligned rows)."""
    return ws_available(x.device) and ws_fits(x) and ws_fits(weight)


def _ws_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return USE_WS and _ws_runs(x, weight)


def _ws_picked(x: torch.Tensor, weight: torch.Tensor) -> dict | None:
    """`ws_pick`'s options where the warp-specialized form can run this launch, else None."""
    pick = ws_pick(x.shape[0], weight.shape[0], x.shape[1])
    return pick if pick is not None and _ws_runs(x, weight) else None


# ----------------------------------------------------------------------------- triton kernels

if triton is not None:

    @triton.jit(do_not_specialize=["M"])
    def _linear_kernel(
        X, W, B, Y, P, M, N, K, stride_xm, stride_wn, stride_ym, group_blocks, k_blocks,
        UPCAST: tl.constexpr, SPLIT: tl.constexpr, ONE_GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
    ):
        """grid (M tiles, N tiles[, groups]). M tiles vary fastest, so the programs that share a
        weight tile (and K group) run together and it is read from HBM once."""
        wait_for_previous(PDL)
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        # Rows past M are masked out of the x loads (zeros, no memory requests). Wrapped onto
        # valid rows instead, every x load at M=1 asked for one row 64 times, and M=1 ran at half
        # the speed of M=16 on the same grid.
        # Out-of-range columns wrap onto valid weight rows (only the last N tile has any). Neither
        # reaches a stored result: the MMA computes each element from its own row and column.
        row_ok = (rows < M)[:, None]
        offs_n = cols % N
        offs_k = tl.arange(0, BLOCK_K)
        if SPLIT:
            kb_start = tl.program_id(2) * group_blocks
            kb_end = tl.minimum(kb_start + group_blocks, k_blocks)
        else:
            kb_start = 0
            kb_end = k_blocks
        k0 = kb_start * BLOCK_K
        x_ptrs = X + rows[:, None].to(tl.int64) * stride_xm + (k0 + offs_k)[None, :]
        w_ptrs = W + offs_n[None, :].to(tl.int64) * stride_wn + (k0 + offs_k)[:, None]  # [BK, BN]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for kb in range(kb_start, kb_end):
            if EVEN_K:
                x = tl.load(x_ptrs, mask=row_ok, other=0.0)
                w = tl.load(w_ptrs)
            else:
                k_left = K - kb * BLOCK_K
                x = tl.load(x_ptrs, mask=row_ok & (offs_k[None, :] < k_left), other=0.0)
                w = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            if UPCAST:
                acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(x, w, acc)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
            if not SPLIT and not ONE_GROUP:
                # End of a group that is not the last: fold it into the total, start the next.
                if ((kb + 1) % group_blocks == 0) & (kb + 1 < kb_end):
                    total += acc
                    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        mask = row_ok & (cols < N)[None, :]
        if SPLIT:
            # The group sum, for _sum_groups_kernel. P: [groups, M, N] fp32, contiguous.
            p_ptrs = P + (tl.program_id(2).to(tl.int64) * M + rows[:, None]) * N + cols[None, :]
            tl.store(p_ptrs, acc, mask=mask)
        else:
            total += acc
            if HAS_BIAS:
                total += tl.load(B + offs_n).to(tl.float32)[None, :]
            y_ptrs = Y + rows[:, None].to(tl.int64) * stride_ym + cols[None, :]
            tl.store(y_ptrs, total.to(Y.dtype.element_ty), mask=mask)

    @triton.jit(do_not_specialize=["M"])
    def _sum_groups_kernel(P, B, Y, M, N, stride_ym, GROUPS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
                           PDL: tl.constexpr):
        """grid (M, N blocks): y = (0 + p_0 + p_1 + ... + p_{G-1}) (+ bias), cast; in group order.
        Unrolled (GROUPS constexpr) so that all the loads are issued before the adds."""
        wait_for_previous(PDL)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < N
        total = tl.zeros([BLOCK], dtype=tl.float32)
        for g in tl.static_range(GROUPS):
            total += tl.load(P + (g * M + row) * N + cols, mask=mask, other=0.0)
        if HAS_BIAS:
            total += tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + row * stride_ym + cols, total.to(Y.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------- wrappers


def linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Plain-torch oracle: fp32 products and sums (in torch's order), bias in fp32, one cast."""
    y = x.float() @ weight.float().T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def linear_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    *,
    config: LinearConfig | None = None,
    split: bool | None = None,
    block_m: int | None = None,
    tma: bool | None = None,
    wide: WideTile | None = None,
) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T (+ bias [N]) -> [M, N] in x's dtype, batch-invariant (module
    docstring). weight may be a row slice of a bigger weight (any row stride, unit column
    stride); x needs a unit column stride (else it is copied). out: an [M, N] destination with a
    unit column stride. config / split / block_m / tma / wide override `choose_config` /
    `use_split` / `block_m_for` / `use_tma` / `wide_tile_for` (benchmarks and tests; split,
    block_m, tma and wide never change the result, config does; tma=True only where `use_tma`'s
    device check holds; wide only for a weight in one K group). Given split, block_m or tma, a
    one-group weight takes `_linear_kernel`'s or `linear_tma`'s launch with the config's tile, not
    `wide_tile_for`'s."""
    x, weight, bias = _operands(x, weight, bias)
    m, n = x.shape[0], weight.shape[0]
    if out is None:
        out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    assert out.shape == (m, n) and out.dtype == x.dtype and out.stride(1) == 1, "out: [M, N], x's dtype"
    _launch(x, weight, bias, out, config=config, split=split, block_m=block_m, tma=tma, wide=wide)
    return out


def linear_partials_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    config: LinearConfig | None = None,
    split: bool | None = None,
    block_m: int | None = None,
) -> torch.Tensor | Partials:
    """`linear_triton`, except that where it takes the split launch the group sums come back
    unsummed (`Partials`, no group-sum pass) for a consumer that adds them as it loads; else the
    output [M, N]. Same bits either way once summed (module docstring)."""
    x, weight, bias = _operands(x, weight, bias)
    m, k = x.shape
    n = weight.shape[0]
    config = config or choose_config(n, k)
    picked = _ws_picked(x, weight) if split is None and block_m is None else None
    if picked is not None and m > 0:
        return linear_ws(x, weight, bias, config=config, partials=True, **picked)
    chosen = use_split(m, n, k, config) if split is None else (split and config.num_groups(k) > 1)
    if not chosen or m == 0:
        # split=None keeps linear_triton's own choices (a one-group weight's `wide_tile_for`).
        return linear_triton(x, weight, bias, config=config, split=None if split is None else False, block_m=block_m)
    if _ws_applies(x, weight):
        return linear_ws(x, weight, bias, config=config, split=True, block_m=block_m, partials=True)
    partials = torch.empty(config.num_groups(k), m, n, device=x.device, dtype=torch.float32)
    # A split program never touches Y: x stands in (x's dtype, as the output would be).
    _launch_gemm(x, weight, bias, x, partials, config=config, split=True, block_m=block_m)
    return Partials(partials, bias, x.dtype)


def linear_partials(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T as its K-group sums, always: fp32 [G, M, N], G = choose_config's
    group count (1 for weights in one group). linear_triton(x, weight) is bitwise
    (0 + p_0 + p_1 + ... + p_{G-1}).to(x.dtype), adds in fp32 in group order: a consumer that
    sums them itself saves the group-sum launch at every M (kernels/moe.py's routing)."""
    x, weight, _ = _operands(x, weight, None)
    m, k = x.shape
    n = weight.shape[0]
    config = choose_config(n, k)
    partials = torch.empty(config.num_groups(k), m, n, device=x.device, dtype=torch.float32)
    # The split launch's kernel with one group is the fused launch's one-group sum: the same dots
    # from a zero accumulator, stored unrounded. A split program never touches Y: x stands in.
    _launch_gemm(x, weight, None, x, partials, config=config, split=True, block_m=None)
    return partials


def linear_tma(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    *,
    config: LinearConfig | None = None,
    block_m: int | None = None,
    programs_per_sm: int = 1,
    num_stages: int | None = None,
    flatten: bool = False,
) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T (+ bias) -> [M, N] through the persistent TMA-fed kernel
    (matmul_tma.py), bitwise `linear_triton(x, weight, bias, config=config)`: its fused launch's
    arithmetic. block_m: rows per tile (default `block_m_for`'s fused choice); programs_per_sm,
    num_stages, flatten: speed only."""
    assert tma_available(x.device), "linear_tma needs a CUDA device of sm_90+ (or the interpreter) and Triton's TMA"
    assert x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1]
    assert x.dtype == weight.dtype and x.dtype in (torch.bfloat16, torch.float16)
    x = x if x.stride(1) == 1 else x.contiguous()
    weight = weight if weight.stride(1) == 1 else weight.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    if out is None:
        out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    if m == 0 or n == 0:
        return out
    config = config or choose_config(n, k)
    groups = config.num_groups(k)
    block_m = block_m or block_m_for(m, groups, split=False)
    assert block_m in (BLOCK_M, 2 * BLOCK_M), f"block_m {block_m}"
    launch_tma(x, weight, bias, out, block_m=block_m, block_n=config.block_n, block_k=config.block_k,
               group_blocks=config.group_blocks(k), one_group=groups == 1, num_warps=warps_for(block_m, config),
               num_stages=num_stages or stages_for(block_m, config), programs_per_sm=programs_per_sm, flatten=flatten)
    return out


def linear_ws(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    *,
    config: LinearConfig | None = None,
    split: bool | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    stages: int | None = None,
    programs_per_sm: int = 1,
    partials: bool = False,
) -> torch.Tensor | Partials:
    """x [M, K] @ weight[N, K].T (+ bias) -> [M, N] through the warp-specialized kernel
    (matmul_ws.py), bitwise `linear_triton(x, weight, bias, config=config)`: the same K blocks
    and groups. split: over K groups as `use_split` picks by default, the groups then summed by
    `_sum_groups_kernel` (or, with partials=True, handed back as `Partials`). block_m (64 or
    128; default `block_m_for`'s), block_n (default config.block_n; any multiple of 8 up to
    256 gives the same bits on Hopper), stages, programs_per_sm: speed only."""
    assert ws_available(x.device), "linear_ws needs an sm_90 CUDA device and Triton with Gluon"
    x, weight, bias = _operands(x, weight, bias)
    assert ws_fits(x) and ws_fits(weight), "linear_ws: x and weight need 16-byte aligned rows"
    m, k = x.shape
    n = weight.shape[0]
    config = config or choose_config(n, k)
    groups = config.num_groups(k)
    split = use_split(m, n, k, config) if split is None else (split and groups > 1)
    block_m = block_m or block_m_for(m, groups, split)
    assert block_m in (BLOCK_M, WIDE_BLOCK_M), f"block_m {block_m}"
    block_n = block_n or config.block_n
    stages = stages or ws_stages(block_m, block_n, config.block_k, programs_per_sm)
    if out is None and not (split and partials):
        out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    if m == 0 or n == 0:
        return out
    kw = dict(block_m=block_m, block_n=block_n, block_k=config.block_k, group_blocks=config.group_blocks(k),
              groups=groups, stages=stages, programs_per_sm=programs_per_sm)
    if not split:
        launch_ws(x, weight, bias, out, None, **kw)
        return out
    p = torch.empty(groups, m, n, device=x.device, dtype=torch.float32)
    launch_ws(x, weight, None, None, p, **kw)
    if partials:
        return Partials(p, bias, x.dtype)
    _sum_groups(p, bias, out)
    return out


def _operands(x, weight, bias):
    if triton is None:
        raise RuntimeError("triton is not installed")
    assert x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1], (
        f"x {tuple(x.shape)} and weight {tuple(weight.shape)}")
    assert x.dtype == weight.dtype and x.dtype in (torch.bfloat16, torch.float16), "bf16/fp16 x and weight"
    if x.stride(1) != 1:
        x = x.contiguous()
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    if bias is not None:
        assert bias.shape == (weight.shape[0],), f"bias {tuple(bias.shape)} for {weight.shape[0]} outputs"
        bias = bias.contiguous()
    return x, weight, bias


def _launch(x, weight, bias, out, *, config, split, block_m, tma=None, wide=None) -> None:
    """The GEMM of x [M, K] and weight [N, K] into out [M, N]."""
    m, k = x.shape
    n = weight.shape[0]
    if m == 0 or n == 0:
        return
    config = config or choose_config(n, k)
    groups = config.num_groups(k)
    if wide is not None:
        assert groups == 1, f"a wide tile is for weights in one K group ({groups} groups)"
        _launch_wide(x, weight, bias, out, wide)
        return
    defaults = split is None and block_m is None and tma is None
    picked = _ws_picked(x, weight) if defaults else None
    if picked is not None:
        linear_ws(x, weight, bias, out, config=config, **picked)
        return
    split = use_split(m, n, k, config) if split is None else (split and groups > 1)
    if _ws_applies(x, weight):
        linear_ws(x, weight, bias, out, config=config, split=split, block_m=block_m)
        return
    wide = wide_tile_for(m, n, k, config) if defaults else None
    if wide is not None:
        _launch_wide(x, weight, bias, out, wide)
        return
    if tma is None:
        tma = not split and use_tma(m, n, k, config, block_m, x.device)
    if tma and not split:
        linear_tma(x, weight, bias, out, config=config, block_m=block_m, programs_per_sm=2)
        return
    partials = torch.empty(groups, m, n, device=x.device, dtype=torch.float32) if split else out
    _launch_gemm(x, weight, bias, out, partials, config=config, split=split, block_m=block_m)
    if split:
        _sum_groups(partials, bias, out)


def _sum_groups(partials: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """out [M, N] = the K-group partials [groups, M, N] summed in group order (+ bias), one cast."""
    groups, m, n = partials.shape
    b = bias if bias is not None else out  # unused without HAS_BIAS
    _sum_groups_kernel[(m, _cdiv(n, SUM_BLOCK))](
        partials, b, out, m, n, out.stride(0),
        GROUPS=groups, HAS_BIAS=bias is not None, BLOCK=SUM_BLOCK, num_warps=2, enable_fp_fusion=False,
        **launch_args(out.device, m),
    )


def _launch_wide(x, weight, bias, out, tile: WideTile) -> None:
    """A one-group weight's GEMM in a `WideTile` (its docstring: the same bits as any other tile):
    the columns of its whole waves in its own tile, the rest in its tail's (`head_columns`)."""
    n = weight.shape[0]
    cols = head_columns(x.shape[0], n, tile)
    if cols < n:
        _launch_tile(x, weight[:cols], None if bias is None else bias[:cols], out[:, :cols], tile)
        _launch_wide(x, weight[cols:], None if bias is None else bias[cols:], out[:, cols:], tile.tail)
        return
    _launch_tile(x, weight, bias, out, tile)


def _launch_tile(x, weight, bias, out, tile: WideTile) -> None:
    """One launch of a one-group weight's GEMM in `tile` (its tail aside)."""
    m, k = x.shape
    n = weight.shape[0]
    assert tile.block_m in (BLOCK_M, 2 * BLOCK_M, 4 * BLOCK_M) and tile.block_n <= 256, f"wide tile {tile}"
    k_blocks = _cdiv(k, tile.block_k)
    if tile.tma and tma_available(x.device):
        launch_tma(x, weight, bias, out, block_m=tile.block_m, block_n=tile.block_n, block_k=tile.block_k,
                   group_blocks=k_blocks, one_group=True, num_warps=tile.num_warps, num_stages=tile.stages,
                   programs_per_sm=tile.programs_per_sm)
        return
    b = bias if bias is not None else out  # unused without HAS_BIAS
    grid = (_cdiv(m, tile.block_m), _cdiv(n, tile.block_n))
    _linear_kernel[grid](
        x, weight, b, out, out, m, n, k, x.stride(0), weight.stride(0), out.stride(0), k_blocks, k_blocks,
        UPCAST=interpreting(), SPLIT=False, ONE_GROUP=True, HAS_BIAS=bias is not None, EVEN_K=k % tile.block_k == 0,
        BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k,
        num_warps=tile.num_warps, num_stages=tile.stages, enable_fp_fusion=False, **launch_args(x.device, m),
    )


def _launch_gemm(x, weight, bias, out, partials, *, config, split, block_m) -> None:
    """_linear_kernel alone: into out [M, N] (fused launch) or partials [groups, M, N] (split)."""
    m, k = x.shape
    n = weight.shape[0]
    if m == 0 or n == 0:
        return
    assert k > 0, "K = 0"
    groups = config.num_groups(k)
    block_m = block_m or block_m_for(m, groups, split)
    assert block_m in (BLOCK_M, WIDE_BLOCK_M), f"block_m {block_m}"
    b = bias if bias is not None else out  # unused without HAS_BIAS
    grid = (_cdiv(m, block_m), _cdiv(n, config.block_n)) + ((groups,) if split else ())
    _linear_kernel[grid](
        x, weight, b, out, partials, m, n, k, x.stride(0), weight.stride(0), out.stride(0),
        config.group_blocks(k), _cdiv(k, config.block_k),
        UPCAST=interpreting(), SPLIT=split, ONE_GROUP=groups == 1, HAS_BIAS=bias is not None, EVEN_K=k % config.block_k == 0,
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        num_warps=warps_for(block_m, config), num_stages=stages_for(block_m, config), enable_fp_fusion=False,
        **launch_args(x.device, m),
    )


__all__ = [
    "BLOCK_M",
    "WIDE_BLOCK_M",
    "WIDE_PICKS",
    "LinearConfig",
    "Partials",
    "block_m_for",
    "choose_config",
    "groups_for",
    "linear_partials",
    "linear_partials_triton",
    "linear_ref",
    "linear_tma",
    "linear_ws",
    "linear_triton",
    "rule_config",
    "use_tma",
    "use_split",
    "WidePick",
    "WideTile",
    "head_columns",
    "wide_tile_for",
]

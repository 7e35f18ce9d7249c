"""Triton paged tree attention (verify / prefill chunk / AR decode) and a fused KV write.

Semantics are exactly those of `reference.paged_tree_attention_ref`: T new query tokens attend
to the committed prefix (logical 0..prefix_len-1, all visible) and to the new tokens themselves
(logical prefix_len..prefix_len+T-1) under a [T, T] visibility mask.

Batch invariance. Each query row's result is bitwise independent of the other rows
of the call, of T and of prefix_len: a tree node verified at depth d computes exactly what the
AR step that produced the same token at the same position computes. So every row reduces over
its keys in *its own logical order*: the prefix, then the new tokens it sees, in index order
(for a tree: its ancestors by depth, i.e. the positions they will have once accepted). Keys are
cut into BLOCK_N-position tiles (64; 32 for heads wider than 256, `tile_config`) aligned at
absolute logical positions and into splits of
`split_len` positions (a function of the cache size only), and a row's result is defined tile by
tile: each tile's *partial* alone (its row max m, l = sum 2^(s - m), P@V from a zero
accumulator; `_tile_partial`), folded in order within each split (`_fold_weights`), the splits'
states folded in order, then a / l. Which program computes a partial or a fold never changes
its bits, so the work can be cut as suits each call:

  grid = (KV heads, programs, V parts); MODE picks the binary. V parts: 1, or for heads wider
    than 256 WIDE_V_SPLIT programs that share a query tile and each take a part of V's and the
    output's columns (each computes the whole head's scores: the same m and l in every part).
  * GQA packing: a program owns one KV head and BLOCK_M (always 64) rows, a row being a
    (token, query head of the group) pair, row = token * GROUP + g. BLOCK_M, BLOCK_N, the warps
    and the dot instruction never change: a score or a P@V product of one row is the same
    number whatever the other rows of the tile hold.
  * Split programs (min(splits, SPLIT_PROGRAMS_CAP) per query tile, program p taking the tile's
    splits p, p + cap, ... one after another) fold a split's tiles that all their rows share,
    in registers, and store the state: tiles wholly inside the prefix (one tl.dot serves all
    rows), and in CHUNK mode (`VisibleKeys.shared`: prefill chunks, draft blocks) the tiles past
    the prefix too, whose keys the rows share.
  * Tile programs store single tiles' partials: in TREE mode one per token, for the tiles past
    the prefix (each token's own keys, its ancestors; in parallel rather than stepped one token
    after another in one program), in AR mode (T = 1) every tile of the row, spread over
    `ar_tile_programs` programs per KV head (an AR step was one program walking up to 9 tiles).
    A big tree's tile programs (SEPARATE_TAIL_PROGRAMS) run in a launch of their own (TAIL
    mode), a binary without the split programs' registers: the same code, more programs an SM.
  * Flat programs (TREE, small trees with a short prefix: FLAT_TILES, FLAT_MAX_CHAINS) store each
    prefix tile's partial for a query tile's rows, in place of the split programs' chain.
  * The grid holds split programs for the longest row the cache can hold. In a TREE call the
    programs with work run first (the split or flat programs the prefix gives work, then the
    tile programs); those without return at once, last.
  * `_merge_kernel` folds, per row, each split's state then its tiles' partials, split by split.
    A CHUNK row of one split is written by its split program directly. An AR row of more than
    AR_SERIAL_SPLITS splits has its splits' tiles folded side by side, the split states stored,
    then folded in order: the same folds, two short chains instead of one long one. A verify or
    chunk row's leading splits without tile partials, where more than VERIFY_SERIAL_SPLITS, have
    their stored states loaded in blocks (all in flight) and then folded in order.
On sm_90 and newer the tiles wholly inside the prefix (split and flat programs) come through TMA
descriptors of the pools (`tma_loads`, `tma_descriptors`; speed only: the same values).
fp32 scores, softmax and accumulation (exp2 with the scale folded in); output in q's dtype.
fp32 inputs use IEEE fp32 dots (no TF32) so fp32 runs stay lossless; under the interpreter every
input does, upcast (exact products; its bf16 dot multiplies raw bit patterns).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .key_order import visible_keys_triton
from .launch import hopper_or_newer, interpreting, launch_args, wait_for_previous
from .reference import logical_to_slots, paged_tree_attention_ref, visible_keys_ref, write_kv_ref

try:  # triton is optional: CPU-only installs use the torch references.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None
try:  # host tensor descriptors (TMA); absent from older Triton
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - exercised only without them
    TensorDescriptor = None

LOG2E = 1.4426950408889634

# Fixed for every call (batch invariance, see above). 64x64 tiles and 4 warps were best or within
# ~10% of the best in the H200 sweep of an earlier kernel (docs/kernels.md); 8 warps: verify up to 1.6x slower.
BLOCK_M = 64
BLOCK_N = 64
NUM_WARPS = 4
# Pipeline depth (speed only: the same loads and arithmetic). Without a block table the loads of
# tile i + 1 depend on nothing loaded, and 3 stages keep them in flight while tile i is computed
# (H200: verify calls 0-9% faster than 2 stages, 4 stages up to 1.5x slower at 64 tokens); the AR
# binary measured the same with 2 or 3 (docs/performance.md).
NUM_STAGES = 3
AR_NUM_STAGES = 2
# Programs that share a query tile's V and output columns, for heads up to 256 (see WIDE_V_SPLIT).
V_SPLIT = 1
# Heads wider than 256 (Gemma 4's global layers, 512; `tile_config`): each query tile's V and
# output columns are cut in WIDE_V_SPLIT parts, a program each (every part computes the scores
# over the whole head), with 32-key tiles and 2 stages. Offline sm_90 compile at 512, bf16
# (tests/kernels/sm90_tree_attention_compile.py): 224 KB of shared memory (as the 256 AR binary),
# 231-255 registers, no spills; 64-key tiles at 3 stages would need 448 KB and an unsplit
# [64, 512] fp32 accumulator 256 registers a thread at 4 warps.
WIDE_BLOCK_N = 32
WIDE_NUM_WARPS = 4
WIDE_STAGES = 2
WIDE_V_SPLIT = 2
MIN_SPLIT_LEN = 256
MAX_SPLITS = 64
# An AR call's tile programs: about AR_TILE_PROGRAMS_TOTAL over its KV heads, at least
# AR_TILE_PROGRAMS_MIN a head (`ar_tile_programs`; speed only: program p of n takes tiles p,
# p + n, ...). A constant 32 a head gave the 8B (8 KV heads) 256 programs but the 1.5B (2) 64:
# H100, cold µs at 8192 keys, 32 / 64 / 128 a head: 1.5B 21.6 / 18.4 / 17.1, 8B 30.6 / 31.7 / 31.5.
AR_TILE_PROGRAMS_TOTAL = 256
AR_TILE_PROGRAMS_MIN = 32
# Split programs per query tile of a verify or chunk call, at most (speed only): program p takes
# the tile's splits p, p + cap, ... that have work. Without a cap the grid grew with the cache (an
# app cache of 33,792 rows: 59 a query tile, of which one has work at 512 keys); 16 still gives
# each split of an 8,192-key row (15 splits of 576) a program of its own.
SPLIT_PROGRAMS_CAP = 16
# An AR call's merge (speed only, the bits are the same): a row of more than AR_SERIAL_SPLITS
# splits folds its splits' tiles side by side, AR_SPLITS_BLOCK_ELEMS // head_dim splits at once
# (at most AR_SPLITS_BLOCK), on AR_MERGE_WARPS warps, then the split states in order; shorter rows
# fold split after split as a verify row does. Compiled in only where the cache holds more than
# AR_SERIAL_SPLITS splits.
AR_SERIAL_SPLITS = 2
AR_SPLITS_BLOCK = 16
AR_SPLITS_BLOCK_ELEMS = 2048
AR_MERGE_WARPS = 4
# A verify or chunk call's merge (TREE, CHUNK; speed only, the bits are the same): a row of more
# than VERIFY_SERIAL_SPLITS splits without tile partials (a verify row's splits below the tree's
# tiles, every split of a chunk row) loads their states VERIFY_SPLITS_BLOCK_ELEMS // head_dim at
# a time (at most VERIFY_SPLITS_BLOCK; one warp), all in
# flight, then folds them in order; shorter rows load each split's state while folding the last.
# Compiled in only where the cache holds more than VERIFY_SERIAL_SPLITS splits. Blocks of 4 (H200,
# --verify-merge-sweep): within 2% of the serial merge where blocks of 16 lost 4-7% (2,048 keys: 3
# such splits, 16 loads for 3 states), and 0.94-0.95x it at 8,192 keys as blocks of 16.
VERIFY_SERIAL_SPLITS = 2
VERIFY_SPLITS_BLOCK = 4
VERIFY_SPLITS_BLOCK_ELEMS = 512
# The merge's tile partials of a split folded in turn (an AR row's tiles up to AR_SERIAL_SPLITS
# splits, a tree's, flat prefix tiles): loaded a block at a time, at most MERGE_LOADS_A_THREAD
# floats a thread, all in flight, then folded in order (speed only: the same folds of the same
# operands). Loaded and folded one after another, a split of 9 tiles was a chain of 9 load latencies.
MERGE_LOADS_A_THREAD = 64
# An AR call's merge cuts each row's columns over AR_MERGE_PARTS programs (speed only: a column's
# folds are its own, and every part computes the row's m and l from the same loads). An AR call
# has a row a query head (32 at the 8B shape): one program each left most SMs idle.
AR_MERGE_PARTS = 4
# Registers a thread the verify merge may take (None: the compiler's choice, 64 at head 128, which
# keeps about 4 states' loads ahead of the folds; 128 lets it issue about 10 before the first).
VERIFY_MERGE_MAX_REGISTERS = None
# A tree whose prefix has at most this many whole tiles stores each prefix tile's partial from a
# program of its own (the merge folds them) instead of folding them in a chain (speed only).
FLAT_TILES = 16
# ... when its query tiles x KV heads (the chains it would run) are at most this many. H200, cold µs,
# flat against chains at 512 keys: 1.5B T=16/64/128 (4/12/24 chains) 19.6/22.2/23.0 ->
# 11.6/15.7/21.6, T=256 (48) 31.2 -> 35.2; 8B T=16 (8) 20.3 -> 14.4, T=64 (32) 26.4 -> 27.8, T=128 43 -> 48.
# In the engine the 1.5B's verify(64) took 0.953x, its verify(128) 1.020x: hence 16, not 24.
FLAT_MAX_CHAINS = 16
# A TREE call with at least SEPARATE_TAIL_PROGRAMS tile programs (a program a token and KV head,
# for its tiles past the prefix) launches them apart (TAIL mode, TAIL_STAGES pipeline stages),
# before the split and flat programs (speed only: the same code for each tile). In the TREE binary
# they take the split programs' 255 registers and 115 KB a program, two an SM; the TAIL binary
# takes 128 registers and 48 KB (offline sm_90), four an SM. Apart they lose the overlap with the
# split programs' chains. H200, cold µs (`benchmarks/tree_attention.py --tail-sweep`), one launch
# -> apart: 8B T=256 (2048 tile programs) at 512 / 2048 / 8192 keys 68.4 / 96.9 / 216.8 -> 58.8 /
# 83.5 / 206.0; T=128 (1024) 38.0 / 52.5 / 112.1 -> 39.3 / 48.4 / 115.6; the 1.5B's T=256 (512)
# 26.6 -> 34.2 at 512 keys.
SEPARATE_TAIL_PROGRAMS = 2048
TAIL_STAGES = 1
# Whole prefix tiles (the split programs' shared tiles, the flat programs' tiles) come through TMA
# tensor descriptors where `tma_loads` allows (speed only: the same values), and their scores skip
# the visibility select (SEES_ALL). Offline sm_90 (Triton 3.9, head 128), the TREE split programs'
# loop over shared tiles took 881 instructions a warp a tile with pointer loads, 801 without the
# select, 563 with TMA: the pointer loads' 64-bit address arithmetic for 16 cp.async a thread was
# about a third of the loop, the compares and selects another tenth.
TMA_LOADS = True
# The widest head the kernel takes (Gemma 4's global layers).
MAX_HEAD_DIM = 512
# The widest in fp32: the verify binary's fp32 tiles take 180 KB of shared memory at 128, 344 KB
# at 256 (offline sm_90 compile; an SM has 227 KB).
MAX_FP32_HEAD_DIM = 128


class TileConfig(NamedTuple):
    """Key tile width, warps and pipeline depths of the binaries for one head width: fixed per
    head width (batch invariance: every call at that width reduces a row the same way)."""

    block_n: int
    num_warps: int
    stages: int
    ar_stages: int
    v_split: int  # programs that share a query tile's V and output columns


def tile_config(head_dim: int) -> TileConfig:
    """Heads up to 256 wide: 64-key tiles, 4 warps, the whole head in one program (the constants
    above). Wider heads: the WIDE_* constants."""
    if head_dim <= 256:
        return TileConfig(BLOCK_N, NUM_WARPS, NUM_STAGES, AR_NUM_STAGES, V_SPLIT)
    return TileConfig(WIDE_BLOCK_N, WIDE_NUM_WARPS, WIDE_STAGES, WIDE_STAGES, WIDE_V_SPLIT)


class MergeConfig(NamedTuple):
    """How `_merge_kernel` folds a call's long rows (speed only; shapes only)."""

    splits_block: int  # split states loaded at once (0: every row split after split)
    serial_splits: int  # rows of at most this many state-only splits fold split after split
    num_warps: int
    max_registers: int | None = None  # a thread's (None: the compiler's choice)
    parts: int = 1  # programs a row, each a part of its columns
    tiles_block: int = 1  # a split's tile partials loaded at once, folding split after split

    def constexprs(self) -> dict:
        """The merge kernel's compile-time arguments for this launch."""
        return dict(SPLITS_BLOCK=self.splits_block, SERIAL_SPLITS=self.serial_splits, PARTS=self.parts,
                    TILES_BLOCK=self.tiles_block)


def merge_config(ar: bool, num_splits: int, head_dim: int, split_tiles: int) -> MergeConfig:
    """The merge's launch for an AR call (ar) or a verify / chunk call on a cache of num_splits
    splits of split_tiles tiles: the AR_* or VERIFY_* constants above; blocks of states only
    where a row can have more than the serial number of splits; blocks of tile partials of at
    most MERGE_LOADS_A_THREAD floats a thread (`tiles_block`)."""
    parts = max(1, min(AR_MERGE_PARTS, head_dim // 16)) if ar else 1
    cols = head_dim // parts
    if ar:
        cfg = MergeConfig(min(AR_SPLITS_BLOCK, max(1, AR_SPLITS_BLOCK_ELEMS // head_dim)), AR_SERIAL_SPLITS,
                          AR_MERGE_WARPS)
    else:
        cfg = MergeConfig(min(VERIFY_SPLITS_BLOCK, max(1, VERIFY_SPLITS_BLOCK_ELEMS // head_dim)),
                          VERIFY_SERIAL_SPLITS, 1, VERIFY_MERGE_MAX_REGISTERS)
    if num_splits <= cfg.serial_splits:
        cfg = MergeConfig(0, cfg.serial_splits, 1)
    floats = MERGE_LOADS_A_THREAD * 32 * cfg.num_warps  # a block's loads, the program's threads together
    return cfg._replace(parts=parts, tiles_block=max(1, min(split_tiles, floats // cols)))


class VisibleKeys(NamedTuple):
    """Which new tokens each query row sees, in the row's key order.

    order[t, e] is the e-th new token (by index) that row t sees, for e < count[t]; for a tree in
    topological order that is t's ancestor at depth e (itself at depth count[t] - 1), whose key
    an AR run would hold at logical position prefix_len + e. Entries past count are unused.
    shared: the caller's word that at each logical position every row that sees a new token sees
    the same one (causal or full masks: prefill chunks, the draft block). Speed only: such rows
    fold their tiles together in one program; a tree's run a program per token past the prefix.
    """

    order: torch.Tensor  # [T, T] int32
    count: torch.Tensor  # [T] int32
    shared: bool = False


def visible_keys(tree_mask: torch.Tensor, shared: bool = False) -> VisibleKeys:
    """[T, T] bool visibility -> `VisibleKeys` (`visible_keys_ref`): one Triton launch on CUDA
    (kernels/key_order.py), the torch reference elsewhere. Fixed shapes, no host sync, so it can
    live inside a CUDA graph; the mask is the same for every layer: build it once a forward.
    shared: see `VisibleKeys` (True for causal and full masks)."""
    if tree_mask.is_cuda and triton is not None:
        order, count = visible_keys_triton(tree_mask)
    else:
        order, count = visible_keys_ref(tree_mask)
    return VisibleKeys(order, count, shared)


def tma_shape(head_dim: int, ar: bool) -> bool:
    """The shape half of `tma_loads`: TMA_LOADS, heads up to 128 wide (one V part; the 256-wide
    binaries' 224 KB of shared memory leave no room for the copies' barriers), and not an AR call
    (through TMA its tiles took 1.06-1.16x as long: H100, 8B shape)."""
    return TMA_LOADS and head_dim <= 128 and not ar


def tma_loads(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_table: torch.Tensor | None,
              ar: bool) -> bool:
    """Whether a call reads its whole prefix tiles through TMA descriptors: `tma_shape`, Triton with
    host descriptors, a CUDA device of sm_90 or newer (or the interpreter, which runs them too),
    pools in logical order (no block table), contiguous, 16-byte aligned, 2-byte elements."""
    if not tma_shape(q.shape[-1], ar) or TensorDescriptor is None or block_table is not None:
        return False
    if q.dtype not in (torch.bfloat16, torch.float16) or k_pool.dtype != q.dtype:
        return False
    if not (k_pool.is_contiguous() and v_pool.is_contiguous()) or (k_pool.data_ptr() | v_pool.data_ptr()) % 16:
        return False
    return interpreting() or hopper_or_newer(q.device)


def tma_descriptors(k_pool: torch.Tensor, v_pool: torch.Tensor, block_n: int) -> tuple:
    """The pools' TMA descriptors: each pool ([blocks, block_size, KV heads, head_dim], blocks in
    logical order) as a [positions, KV heads x head_dim] matrix, a box a tile of one KV head."""
    head_dim = k_pool.shape[-1]
    return tuple(TensorDescriptor.from_tensor(pool.view(-1, pool.shape[2] * head_dim), [block_n, head_dim])
                 for pool in (k_pool, v_pool))


def split_len_for(capacity: int) -> int:
    """Keys per split for a cache of `capacity` positions: at most MAX_SPLITS splits, each a
    whole number of tiles and at least MIN_SPLIT_LEN. It depends on the cache only, never on a
    call's T or prefix_len, so every row of a given length is split the same way."""
    per = -(-capacity // MAX_SPLITS)
    return max(MIN_SPLIT_LEN, -(-per // BLOCK_N) * BLOCK_N)


def ar_tile_programs(n_kv: int) -> int:
    """Tile programs per KV head of an AR call (shapes only): AR_TILE_PROGRAMS_TOTAL over the
    KV heads, at least AR_TILE_PROGRAMS_MIN."""
    return max(AR_TILE_PROGRAMS_MIN, AR_TILE_PROGRAMS_TOTAL // n_kv)


def split_programs_per_tile(num_splits: int) -> int:
    """Split programs a query tile gets for a cache of `num_splits` splits (shapes only)."""
    return max(1, min(num_splits, SPLIT_PROGRAMS_CAP))


# ----------------------------------------------------------------------------- triton kernels

if triton is not None:
    # The kernel's three binaries (MODE): an AR step, a tree, rows that share their keys.
    AR_MODE = tl.constexpr(0)
    TREE_MODE = tl.constexpr(1)
    CHUNK_MODE = tl.constexpr(2)
    TAIL_MODE = tl.constexpr(3)  # a TREE call's tile programs alone (SEPARATE_TAIL_PROGRAMS)

    @triton.jit
    def _load_kv_tile(
        K, V, BT, pos, valid, kv, d, dv,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        BLOCK_SIZE: tl.constexpr, MASKED: tl.constexpr, PAGED: tl.constexpr,
    ):
        """Gather K^T [D, BLOCK_N] and V [BLOCK_N, DV] at logical positions `pos` of KV head kv
        (columns d of K, dv of V: all of both, or a wide head's part of V).

        MASKED=False (every position valid) keeps the loads unpredicated; masked-off columns
        load as zeros. Either way the values of the valid columns are the same. PAGED=False: the
        pool's blocks are in logical order (no table), so no dependent load of the block number
        stands before each tile's K/V loads.
        """
        if not PAGED:
            blk = pos // BLOCK_SIZE
        elif MASKED:
            blk = tl.load(BT + pos // BLOCK_SIZE, mask=valid, other=0)
        else:
            blk = tl.load(BT + pos // BLOCK_SIZE)
        blk = blk.to(tl.int64)
        off = pos % BLOCK_SIZE
        k_ptr = K + (blk * stride_kb + off * stride_ks + kv * stride_kh)[None, :] + d[:, None]
        v_ptr = V + (blk * stride_vb + off * stride_vs + kv * stride_vh)[:, None] + dv[None, :]
        if MASKED:
            kt = tl.load(k_ptr, mask=valid[None, :], other=0.0)
            v = tl.load(v_ptr, mask=valid[:, None], other=0.0)
        else:
            kt = tl.load(k_ptr)
            v = tl.load(v_ptr)
        return kt, v

    @triton.jit
    def _load_kv_whole_tile(
        K, V, K_DESC, V_DESC, BT, start, pos, kv, d, dv,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        BLOCK_SIZE: tl.constexpr, PAGED: tl.constexpr, TMA: tl.constexpr, HEAD_DIM: tl.constexpr,
    ):
        """K^T and V of a tile wholly inside the prefix (`pos` = start + 0..BLOCK_N-1, all valid).
        TMA: through the pools' tensor descriptors ([positions, KV heads x head_dim] views of a
        pool in logical order; `tma_descriptors`), one bulk copy a tile and no address arithmetic
        in the program; else `_load_kv_tile`. The same values either way."""
        if TMA:
            kt = tl.trans(K_DESC.load([start, kv * HEAD_DIM]))
            v = V_DESC.load([start, kv * HEAD_DIM])
        else:
            kt, v = _load_kv_tile(K, V, BT, pos, pos >= 0, kv, d, dv,
                                  stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                                  BLOCK_SIZE, False, PAGED)
        return kt, v

    @triton.jit
    def _tile_partial(q, kt, v, visible, qk_scale, PRECISION: tl.constexpr, SEES_ALL: tl.constexpr = False):
        """One 64-key tile alone, in the log2 domain: its row maxima m, sums l = sum 2^(s - m) and
        unnormalised P@V from a zero accumulator. The one code path for every tile of every
        program, so a row's partial of a tile is the same numbers whichever program computed it.
        A row that sees nothing of the tile gets the empty partial (-inf, 0, 0).
        SEES_ALL: the caller's word that every row it keeps sees every key of the tile (a whole
        prefix tile without a window): `visible` is not applied, which changes no kept row's bits
        (where(True, s, -inf) is s) and saves a compare and a select a score."""
        s = _dot(q, kt, PRECISION)
        if not SEES_ALL:
            s = tl.where(visible, s, float("-inf"))
        # The max of the scaled scores, scaled once a row: rounding is monotonic and qk_scale > 0.
        m = tl.max(s, 1) * qk_scale
        # One FMA a score (scale, subtract the max, one rounding); -inf scores give 0, and a row
        # that sees nothing subtracts 0 (not -inf: no NaN). The max score's p is 2^(its scaled
        # value's rounding error): 1 within 1e-4 at any real logit.
        p = tl.exp2(tl.fma(s, qk_scale, -tl.where(m == float("-inf"), 0.0, m)[:, None]))
        l = tl.sum(p, 1)
        return m, l, _dot(p.to(v.dtype), v, PRECISION)  # p rounded to the cache's dtype

    @triton.jit
    def _dot(a, b, PRECISION: tl.constexpr):
        """a @ b in fp32. "ieee": fp32 dots on upcast operands (exact products), for fp32 inputs
        and for any input under the interpreter, whose bf16 dot multiplies raw bit patterns."""
        if PRECISION == "ieee":
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a, b, input_precision=PRECISION)

    @triton.jit
    def _fold_weights(m1, m2):
        """The fold of two partials (m1, l1, a1) and (m2, l2, a2), the first the earlier keys':
        m = max(m1, m2), l = `_fold_sums`(l1, c1, l2, c2), a likewise, in the attention programs
        and in the merge alike. Folding onto (-inf, 0, 0) gives the other partial back exactly
        (c = 0 and 1), so a fold may start from either."""
        m = tl.maximum(m1, m2)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        return m, tl.exp2(m1 - m_safe), tl.exp2(m2 - m_safe)

    @triton.jit
    def _fold_sums(x1, c1, x2, c2):
        """x1 * c1 + x2 * c2 as a multiply and an FMA (the kernels run without fp fusion, so this
        is written out): x1 is the earlier keys' sum, in every fold, so that the rounding is the
        same wherever a fold runs."""
        return tl.fma(x2, c2, x1 * c1)

    @triton.jit
    def _fold_tile(m_i, l_i, acc, q, kt, v, visible, qk_scale, PRECISION: tl.constexpr,
                   SEES_ALL: tl.constexpr = False):
        """Fold one tile's partial into a program's running state (rows x head_dim)."""
        m_t, l_t, a_t = _tile_partial(q, kt, v, visible, qk_scale, PRECISION, SEES_ALL)
        m, c1, c2 = _fold_weights(m_i, m_t)
        return m, _fold_sums(l_i, c1, l_t, c2), _fold_sums(acc, c1[:, None], a_t, c2[:, None])

    @triton.jit
    def _row_sees(pos, length, WINDOW: tl.constexpr):
        """[rows, BLOCK_N]: which logical key positions `pos` rows of `length` keys see: those
        below length and, with a sliding WINDOW (gpt-oss; 0: none), only the last WINDOW of them.
        A row's query sits at logical position length - 1 (prefix + depth), as in its AR step."""
        sees = pos[None, :] < length[:, None]
        if WINDOW > 0:
            sees = sees & (pos[None, :] >= length[:, None] - WINDOW)
        return sees

    @triton.jit
    def _sink_weights(m, SINKS, head):
        """Attention sinks (gpt-oss): each head's learned logit is one more denominator term with
        no value, folded into a row's final state as a last partial (sink, 1, 0). Returns the
        weights (c1, c2) of l * c1 + c2 and a * c1."""
        sink = tl.load(SINKS + head).to(tl.float32) * 1.4426950408889634  # log2 domain
        _, c1, c2 = _fold_weights(m, sink)
        return c1, c2

    @triton.jit
    def _tile_slots_start(prefix, MODE: tl.constexpr, FLAT_TILES: tl.constexpr, BLOCK_N: tl.constexpr):
        """The first tile whose partial is stored alone (its slot 0) in an AR or TREE call: AR, tile
        0; TREE, the first past the whole prefix tiles, or tile 0 where the prefix's tiles went to
        flat programs (at most FLAT_TILES of them). The attention and the merge both ask here."""
        prefix_tiles = prefix // BLOCK_N
        if MODE == AR_MODE:
            return prefix_tiles * 0  # a tensor, as in the other mode
        else:
            return tl.where(prefix_tiles <= FLAT_TILES, 0, prefix_tiles)

    @triton.jit
    def _ml_mask(mask, V_SPLIT: tl.constexpr):
        """Where a program stores its rows' m and l: `mask`, and for a wide head only in part 0
        (every part computes the same scores, m and l: the same code on the same Q and K)."""
        if V_SPLIT == 1:
            return mask
        else:
            part = tl.zeros_like(mask.to(tl.int32)) + tl.program_id(2)  # a vector (the interpreter's masks must be)
            return mask & (part == 0)

    @triton.jit
    def _store_partial(TL_M, TL_L, TL_A, at, m, l, a, mask, dv, HEAD_DIM: tl.constexpr, V_SPLIT: tl.constexpr):
        """A tile's partial, or a split's state, (m, l, a: columns dv) of the rows at `at` (slot,
        token, head), where `mask` (m and l: `_ml_mask`)."""
        tl.store(TL_M + at, m, mask=_ml_mask(mask, V_SPLIT))
        tl.store(TL_L + at, l, mask=_ml_mask(mask, V_SPLIT))
        tl.store(TL_A + at[:, None] * HEAD_DIM + dv[None, :], a, mask=mask[:, None])

    @triton.jit
    def _query_rows(COUNT, prefix, query_tile, kv, T, GROUP: tl.constexpr, BLOCK_M: tl.constexpr):
        """A query tile's packed rows (row = token * GROUP + g, query head kv * GROUP + g): which are
        real, their tokens, heads and key counts (padded rows have none, so they never widen a tile
        or a loop)."""
        rows = query_tile * BLOCK_M + tl.arange(0, BLOCK_M)
        row_valid = rows < T * GROUP
        tok = rows // GROUP
        length = tl.where(row_valid, prefix + tl.load(COUNT + tok, mask=row_valid, other=0), 0)
        return row_valid, tok, kv * GROUP + rows % GROUP, length

    @triton.jit
    def _load_stored(M, L, A, at, use, d, HEAD_DIM: tl.constexpr):
        """The state stored at `at` (M, L, A: a split's or a tile's) where `use`, else the empty
        state (-inf, 0, 0)."""
        xm = tl.load(M + at, mask=use, other=float("-inf"))
        xl = tl.load(L + at, mask=use, other=0.0)
        xa = tl.load(A + at * HEAD_DIM + d, mask=d < tl.where(use, HEAD_DIM, 0), other=0.0)
        return xm, xl, xa

    @triton.jit
    def _fold_loaded(m, l, a, xm, xl, xa, use):
        """(m, l, a) with a loaded state (xm, xl, xa) folded in where `use`, unchanged elsewhere:
        the merge's one fold of a stored state."""
        fm, c1, c2 = _fold_weights(m, xm)
        l = tl.where(use, _fold_sums(l, c1, xl, c2), l)
        a = tl.where(use, _fold_sums(a, c1, xa, c2), a)
        m = tl.where(use, fm, m)
        return m, l, a

    @triton.jit
    def _fold_splits_apart(
        CH_A, CH_M, CH_L, TL_A, TL_M, TL_L, t, h, T, N_HEADS, n_tiles, n_splits, d,
        HEAD_DIM: tl.constexpr, COLS: tl.constexpr, SPLIT_TILES: tl.constexpr, SPLITS_BLOCK: tl.constexpr,
    ):
        """The merge's fold of each split's tile partials in order from the empty state, for
        SPLITS_BLOCK splits side by side ([splits, columns d]: the slot-k tiles of all of them
        load and fold at once), each split's state stored at its CH_* place (as a split program
        stores its own). Per element the same operations as the merge's serial loop: the same bits.
        (The slots' loads written ahead of their folds gain nothing here: ptxas interleaves them
        again; docs/kernels.md.)"""
        for first in range(0, n_splits, SPLITS_BLOCK):
            split = first + tl.arange(0, SPLITS_BLOCK)
            sm = tl.full([SPLITS_BLOCK], float("-inf"), dtype=tl.float32)
            sl = tl.zeros([SPLITS_BLOCK], dtype=tl.float32)
            sa = tl.zeros([SPLITS_BLOCK, COLS], dtype=tl.float32)
            for k in tl.static_range(SPLIT_TILES):
                j = split * SPLIT_TILES + k
                use = j < n_tiles
                tile_at = (j * T + t) * N_HEADS + h
                xm = tl.load(TL_M + tile_at, mask=use, other=float("-inf"))
                xl = tl.load(TL_L + tile_at, mask=use, other=0.0)
                xa = tl.load(TL_A + tile_at[:, None] * HEAD_DIM + d[None, :], mask=use[:, None], other=0.0)
                fm, c1, c2 = _fold_weights(sm, xm)
                sl = tl.where(use, _fold_sums(sl, c1, xl, c2), sl)
                sa = tl.where(use[:, None], _fold_sums(sa, c1[:, None], xa, c2[:, None]), sa)
                sm = tl.where(use, fm, sm)
            live = split < n_splits
            at = (split * T + t) * N_HEADS + h  # [NUM_SPLITS, T, N_HEADS]
            tl.store(CH_M + at, sm, mask=live)
            tl.store(CH_L + at, sl, mask=live)
            tl.store(CH_A + at[:, None] * HEAD_DIM + d[None, :], sa, mask=live[:, None])

    @triton.jit
    def _fold_splits_in_turn(
        CH_A, CH_M, CH_L, TL_A, TL_M, TL_L, t, h, T, N_HEADS, n_tiles, n_splits, tail_start, first, m, den, a, d,
        HEAD_DIM: tl.constexpr, SPLIT_TILES: tl.constexpr, TILES_BLOCK: tl.constexpr,
    ):
        """Row t, head h's state (m, den, a: the fold of its splits before `first`; columns d)
        with splits first.. folded in: split by split, the split's state (CH_*, where its tiles are
        below tail_start) then its tile partials (TL_*, from tail_start) folded in order, the
        result folded into the row's. A split's tile partials load TILES_BLOCK at a time, all in
        flight before the block's first fold. See `_merge_kernel`."""
        has_next = first * SPLIT_TILES < tail_start  # split first's state
        next_m, next_l, next_a = _load_stored(CH_M, CH_L, CH_A, (first * T + t) * N_HEADS + h, has_next, d, HEAD_DIM)
        for s in range(first, n_splits):
            lo = s * SPLIT_TILES
            sm, sl, sa = next_m, next_l, next_a
            # The next split's state, in flight while this one folds.
            has_next = (s + 1 < n_splits) & (lo + SPLIT_TILES < tail_start)
            next_m, next_l, next_a = _load_stored(CH_M, CH_L, CH_A, ((s + 1) * T + t) * N_HEADS + h, has_next, d,
                                                  HEAD_DIM)
            if lo + SPLIT_TILES > tail_start:  # the split has tile partials
                end = tl.minimum(n_tiles, lo + SPLIT_TILES)
                for k0 in tl.static_range(0, SPLIT_TILES, TILES_BLOCK):
                    # The block's loads first, in the program's order too (the compiler does not move
                    # a load above a fold: interleaved, they would be a chain of load latencies).
                    block = ()
                    for k in tl.static_range(k0, k0 + TILES_BLOCK):  # past SPLIT_TILES: masked off
                        j = lo + k
                        use = (j >= tail_start) & (j < end)
                        xm, xl, xa = _load_stored(TL_M, TL_L, TL_A, ((j - tail_start) * T + t) * N_HEADS + h, use, d,
                                                  HEAD_DIM)
                        block = block + ((xm, xl, xa, use),)
                    for i in tl.static_range(TILES_BLOCK):
                        xm, xl, xa, use = block[i]
                        sm, sl, sa = _fold_loaded(sm, sl, sa, xm, xl, xa, use)
            fm, c1, c2 = _fold_weights(m, sm)
            den = _fold_sums(den, c1, sl, c2)
            a = _fold_sums(a, c1, sa, c2)
            m = fm
        return m, den, a

    @triton.jit
    def _fold_split_states(
        CH_A, CH_M, CH_L, t, h, T, N_HEADS, n_splits, d, HEAD_DIM: tl.constexpr, COLS: tl.constexpr,
        SPLITS_BLOCK: tl.constexpr,
    ):
        """Row t, head h's state (columns d): its first n_splits split states (CH_*) folded in order
        from the empty state (-inf, 0, 0; none: that state), SPLITS_BLOCK of them loaded at once (a
        static loop: their loads all in flight before the first fold). Per split the operations of
        `_fold_splits_in_turn`'s fold of a split's state."""
        m = float("-inf")
        den = 0.0
        a = tl.zeros([COLS], dtype=tl.float32)
        for first in range(0, n_splits, SPLITS_BLOCK):
            # Every load of the block first, in the program's order too (the compiler does not
            # move a load above the previous fold: interleaved, they would be a chain of load
            # latencies again), unpredicated (a warp has 7 predicates): past the row's last
            # split, the last split's state again, loaded and not folded.
            block = ()
            for i in tl.static_range(SPLITS_BLOCK):
                at = (tl.minimum(first + i, n_splits - 1) * T + t) * N_HEADS + h
                block = block + ((tl.load(CH_M + at), tl.load(CH_L + at), tl.load(CH_A + at * HEAD_DIM + d)),)
            for i in tl.static_range(SPLITS_BLOCK):
                xm, xl, xa = block[i]
                m, den, a = _fold_loaded(m, den, a, xm, xl, xa, first + i < n_splits)
        return m, den, a

    @triton.jit
    def _tile_program(
        extra, Q, K, V, BT, prefix, prefix_tiles_end, ORDER, COUNT, TL_A, TL_M, TL_L, T, N_HEADS, TILE_STRIDE,
        qk_scale, stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        kv, d, dv, cols,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, MODE: tl.constexpr, FLAT_TILES: tl.constexpr, PAGED: tl.constexpr,
        PRECISION: tl.constexpr, WINDOW: tl.constexpr, V_SPLIT: tl.constexpr,
    ):
        """A tile program (MODE AR or TREE): one token's GROUP query heads (rows 0..GROUP-1 of the
        tile) and its tiles from the first past the shared ones (AR: all), every TILE_STRIDE-th
        from its own (`extra`: the program's index among the tile programs); each tile's partial
        is stored alone, for the merge to fold in order."""
        tau = 0 if MODE == AR_MODE else extra
        first = extra if MODE == AR_MODE else prefix_tiles_end // BLOCK_N
        tail_start = _tile_slots_start(prefix, MODE, FLAT_TILES, BLOCK_N)
        rows = tl.arange(0, BLOCK_M)
        row_valid = rows < GROUP
        head = kv * GROUP + rows
        count = tl.load(COUNT + tau)
        length = tl.where(row_valid, prefix + count, 0)
        n_tiles = tl.cdiv(prefix + count, BLOCK_N)
        if first < n_tiles:
            q = tl.load(Q + tau * stride_qt + head[:, None] * stride_qh + d[None, :],
                        mask=row_valid[:, None], other=0.0)
            for j in range(first, n_tiles, TILE_STRIDE):
                pos = j * BLOCK_N + cols
                valid = pos < prefix + count
                if MODE == AR_MODE:
                    key_pos = pos  # one token: its keys sit at their own positions
                else:
                    depth = pos - prefix
                    new = valid & (depth >= 0)
                    idx = tl.load(ORDER + tau * T + depth, mask=new, other=0)
                    key_pos = tl.where(new, prefix + idx, pos)
                kt, v = _load_kv_tile(K, V, BT, key_pos, valid, kv, d, dv,
                                      stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                                      BLOCK_SIZE, True, PAGED)
                visible = _row_sees(pos, length, WINDOW)
                m_t, l_t, a_t = _tile_partial(q, kt, v, visible, qk_scale, PRECISION)
                at = ((j - tail_start) * T + tau) * N_HEADS + head  # [tile slots, T, N_HEADS]
                _store_partial(TL_M, TL_L, TL_A, at, m_t, l_t, a_t, row_valid, dv, HEAD_DIM, V_SPLIT)

    # T and SPLIT_PROGRAMS are never specialised: one binary per MODE (AR: T = 1; TREE; CHUNK) for
    # every T and cache size (SPLIT_PROGRAMS 16 would otherwise get a binary of its own, %16).
    @triton.jit(do_not_specialize=["T", "SPLIT_PROGRAMS"])
    def _tree_attn_kernel(
        Q, K, V, K_DESC, V_DESC, BT, PREFIX, ORDER, COUNT, OUT, CH_A, CH_M, CH_L, TL_A, TL_M, TL_L, SINKS,
        T, N_HEADS, SPLIT_LEN, SPLIT_PROGRAMS, TILE_STRIDE, qk_scale,
        stride_qt, stride_qh,
        stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh,
        stride_ot, stride_oh,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr, FLAT_TILES: tl.constexpr,
        PAGED: tl.constexpr, PRECISION: tl.constexpr, WINDOW: tl.constexpr, HAS_SINKS: tl.constexpr,
        V_SPLIT: tl.constexpr, TMA: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_for_previous(PDL)
        kv = tl.program_id(0)
        pid = tl.program_id(1)
        # prefix_len comes from device memory: never specialised, CUDA-graph safe.
        prefix = tl.load(PREFIX).to(tl.int32)
        prefix_tiles_end = prefix // BLOCK_N * BLOCK_N
        d = tl.arange(0, HEAD_DIM)
        if V_SPLIT == 1:
            dv = d
        else:
            # A wide head: this program's part (program_id(2)) of V and of the output columns.
            dv = tl.program_id(2) * (HEAD_DIM // V_SPLIT) + tl.arange(0, HEAD_DIM // V_SPLIT)
        cols = tl.arange(0, BLOCK_N)
        if MODE == TAIL_MODE:
            # A TREE call's tile programs in a launch of their own (SEPARATE_TAIL_PROGRAMS): a
            # binary without the split programs' two accumulators, so more of them fit an SM.
            _tile_program(
                pid, Q, K, V, BT, prefix, prefix_tiles_end, ORDER, COUNT,
                TL_A, TL_M, TL_L, T, N_HEADS, TILE_STRIDE, qk_scale, stride_qt, stride_qh,
                stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, kv, d, dv, cols,
                GROUP, HEAD_DIM, BLOCK_SIZE, BLOCK_M, BLOCK_N, TREE_MODE, FLAT_TILES, PAGED, PRECISION, WINDOW, V_SPLIT)
        else:
            n_query_tiles = tl.cdiv(T * GROUP, BLOCK_M)
            n_split_programs = 0 if MODE == AR_MODE else SPLIT_PROGRAMS * n_query_tiles
            n_flat_programs = FLAT_TILES * n_query_tiles if MODE == TREE_MODE else 0
            # TREE with a short prefix: its tiles' partials are stored one by one (flat programs, in
            # parallel) rather than folded in a chain by the split programs (`_tile_slots_start`).
            flat = prefix_tiles_end // BLOCK_N <= FLAT_TILES
            # r: the program's place in the order split, flat, tile programs. A TREE call's rows
            # all see the whole prefix, so which split or flat programs have work follows from the
            # prefix alone: those run first (pid < busy), then the tile programs, then the rest,
            # which return at once. In pid order the rest came before the tile programs (at 512
            # keys 15 of the 16 split programs of each query tile). Speed only: each split, flat
            # tile and token runs the same code whichever program takes it.
            r = pid
            if MODE == TREE_MODE:
                n_tile_programs = tl.num_programs(1) - n_split_programs - n_flat_programs  # 0: a TAIL launch
                busy = tl.where(flat, prefix_tiles_end // BLOCK_N,
                                tl.minimum(tl.cdiv(prefix_tiles_end, SPLIT_LEN), SPLIT_PROGRAMS)) * n_query_tiles
                r = tl.where(pid < busy, pid + tl.where(flat, n_split_programs, 0),
                             tl.where(pid < busy + n_tile_programs, pid - busy + n_split_programs + n_flat_programs,
                                      tl.num_programs(1)))

            if r < n_split_programs:
                # A split program: query tile r % n, and of that tile's splits with work those from
                # r // n on, every SPLIT_PROGRAMS-th (split 0's programs first; a short row's
                # programs past its last split return at once). Per split it folds the split's tiles
                # that all its rows share (TREE: those wholly inside the prefix, unless `flat`;
                # CHUNK: all) in order and stores the state, or, for a CHUNK row of one split, the
                # output: the same code per split whichever program runs it, so the same bits.
                query_tile = r % n_query_tiles
                row_valid, tok, head, length = _query_rows(COUNT, prefix, query_tile, kv, T, GROUP, BLOCK_M)
                row_end = tl.max(length, 0)
                if MODE == CHUNK_MODE:
                    work_end = row_end
                else:
                    work_end = tl.where(flat, 0, tl.minimum(row_end, prefix_tiles_end))
                first_split = r // n_query_tiles
                n_work_splits = tl.cdiv(work_end, SPLIT_LEN)  # each has lo < end below
                if first_split < n_work_splits:
                    q = tl.load(Q + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                                mask=row_valid[:, None], other=0.0)
                    for split in range(first_split, n_work_splits, SPLIT_PROGRAMS):
                        lo = split * SPLIT_LEN
                        hi = tl.minimum(lo + SPLIT_LEN, row_end)
                        shared_end = tl.minimum(hi, prefix_tiles_end)
                        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
                        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
                        acc = tl.zeros([BLOCK_M, HEAD_DIM // V_SPLIT], dtype=tl.float32)
                        # Tiles wholly inside the prefix: the same keys for every row (all visible).
                        for start in range(lo, shared_end, BLOCK_N):
                            pos = start + cols
                            kt, v = _load_kv_whole_tile(K, V, K_DESC, V_DESC, BT, start, pos, kv, d, dv,
                                                        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs,
                                                        stride_vh, BLOCK_SIZE, PAGED, TMA, HEAD_DIM)
                            visible = _row_sees(pos, length, WINDOW)
                            m_i, l_i, acc = _fold_tile(m_i, l_i, acc, q, kt, v, visible, qk_scale, PRECISION,
                                                       WINDOW == 0)
                        if MODE == CHUNK_MODE:
                            # Tiles reaching past the prefix: each row's own keys. Logical position p >= prefix
                            # is the row's (p - prefix)-th visible new token, stored at prefix + that index.
                            for start in range(tl.maximum(lo, shared_end), hi, BLOCK_N):
                                pos = start + cols
                                sees = _row_sees(pos, length, WINDOW) & row_valid[:, None]  # [BLOCK_M, BLOCK_N]
                                depth = pos - prefix
                                new = sees & (depth >= 0)[None, :]
                                idx = tl.load(ORDER + tok[:, None] * T + depth[None, :], mask=new, other=0)
                                key_pos = tl.where(new, prefix + idx, pos[None, :])  # where row r's key sits
                                top = tl.max(tl.where(sees, key_pos, -1), 0)
                                bottom = tl.min(tl.where(sees, key_pos, 2147483647), 0)
                                if tl.min(((top == bottom) | (top < 0)).to(tl.int32), 0) == 1:
                                    # Every row that sees a column sees the same key there (causal, full).
                                    kt, v = _load_kv_tile(K, V, BT, top, top >= 0, kv, d, dv,
                                                          stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                                                          BLOCK_SIZE, True, PAGED)
                                    m_i, l_i, acc = _fold_tile(m_i, l_i, acc, q, kt, v, sees, qk_scale, PRECISION)
                                else:
                                    # Rows disagree (not what a CHUNK caller promised): a step per token;
                                    # the other rows fold the empty partial, which keeps them exactly.
                                    for tau in range(query_tile * BLOCK_M // GROUP,
                                                     tl.minimum((query_tile * BLOCK_M + BLOCK_M - 1) // GROUP, T - 1) + 1):
                                        mine = (tok == tau)[:, None] & sees
                                        keys = tl.max(tl.where(mine, key_pos, -1), 0)
                                        if tl.max(keys, 0) >= 0:
                                            kt, v = _load_kv_tile(K, V, BT, keys, keys >= 0, kv, d, dv,
                                                                  stride_kb, stride_ks, stride_kh, stride_vb, stride_vs,
                                                                  stride_vh, BLOCK_SIZE, True, PAGED)
                                            m_i, l_i, acc = _fold_tile(m_i, l_i, acc, q, kt, v, mine, qk_scale,
                                                                       PRECISION)
                        mine_here = row_valid & (lo < length)
                        direct = mine_here & (tl.cdiv(length, SPLIT_LEN) == 1) & (MODE == CHUNK_MODE)
                        l_out, a_out = l_i, acc  # a direct row's final state (the stored state stays without the sink)
                        if HAS_SINKS:
                            c1, c2 = _sink_weights(m_i, SINKS, head)
                            l_out = l_i * c1 + c2
                            a_out = acc * c1[:, None]
                        out = a_out / tl.where(l_out > 0.0, l_out, 1.0)[:, None]
                        o_ptr = OUT + tok[:, None] * stride_ot + head[:, None] * stride_oh + dv[None, :]
                        tl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=direct[:, None])
                        state = mine_here & ~direct
                        at = (split * T + tok) * N_HEADS + head  # [NUM_SPLITS, T, N_HEADS]
                        _store_partial(CH_M, CH_L, CH_A, at, m_i, l_i, acc, state, dv, HEAD_DIM, V_SPLIT)
            elif r < n_split_programs + n_flat_programs:
                # A flat program (TREE, `flat`): prefix tile j of query tile r % n, its partial
                # stored for the merge (tile slot j: with `flat` the slots start at tile 0).
                j = (r - n_split_programs) // n_query_tiles
                if flat & (j < prefix_tiles_end // BLOCK_N):
                    row_valid, tok, head, length = _query_rows(COUNT, prefix, r % n_query_tiles, kv, T, GROUP,
                                                               BLOCK_M)
                    q = tl.load(Q + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                                mask=row_valid[:, None], other=0.0)
                    pos = j * BLOCK_N + cols
                    kt, v = _load_kv_whole_tile(K, V, K_DESC, V_DESC, BT, j * BLOCK_N, pos, kv, d, dv,
                                                stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                                                BLOCK_SIZE, PAGED, TMA, HEAD_DIM)
                    visible = _row_sees(pos, length, WINDOW)
                    m_t, l_t, a_t = _tile_partial(q, kt, v, visible, qk_scale, PRECISION, WINDOW == 0)
                    _store_partial(TL_M, TL_L, TL_A, (j * T + tok) * N_HEADS + head, m_t, l_t, a_t, row_valid, dv,
                                   HEAD_DIM, V_SPLIT)
            elif r < tl.num_programs(1):
                _tile_program(
                    r - n_split_programs - n_flat_programs, Q, K, V, BT, prefix, prefix_tiles_end, ORDER, COUNT,
                    TL_A, TL_M, TL_L, T, N_HEADS, TILE_STRIDE, qk_scale, stride_qt, stride_qh,
                    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, kv, d, dv, cols,
                    GROUP, HEAD_DIM, BLOCK_SIZE, BLOCK_M, BLOCK_N, MODE, FLAT_TILES, PAGED, PRECISION, WINDOW, V_SPLIT)

    @triton.jit(do_not_specialize=["T"])
    def _merge_kernel(
        OUT, CH_A, CH_M, CH_L, TL_A, TL_M, TL_L, PREFIX, COUNT, SINKS, T, N_HEADS, stride_ot, stride_oh,
        HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_TILES: tl.constexpr, MODE: tl.constexpr,
        FLAT_TILES: tl.constexpr, HAS_SINKS: tl.constexpr, SPLITS_BLOCK: tl.constexpr,
        SERIAL_SPLITS: tl.constexpr, PARTS: tl.constexpr, TILES_BLOCK: tl.constexpr, PDL: tl.constexpr,
    ):
        """out[t, h] = the fold, split by split in order, of each split's fold of its tiles in
        order: a split's state from its split program (the tiles it folded) then its tiles'
        own partials. A CHUNK row of one split was written directly.

        A split with no tile partials (a verify row's splits inside the prefix) is its state
        alone: it skips the static loop over the split's tile slots, whose folds would all be
        masked off (each fold onto no partial keeps the state as it is), and the next split's
        state is loaded while this one is folded, so a long row is a chain of folds, not of
        loads and masked folds. Same operands, same arithmetic: the bits are those of folding
        every slot.

        SPLITS_BLOCK > 0 (a cache of more than SERIAL_SPLITS splits): a row whose leading
        splits without tile partials number more than SERIAL_SPLITS folds their states from
        blocks of SPLITS_BLOCK loads in flight at once (`_fold_split_states`), then the rest in
        turn. Those splits: TREE, the splits below the first tile slot; CHUNK, every split; AR,
        every split, once `_fold_splits_apart` has folded each split's tiles side by side and
        stored the split states in CH_*. The same folds of the same operands in the same order,
        so the same bits, in short chains instead of one long one.

        Grid (T, heads, PARTS): program (t, h, p) folds columns p * HEAD_DIM / PARTS.. of the row
        (each column's folds are its own; every part loads the same m and l)."""
        wait_for_previous(PDL)
        t = tl.program_id(0)
        h = tl.program_id(1)
        prefix = tl.load(PREFIX).to(tl.int32)
        length = prefix + tl.load(COUNT + t)
        n_tiles = tl.cdiv(length, BLOCK_N)
        n_splits = tl.cdiv(n_tiles, SPLIT_TILES)
        if MODE == CHUNK_MODE:
            tail_start = n_tiles  # every tile in the split programs' states
        else:
            tail_start = _tile_slots_start(prefix, MODE, FLAT_TILES, BLOCK_N)
        if (MODE != CHUNK_MODE) | (n_splits > 1):
            d = tl.program_id(2) * (HEAD_DIM // PARTS) + tl.arange(0, HEAD_DIM // PARTS)
            m = float("-inf")
            den = 0.0
            a = tl.zeros([HEAD_DIM // PARTS], dtype=tl.float32)
            first = n_splits * 0  # splits folded from their stored states in blocks (a tensor, as below)
            if SPLITS_BLOCK > 0:
                if MODE == TREE_MODE:
                    state_splits = tl.minimum(n_splits, tail_start // SPLIT_TILES)
                else:
                    state_splits = n_splits
                if state_splits > SERIAL_SPLITS:
                    if MODE == AR_MODE:
                        _fold_splits_apart(CH_A, CH_M, CH_L, TL_A, TL_M, TL_L, t, h, T, N_HEADS, n_tiles, n_splits,
                                           d, HEAD_DIM, HEAD_DIM // PARTS, SPLIT_TILES, SPLITS_BLOCK)
                        tl.debug_barrier()  # the states, stored by all the program's threads, read back next
                    first = state_splits
                m, den, a = _fold_split_states(CH_A, CH_M, CH_L, t, h, T, N_HEADS, first, d, HEAD_DIM,
                                               HEAD_DIM // PARTS, SPLITS_BLOCK)
            # AR: tail_start 0, so a row folded above has nothing left here.
            m, den, a = _fold_splits_in_turn(CH_A, CH_M, CH_L, TL_A, TL_M, TL_L, t, h, T, N_HEADS, n_tiles,
                                             n_splits, tail_start, first, m, den, a, d, HEAD_DIM, SPLIT_TILES,
                                             TILES_BLOCK)
            if HAS_SINKS:
                c1, c2 = _sink_weights(m, SINKS, h)
                den = den * c1 + c2
                a = a * c1
            out = a / tl.where(den > 0.0, den, 1.0)
            tl.store(OUT + t * stride_ot + h * stride_oh + d, out.to(OUT.dtype.element_ty))

    @triton.jit
    def _write_kv_kernel(
        K_POOL, V_POOL, SLOTS, K, V, N_KV,
        stride_ps, stride_ph, stride_kt, stride_kh, stride_vt, stride_vh,
        HEAD_DIM: tl.constexpr, KV_PAD: tl.constexpr, PDL: tl.constexpr,
    ):
        """Row t of k/v -> physical slot SLOTS[t] of both pools, in one launch."""
        wait_for_previous(PDL)
        t = tl.program_id(0)
        slot = tl.load(SLOTS + t).to(tl.int64)
        h = tl.arange(0, KV_PAD)
        d = tl.arange(0, HEAD_DIM)
        mask = (h < N_KV)[:, None]
        k = tl.load(K + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
        v = tl.load(V + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
        dst = slot * stride_ps + h[:, None] * stride_ph + d[None, :]
        tl.store(K_POOL + dst, k.to(K_POOL.dtype.element_ty), mask=mask)
        tl.store(V_POOL + dst, v.to(V_POOL.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------- wrappers


def prefix_tensor(prefix_len: int | torch.Tensor, device: torch.device) -> torch.Tensor:
    """The committed length as the kernel reads it: a 1-element int32 tensor on `device` (a view,
    no copy, when it already is one). A forward converts once and hands the result to every
    layer: converting an int64 device length per call was a cast kernel a layer."""
    if isinstance(prefix_len, torch.Tensor):
        return prefix_len.reshape(1).to(device=device, dtype=torch.int32)
    # Passing a python int straight to the kernel would specialise on it (==1, %16) and
    # recompile; a 1-element tensor never does.
    return torch.tensor([prefix_len], dtype=torch.int32, device=device)


def paged_tree_attention_triton(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor | None,
    prefix_len: int | torch.Tensor,
    tree_mask: torch.Tensor | VisibleKeys,
    scale: float,
    split_len: int | None = None,
    out: torch.Tensor | None = None,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton version of `paged_tree_attention_ref` (same arguments and result), batch-invariant.

    block_table: logical -> physical block ([blocks] int32), or None: the pool's blocks are in
               logical order (the engine's caches), and no tile waits on a load of its block number.
    prefix_len: python int, or a 0-d / 1-element int32 tensor on q's device. Under CUDA-graph
               capture pass the tensor (an int means a host->device copy each call).
    tree_mask: [T, T] bool, or its `visible_keys` (build once, pass to every layer).
    split_len: keys per split (a multiple of 64); None derives it from the cache's size
               (`split_len_for`). Calls whose results must agree need the same split_len.
    out: optional [T, n_heads, head_dim] destination (e.g. a CUDA-graph static buffer).
    window, sinks: as the reference's; compile-time options (WINDOW, HAS_SINKS), so models without
               them run the same binary as before. A row's tiles outside its window fold as empty
               partials, which keep a state exactly: the bits stay those of its AR step.
    """
    if triton is None:
        raise RuntimeError("triton is not installed")
    t, n_heads, head_dim = q.shape
    _, block_size, n_kv, kd = k_pool.shape
    assert kd == head_dim and v_pool.shape == k_pool.shape, "k/v pool shape mismatch"
    assert n_heads % n_kv == 0, "n_heads must be a multiple of n_kv_heads"
    assert head_dim >= 16 and head_dim & (head_dim - 1) == 0, "head_dim must be a power of two >= 16"
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"the GPU tree attention takes heads up to {MAX_HEAD_DIM} wide, not {head_dim}")
    # (the CPU interpreter has no shared-memory limit: the tests run fp32 at every width there)
    if q.dtype == torch.float32 and head_dim > MAX_FP32_HEAD_DIM and not interpreting():
        raise ValueError(f"the GPU tree attention takes fp32 heads up to {MAX_FP32_HEAD_DIM} wide, not {head_dim}")
    cfg = tile_config(head_dim)
    block_n = cfg.block_n
    assert k_pool.stride(-1) == 1 and v_pool.stride(-1) == 1, "pools need a contiguous head_dim"
    group = n_heads // n_kv
    assert group <= BLOCK_M, f"GQA groups above {BLOCK_M} heads are not supported"
    if q.stride(-1) != 1:
        q = q.contiguous()
    keys = tree_mask if isinstance(tree_mask, VisibleKeys) else visible_keys(tree_mask)
    assert keys.order.shape == (t, t) and keys.count.shape == (t,), "tree_mask must be [T, T]"
    prefix = prefix_tensor(prefix_len, q.device)
    if block_table is not None:
        block_table = block_table.contiguous()
    capacity = (k_pool.shape[0] if block_table is None else block_table.numel()) * block_size
    if split_len is None:
        split_len = split_len_for(capacity)
    assert split_len % BLOCK_N == 0, "split_len must be a multiple of 64"

    if out is None:
        out = torch.empty_like(q)
    assert out.shape == q.shape and out.stride(-1) == 1, "out must be [T, n_heads, head_dim]"
    if t == 0:
        return out
    # The partials cover the longest row the cache can hold, the grid at most SPLIT_PROGRAMS_CAP
    # split programs a query tile (shapes only: graph-safe); programs past a row's splits return at once.
    num_splits = -(-capacity // split_len)
    if t == 1:  # every tile of the row in parallel programs
        mode, tile_slots, tile_programs = AR_MODE, -(-capacity // block_n), ar_tile_programs(n_kv)
    elif keys.shared:  # rows share their keys: split programs fold every tile
        mode, tile_slots, tile_programs = CHUNK_MODE, 0, 0
    else:  # a tree: a program per token for the tiles past the prefix
        mode, tile_slots, tile_programs = TREE_MODE, (t + block_n - 2) // block_n + 1, t
    query_tiles = triton.cdiv(t * group, BLOCK_M)
    per_tile = split_programs_per_tile(num_splits)
    split_programs = 0 if mode == AR_MODE else per_tile * query_tiles
    # Flat prefix programs where the chains would be few (0: none; the merge then finds no flat slots).
    flat_tiles = FLAT_TILES if mode == TREE_MODE and query_tiles * n_kv <= FLAT_MAX_CHAINS else 0
    flat_programs = flat_tiles * query_tiles
    tile_slots += flat_tiles  # the prefix tiles' slots, before the tail's
    merge = merge_config(mode == AR_MODE, num_splits, head_dim, split_len // block_n)
    states = num_splits if mode != AR_MODE or merge.splits_block else 0

    def f32(*shape):  # at least one element: a kernel argument must be a real pointer
        return torch.empty(*shape, device=q.device, dtype=torch.float32) if shape[0] else q.new_empty(1, dtype=torch.float32)

    if sinks is not None:
        assert sinks.shape == (n_heads,), "sinks must be [n_heads]"
        sinks = sinks.contiguous()
    sink_arg = sinks if sinks is not None else prefix  # an unread stand-in without sinks
    ch_a, ch_m, ch_l = f32(states, t, n_heads, head_dim), f32(states, t, n_heads), f32(states, t, n_heads)
    tl_a, tl_m, tl_l = f32(tile_slots, t, n_heads, head_dim), f32(tile_slots, t, n_heads), f32(tile_slots, t, n_heads)
    tma = tma_loads(q, k_pool, v_pool, block_table, ar=mode == AR_MODE)
    k_desc, v_desc = tma_descriptors(k_pool, v_pool, block_n) if tma else (k_pool, v_pool)  # unread stand-ins

    def attend(programs: int, kernel_mode: int, stages: int) -> None:
        _tree_attn_kernel[(n_kv, programs, cfg.v_split)](
            q, k_pool, v_pool, k_desc, v_desc, prefix if block_table is None else block_table,  # an unread stand-in
            prefix, keys.order, keys.count, out, ch_a, ch_m, ch_l, tl_a, tl_m, tl_l, sink_arg,
            t, n_heads, split_len, per_tile, tile_programs if mode == AR_MODE else 1, scale * LOG2E,
            q.stride(0), q.stride(1),
            k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
            v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
            out.stride(0), out.stride(1),
            GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
            BLOCK_M=BLOCK_M, BLOCK_N=block_n, MODE=kernel_mode, FLAT_TILES=flat_tiles, PAGED=block_table is not None,
            # tf32 is ignored for bf16/fp16. Under the interpreter every dot is fp32 on upcast
            # operands (exact products): its bf16 dot multiplies the raw bit patterns.
            PRECISION="ieee" if q.dtype == torch.float32 or interpreting() else "tf32",
            WINDOW=int(window), HAS_SINKS=sinks is not None, V_SPLIT=cfg.v_split, TMA=tma,
            num_warps=cfg.num_warps, num_stages=stages, enable_fp_fusion=False,
            **launch_args(q.device, t),
        )

    if mode == TREE_MODE and tile_programs * n_kv >= SEPARATE_TAIL_PROGRAMS:
        attend(tile_programs, TAIL_MODE, TAIL_STAGES)
        attend(split_programs + flat_programs, TREE_MODE, cfg.stages)
    else:
        attend(split_programs + flat_programs + tile_programs, mode, cfg.ar_stages if t == 1 else cfg.stages)
    if mode != CHUNK_MODE or num_splits > 1:
        _merge_kernel[(t, n_heads, merge.parts)](
            out, ch_a, ch_m, ch_l, tl_a, tl_m, tl_l, prefix, keys.count, sink_arg, t, n_heads, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, BLOCK_N=block_n, SPLIT_TILES=split_len // block_n, MODE=mode, FLAT_TILES=flat_tiles,
            HAS_SINKS=sinks is not None, **merge.constexprs(),
            num_warps=merge.num_warps, enable_fp_fusion=False, **launch_args(q.device, t),
            **({} if merge.max_registers is None else {"maxnreg": merge.max_registers}),
        )
    return out


def paged_tree_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor | None,
    prefix_len: int | torch.Tensor,
    tree_mask: torch.Tensor,
    scale: float,
    keys: VisibleKeys | None = None,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Paged tree attention: Triton on CUDA tensors, the torch reference elsewhere.

    Same contract as `paged_tree_attention_ref`; `keys` (`visible_keys(tree_mask)`, built once
    a forward) spares each layer rebuilding it on the GPU. window / sinks: gpt-oss's sliding
    window and attention sinks (the reference's arguments).
    """
    if q.is_cuda and triton is not None:
        return paged_tree_attention_triton(q, k_pool, v_pool, block_table, prefix_len,
                                           keys if keys is not None else tree_mask, scale, window=window, sinks=sinks)
    return paged_tree_attention_ref(q, k_pool, v_pool, block_table, prefix_len, tree_mask, scale, window, sinks)


def write_kv_triton(
    k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Fused `write_kv_ref`: K and V rows ([T, n_kv, head_dim]) to their slots in one launch."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    t, n_kv, head_dim = k.shape
    if t == 0:
        return
    assert head_dim & (head_dim - 1) == 0, "head_dim must be a power of two"
    assert k_pool.stride(0) == k_pool.shape[1] * k_pool.stride(1), "pool blocks must be contiguous"
    assert v_pool.stride() == k_pool.stride() and k_pool.stride(-1) == 1
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    slots = slots.contiguous()
    _write_kv_kernel[(t,)](
        k_pool, v_pool, slots, k, v, n_kv,
        k_pool.stride(1), k_pool.stride(2), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        HEAD_DIM=head_dim, KV_PAD=triton.next_power_of_2(n_kv), num_warps=1, **launch_args(k.device, t),
    )


def write_kv(
    k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Store new K/V rows at physical slots: Triton on CUDA tensors, the torch reference elsewhere."""
    if k.is_cuda and triton is not None:
        write_kv_triton(k_pool, v_pool, slots, k, v)
    else:
        write_kv_ref(k_pool, v_pool, slots, k, v)


__all__ = [
    "VisibleKeys",
    "logical_to_slots",
    "paged_tree_attention",
    "prefix_tensor",
    "paged_tree_attention_triton",
    "split_len_for",
    "visible_keys",
    "write_kv",
    "write_kv_triton",
]

"""The batch-invariant linear (kernels/matmul.py): correctness against fp32 arithmetic, bias,
strided weight views, the launches (split over K groups + group-sum pass, or fused; 64- or
128-row programs), ragged M / N / K, and bitwise M-invariance; the dispatch in engine.layers.

On the CPU the kernel runs under TRITON_INTERPRET=1 (conftest.py) with small shapes and small
tile configs. There tl.dot is numpy's fp32 matmul on fp32-upcast operands (exact products) of
one fixed tile shape, [64 or 128, BLOCK_K] x [BLOCK_K, BLOCK_N]; numpy's matmul gives each row
the same bits wherever it sits in the tile and whichever of the two tile heights runs it, so the
invariance tests hold bitwise there too (they also catch a wrong group order or a launch that
re-associates).
The interpreter truncates fp32 -> bf16 casts, so the bf16 accuracy tests patch the cast to round
to nearest even (`rtne_bf16`). The real shapes, wgmma, and CUDA graphs run only on a GPU.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")

from test_fused_kernels import rtne_bf16  # noqa: E402,F401  (the interpreter's bf16 casts round to nearest)
from sm90 import run_compile_script  # noqa: E402

from jetspec_chat.engine.layers import FusedLinear, linear  # noqa: E402
from jetspec_chat.kernels import linear_ref, linear_triton  # noqa: E402
from jetspec_chat.kernels import matmul  # noqa: E402
from jetspec_chat.kernels.matmul import (  # noqa: E402
    BLOCK_M,
    TUNED,
    WIDE_BLOCK_M,
    WIDE_PICKS,
    WS_PICKS,
    LinearConfig,
    WideTile,
    block_m_for,
    choose_config,
    head_columns,
    linear_partials,
    rule_config,
    stages_for,
    use_split,
    wide_tile_for,
)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
gpu_only = pytest.mark.skipif(not CUDA, reason="needs a GPU")

# Small tiles for the interpreter: 3 K groups of 2 blocks over K=192 (split and fused differ),
# N tiles of 32 (N=80: a ragged last tile).
SMALL = LinearConfig(block_n=32, block_k=32, groups=3)

QWEN25_1_5B = {  # name: (N, K, bias)
    "qkv": (2048, 1536, True),
    "o_proj": (1536, 1536, False),
    "gate_up": (17920, 1536, False),
    "down": (1536, 8960, False),
    "lm_head": (151936, 1536, False),
}
QWEN3_8B = {
    "qkv": (6144, 4096, False),
    "o_proj": (4096, 4096, False),
    "gate_up": (24576, 4096, False),
    "down": (4096, 12288, False),
    "lm_head": (151936, 4096, False),
}
REAL_SHAPES = ({f"1.5B-{k}": v for k, v in QWEN25_1_5B.items()} | {f"8B-{k}": v for k, v in QWEN3_8B.items()}
               | {"0.5B-lm_head": (151936, 896, False)})  # the TUNED shapes among them
# Row counts on both sides of the 64 -> 128-row switch (block_m_for), for the GPU invariance tests
GPU_MS = (1, 7, 64, 65, 128, 200, 256)
LAUNCHES = [(split, bm) for split in (False, True) for bm in (BLOCK_M, WIDE_BLOCK_M)]
# Wide tiles of one-group weights for the GPU invariance tests (the candidates of
# `benchmarks/kernels_vs_vendor.py --wide` that differ most from the 64-row launch), grid and TMA,
# and two with tails (at 200 and 256 rows every one-group real shape leaves a part-filled wave).
GPU_WIDE_TILES = [WideTile(128, 256, 64, 3), WideTile(256, 128, 64, 3), WideTile(128, 256, 128, 2),
                  WideTile(128, 256, 64, 3, tma=True), WideTile(256, 128, 64, 3, tma=True),
                  WideTile(128, 128, 64, 3, tma=True, programs_per_sm=2),
                  WideTile(64, 256, 64, 4), WideTile(64, 64, 128, 3, tma=True, programs_per_sm=2),
                  WideTile(128, 256, 64, 4, tma=True, tail=WideTile(64, 64, 64, 4)),
                  WideTile(128, 128, 64, 4, tma=True, tail=WideTile(128, 64, 64, 3))]


def randn(*shape, seed, dtype=torch.bfloat16, scale=1.0, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)


def problem(m, n, k, bias, seed, dtype=torch.bfloat16):
    x = randn(m, k, seed=seed, dtype=dtype)
    w = randn(n, k, seed=seed + 1, dtype=dtype, scale=k ** -0.5)
    b = randn(n, seed=seed + 2, dtype=dtype) if bias else None
    return x, w, b


def assert_rows_invariant(x, w, b, config=None, ms=(1, 7, 64, 65, 70), op=linear_triton, alone=(5, 63, 64, -1)):
    """Every prefix x[:M] (and single rows from inside the tiles) gives the full result's rows.
    alone: the rows checked against their own M=1 call ("all": every row)."""
    full = op(x, w, b, config=config)
    for m in ms:
        got = op(x[:m], w, b, config=config)
        assert torch.equal(got, full[:m]), f"M={m}: rows differ from the M={x.shape[0]} result"
    for i in range(x.shape[0]) if alone == "all" else [i % x.shape[0] for i in alone]:
        assert torch.equal(op(x[i : i + 1], w, b, config=config)[0], full[i]), f"row {i} alone"
    return full


# ----------------------------------------------------------------------------- CPU (interpreter) and GPU


@pytest.mark.parametrize("m", [1, 5, 70])
@pytest.mark.parametrize("split", [False, True])
def test_matches_fp32_arithmetic_fp16(m, split):
    """fp16 (11-bit mantissa): within a couple of output ulps of fp32 arithmetic, on a ragged N
    (80 = 2.5 tiles) and a ragged K (200: a masked last block)."""
    x, w, b = problem(m, 80, 200, True, seed=m, dtype=torch.float16)
    got = linear_triton(x, w, b, config=SMALL, split=split)
    ref = x.float() @ w.float().T + b.float()
    torch.testing.assert_close(got.float(), ref, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("bias", [False, True])
def test_matches_fp32_arithmetic_bf16(bias, rtne_bf16):
    """bf16: at most one output ulp from linear_ref (fp32 sums in another order, one rounding)."""
    x, w, b = problem(9, 80, 192, bias, seed=3)
    got = linear_triton(x, w, b, config=SMALL)
    ref = linear_ref(x, w, b)
    torch.testing.assert_close(got.float(), ref.float(), rtol=2 ** -7, atol=1e-3)
    assert (got == ref).float().mean() > 0.9  # mostly the same bits: same products, fp32 sums


def test_split_and_fused_launches_agree_bitwise():
    """The launch (by M) never changes a bit: both run the same dots and fp32 adds in order."""
    x, w, b = problem(70, 80, 192, True, seed=4)
    assert SMALL.num_groups(192) == 3
    assert torch.equal(linear_triton(x, w, b, config=SMALL, split=True), linear_triton(x, w, b, config=SMALL, split=False))


@pytest.mark.parametrize("m", [1, 70])  # 64- and 128-row programs
def test_partials_add_up_to_the_linear_bitwise(m, request):
    """linear_partials' K-group sums, added in group order from zero in fp32 and rounded, are
    linear_triton's bits (the MoE routing adds them itself and skips the group-sum launch).
    Natively on a GPU; on the CPU with the interpreter's bf16 casts rounding to nearest."""
    if not CUDA:
        request.getfixturevalue("rtne_bf16")
    x, w, _ = problem(m, 80, 512, False, seed=m)
    partials = linear_partials(x, w)
    assert partials.shape == (choose_config(80, 512).num_groups(512), m, 80) and partials.shape[0] == 4
    total = torch.zeros(m, 80, device=x.device)
    for p in partials:
        total += p
    assert torch.equal(total.to(x.dtype), linear_triton(x, w))


def test_groups_change_the_sum_order():
    """The group count is part of the numerics (why it depends on N and K only). x.w sums
    2^24, four 0.75s (one per 32-wide K block) and -2^24: exactly 3. One group adds each 0.75 to
    2^24 (fp32 spacing 2 there: lost) -> 0; three groups of two blocks sum 0.75 + 0.75 first ->
    3. So the bitwise checks here can see an order change."""
    x = torch.ones(1, 192, dtype=torch.float16, device=DEVICE)
    x[0, 0] = x[0, 160] = 4096.0
    w = torch.zeros(32, 192, dtype=torch.float16, device=DEVICE)
    w[:, 0], w[:, 160] = 4096.0, -4096.0
    w[:, 32:160:32] = 0.75
    one = linear_triton(x, w, config=LinearConfig(block_n=32, block_k=32, groups=1))
    three = linear_triton(x, w, config=SMALL)
    assert (one == 0).all() and (three > 1).all(), (one[0, 0].item(), three[0, 0].item())


def test_row_tile_launches_agree_bitwise():
    """The 128-row program (two 64-row warpgroups) gives the 64-row launch's bits, split and
    fused, with a bias and a ragged N (80), K (200) and M (200: a ragged last tile of either)."""
    x, w, b = problem(200, 80, 200, True, seed=15)
    expect = linear_triton(x, w, b, config=SMALL, split=False, block_m=BLOCK_M)
    for split, bm in LAUNCHES:
        assert torch.equal(linear_triton(x, w, b, config=SMALL, split=split, block_m=bm), expect), (split, bm)


def test_block_m_rule():
    """64-row programs up to 64 rows (AR and small trees); past that 128 for one-group weights and
    split launches, 64 for a fused launch over K groups (block_m_for's measurements)."""
    assert [block_m_for(m, 1, False) for m in (1, 16, 64, 65, 128, 256)] == [64, 64, 64, 128, 128, 128]
    assert [block_m_for(m, 8, True) for m in (1, 64, 65, 256)] == [64, 64, 128, 128]
    assert [block_m_for(m, 8, False) for m in (1, 64, 65, 256)] == [64, 64, 64, 64]


def test_sm90_wide_tile_runs_the_same_wgmma():
    """Offline sm_90 compiles (no GPU): the 128-row, 8-warp program lays its warps out as two
    warpgroups stacked on M ([8, 1]) with the 64-row program's MMA instruction shape, and its PTX
    issues the same wgmma instructions, for the 64- and 128-wide tiles, one or several K groups,
    and split, with the rule's 64-deep K blocks and every TUNED config's blocks and stages; no
    local-memory spills. (Equal bits on the device are the GPU tests' to show; this pins what the
    compiler emits.)"""
    pytest.importorskip("triton.backends.nvidia")
    variants = {(128, 64, 4, 0, 1), (64, 64, 4, 0, 0), (64, 64, 4, 1, 0)}
    for (n, k), c in TUNED.items():
        one = c.num_groups(k) == 1
        variants.add((c.block_n, c.block_k, c.num_stages, int(not one), int(one)))
    args = [f"{bm},{bn},{bk},{stages_for(bm, LinearConfig(bn, bk, 1, num_stages=stages))},{warps},{split},{one}"
            for bn, bk, stages, split, one in sorted(variants) for bm, warps in ((BLOCK_M, 4), (WIDE_BLOCK_M, 8))]
    out = run_compile_script("sm90_linear_compile.py", args)
    assert len(out) == len(args)
    for narrow, wide in zip(out[::2], out[1::2]):
        bn = narrow["block_n"]
        assert narrow["mma"] == [[4, 1, 16, bn, 16]] and wide["mma"] == [[8, 1, 16, bn, 16]], (narrow, wide)
        assert narrow["wgmma"] == wide["wgmma"] and len(wide["wgmma"]) == 1 and f"m64n{bn}k16" in wide["wgmma"][0]
        assert narrow["local"] == 0 and wide["local"] == 0, (narrow, wide)


# Wide tiles (WideTile) of a one-group weight, as the interpreter runs them: 128 and 256 rows, 64
# to 256 columns, 64- and 128-deep K blocks (K = 192: a ragged last block at 128).
ONE_GROUP = LinearConfig(block_n=32, block_k=32, groups=1)
WIDE_CPU_TILES = [WideTile(128, 64, 64, 3), WideTile(128, 256, 64, 2), WideTile(256, 128, 128, 2),
                  WideTile(256, 64, 64, 2, tma=True), WideTile(64, 256, 64, 3), WideTile(64, 64, 128, 2, tma=True)]


@pytest.mark.parametrize("tile", WIDE_CPU_TILES, ids=lambda t: f"{t.block_m}x{t.block_n}x{t.block_k}")
def test_wide_tiles_give_the_64_row_launch_bits(tile, ordered_dot, poisoned_alloc):
    """Every row of a wide-tile launch (M = 1, 65, 200, 260: ragged tiles of either height) equals
    the 64-row launch's, bitwise, with a bias and a ragged N (80: one 256-wide tile wraps its
    columns) and K; every element written (NaN-poisoned outputs). The dot adds its products in K
    order (ordered_dot), as one fp32 chain over K, so a 128-deep K block must equal two 64-deep
    ones here, as the k16 wgmma chain does on the GPU. (The TMA form runs here too: its
    descriptors' loads are the interpreter's masked loads with zero fill.)"""
    x, w, b = problem(260, 80, 192, True, seed=21)
    expect = linear_triton(x, w, b, config=ONE_GROUP, split=False, block_m=BLOCK_M)
    for m in (1, 65, 200, 260):
        got = linear_triton(x[:m], w, b, config=ONE_GROUP, wide=tile)
        assert torch.equal(got, expect[:m]), f"M={m}: {tile} differs from the 64-row launch"


# Wide tiles with tails (`head_columns`), with the SM count of the wave rule made small (3 or 5) so
# that these small outputs end on part-filled waves: at N = 200 and M = 65 / 200 / 260 some
# launches keep one wave, some leave columns to a tail, some to a tail's tail.
TAIL_CPU_TILES = [WideTile(128, 64, 64, 2, tail=WideTile(64, 32, 64, 2)),
                  WideTile(128, 128, 128, 2, tma=True, tail=WideTile(128, 64, 64, 2, tail=WideTile(64, 64, 64, 2)))]


@pytest.mark.parametrize("sms", [3, 5])
def test_wide_tile_tails_give_the_same_bits(sms, monkeypatch, ordered_dot, poisoned_alloc):
    """A wide tile whose last wave goes to its tail (two launches over column ranges, a tail of a
    tail) gives every row the 64-row launch's bits, bias and ragged columns included; every
    element written (NaN-poisoned outputs)."""
    monkeypatch.setattr(matmul, "SMS", sms)
    x, w, b = problem(260, 200, 192, True, seed=22)
    expect = linear_triton(x, w, b, config=ONE_GROUP, split=False, block_m=BLOCK_M)
    depths = set()
    for tile in TAIL_CPU_TILES:
        for m in (65, 200, 260):
            n, depth, t = 200, 0, tile
            while t is not None and (cols := head_columns(m, n, t)) < n:
                n, depth, t = n - cols, depth + 1, t.tail
            depths.add(depth)
            got = linear_triton(x[:m], w, b, config=ONE_GROUP, wide=tile)
            assert torch.equal(got, expect[:m]), f"M={m}: {tile} differs from the 64-row launch"
    assert depths == {0, 1, 2}, depths  # one launch, a tail, a tail's tail


def test_head_columns_rule():
    """The head tile keeps the columns of its whole waves: the 1.5B gate_up at 256 rows in 128 x
    256 tiles (140 tiles on 132 SMs) keeps 66 of its 70 column tiles; within one wave, on whole
    waves, or without a tail, it keeps them all."""
    tile = WideTile(128, 256, 64, 4, tma=True, tail=WideTile(64, 64, 64, 4))
    assert head_columns(256, 17920, tile) == 66 * 256
    assert head_columns(128, 17920, tile) == 17920  # 70 tiles: one wave
    assert head_columns(256, 17920, WideTile(128, 256, 64, 4, tma=True)) == 17920  # no tail
    assert head_columns(256, 2 * 132 * 256, tile) == 2 * 132 * 256  # two whole waves
    assert head_columns(256, 151936, WideTile(128, 256, 64, 3, programs_per_sm=2, tail=tile)) == 528 * 256
    with pytest.MonkeyPatch.context() as patch:  # whole waves of 3 programs, 5 M tiles: no whole column
        patch.setattr(matmul, "SMS", 3)
        assert head_columns(260, 40, WideTile(64, 64, 64, 4, tail=WideTile(64, 32, 64, 4))) == 40


def test_wide_tile_rule():
    """wide_tile_for: none for weights in K groups and for rows no WIDE_PICKS entry lists (they
    keep the launch `block_m_for` and `use_tma` choose); else the entry's tile. Every WIDE_PICKS
    entry is a one-group weight's, for rows on one side of 64, a tile the kernel takes (one
    warpgroup of 64 rows up to 64 rows, two past them; at most 256 wide; its stage ring within an
    SM's 227 KB of shared memory per program), and none shares rows with a WS_PICKS entry of the
    same shape (that one would win)."""
    down = (1536, 8960)
    for m in (1, 64, 256):
        assert wide_tile_for(m, *down, choose_config(*down)) is None
    for m in (1, 65):
        assert wide_tile_for(m, 80, 64, ONE_GROUP) is None  # a one-group weight no entry lists
    for (n, k), picks in WIDE_PICKS.items():
        config = choose_config(n, k)
        assert config.num_groups(k) == 1, (n, k)
        for m in range(1, 257):
            listed = [p.tile for p in picks if p.after_rows < m <= p.up_to_rows]
            assert wide_tile_for(m, n, k, config) == (listed[0] if listed else None), (n, k, m)
        for p in picks:
            t = p.tile
            assert 0 <= p.after_rows < p.up_to_rows <= BLOCK_M or BLOCK_M <= p.after_rows < p.up_to_rows, (n, k, p)
            assert t.block_m == BLOCK_M if p.up_to_rows <= BLOCK_M else t.block_m in (128, 256), (n, k, p)
            for part in tile_chain(t):  # the tile, its tail, the tail's tail ...
                assert part.block_m in (64, 128, 256) and part.block_n in (64, 128, 256), (n, k, p)
                assert part.block_k in (64, 128), (n, k, p)
                assert part.shared_bytes() * part.programs_per_sm <= 227 * 1024, (n, k, p)
            for ws in WS_PICKS.get((n, k), ()):
                assert p.up_to_rows <= ws.after_rows or ws.up_to_rows <= p.after_rows, (n, k, p, ws)


def tile_chain(tile: WideTile) -> list[WideTile]:
    """A wide tile and its tails, each without its own tail (one launch each)."""
    chain = []
    while tile is not None:
        chain.append(dataclasses.replace(tile, tail=None))
        tile = tile.tail
    return chain


# The wide tiles compiled offline for sm_90 (with WIDE_PICKS's): the cuBLAS-class 128 x 256 and
# 256 x 128 tiles, 64- and 128-deep K blocks, the stage counts that fit.
SM90_WIDE_TILES = [WideTile(128, 256, 64, 3), WideTile(128, 256, 64, 4), WideTile(256, 128, 64, 3),
                   WideTile(128, 256, 128, 2), WideTile(256, 128, 128, 2), WideTile(128, 128, 128, 3),
                   WideTile(64, 256, 64, 4), WideTile(64, 64, 128, 3), WideTile(64, 128, 64, 6)]


def test_sm90_wide_tiles_run_the_same_wgmma():
    """Offline sm_90 compiles (no GPU) of the wide tiles (SM90_WIDE_TILES and WIDE_PICKS's), grid
    and TMA forms, against the 64-row one-group launch: warps stacked on M ([4, 1] for a 64-row
    tile, [8, 1] past it: each warpgroup its own 64-row slabs), one wgmma m64nNk16 with N the
    tile's width, and the same instruction form (bf16 operands from shared memory, fp32
    accumulator, the same scale and transpose flags); no local-memory spills; shared memory within
    an SM's."""
    pytest.importorskip("triton.backends.nvidia")
    picked = {part for picks in WIDE_PICKS.values() for p in picks for part in tile_chain(p.tile)}
    tiles = sorted(set(SM90_WIDE_TILES) | picked, key=lambda t: (t.block_m, t.block_n, t.block_k, t.stages))
    args = ["64,64,64,4,4,0,1"] + [f"{t.block_m},{t.block_n},{t.block_k},{t.stages},{t.num_warps},0,1" for t in tiles]
    narrow, *wide = run_compile_script("sm90_linear_compile.py", args)
    tma = run_compile_script("sm90_tma_compile.py",
                             [f"{t.block_m},{t.block_n},{t.block_k},{t.stages},{t.num_warps},1" for t in tiles])
    assert narrow["mma"] == [[4, 1, 16, 64, 16]] and len(narrow["forms"]) == 1, narrow
    for t, grid, fed in zip(tiles, wide, tma):
        for got in (grid, fed):
            assert got["mma"] == [[t.num_warps, 1, 16, t.block_n, 16]], (t, got)
            assert got["wgmma"] == [f"m64n{t.block_n}k16"] and got["forms"] == narrow["forms"], (t, got)
            assert got["local"] == 0 and got["shared"] <= 227 * 1024, (t, got)
        assert fed["tma"], (t, fed)


@pytest.mark.parametrize("config", [SMALL, None], ids=["small", "default"])
def test_rows_are_m_invariant(config):
    """Bitwise: a row's result is the same at M = 1, 7, 64, 65, 70 and 130 (64- and 128-row
    programs), and alone."""
    x, w, b = problem(130, 80, 192, True, seed=6)
    assert_rows_invariant(x, w, b, config)


def test_rows_do_not_depend_on_other_rows():
    """The same row among different neighbours (huge values, other positions) gives the same bits."""
    x, w, b = problem(70, 80, 192, False, seed=7)
    noisy = randn(70, 192, seed=8, scale=1e4)
    noisy[3] = x[40]
    assert torch.equal(linear_triton(noisy, w, b, config=SMALL)[3], linear_triton(x, w, b, config=SMALL)[40])


def test_strided_weight_view_and_out(poisoned_alloc):
    """A weight view with a row stride > K (rows and columns sliced out of a bigger matrix), its
    bias slice and a strided x, written into a column slice of a bigger buffer; every element
    written (NaN-poisoned allocations)."""
    big_x, big_w, big_b = problem(66, 200, 256, True, seed=9)
    x, w, b = big_x[:, 16:208], big_w[40:120, 32:224], big_b[40:120]
    assert w.stride() == (256, 1) and x.stride() == (256, 1)
    expect = linear_triton(x.contiguous(), w.contiguous(), b.contiguous(), config=SMALL)
    for split in (False, True):
        dest = torch.zeros(66, 100, dtype=x.dtype, device=DEVICE)
        got = linear_triton(x, w, b, out=dest[:, 10:90], config=SMALL, split=split)
        assert got.data_ptr() == dest[:, 10:90].data_ptr()
        assert torch.equal(got, expect)
        assert not dest[:, :10].any() and not dest[:, 90:].any()


def assert_whole_groups(c: LinearConfig, k: int) -> None:
    """K's blocks fill c's groups with none empty (the last may be shorter)."""
    k_blocks = -(-k // c.block_k)
    assert (c.num_groups(k) - 1) * c.group_blocks(k) < k_blocks <= c.num_groups(k) * c.group_blocks(k), (k, c)


def test_rule_config():
    """The documented group counts (rule_config's docstring) and whole, non-empty groups."""
    documented = {(2048, 1536): 8, (1536, 1536): 8, (17920, 1536): 1, (1536, 8960): 11, (151936, 1536): 1,
                  (6144, 4096): 3, (4096, 4096): 5, (24576, 4096): 1, (4096, 12288): 5, (151936, 4096): 1}
    for (n, k), groups in documented.items():
        c = rule_config(n, k)
        assert c.num_groups(k) == groups, (n, k, c)
        assert_whole_groups(c, k)
    # AR splits the narrow projections over K; 256-row verifies of o_proj and lm_head never split
    # (the partials would cost more than the idle SMs; lm_head has one group).
    for m in (1, 16):
        assert use_split(m, 1536, 8960, rule_config(1536, 8960))
        assert use_split(m, 1536, 1536, rule_config(1536, 1536))
    assert not use_split(256, 1536, 1536, rule_config(1536, 1536))
    assert not use_split(1, 151936, 1536, rule_config(151936, 1536))
    # The fused launch weighed is a 64-row one: 8B qkv fuses from 128 rows (192 programs), 8B
    # o_proj splits at 128 (128 programs) and fuses at 256.
    assert not use_split(128, 6144, 4096, rule_config(6144, 4096))
    assert use_split(128, 4096, 4096, rule_config(4096, 4096)) and not use_split(256, 4096, 4096, rule_config(4096, 4096))


def test_tuned_configs():
    """choose_config returns the measured TUNED entries, else the rule; each entry has whole,
    non-empty K groups, a tile width the 64-row warpgroup covers, and (where it has groups) a
    split launch at M=1, as the engine's consumers expect of a weight they read partials from."""
    assert choose_config(17920, 1536) == TUNED[(17920, 1536)] != rule_config(17920, 1536)
    assert choose_config(4096, 12288) == rule_config(4096, 12288)
    for (n, k), c in TUNED.items():
        assert c.block_n in (64, 128) and c.block_k in (64, 128) and c.num_warps == 4, (n, k, c)
        assert_whole_groups(c, k)
        if c.num_groups(k) > 1:
            assert use_split(1, n, k, c), (n, k, c)


def test_linear_dispatch_cpu_unchanged():
    """engine.layers.linear keeps its CPU paths (bf16 on the CPU never reaches Triton)."""
    x, w, b = (randn(*shape, seed=10, dtype=torch.float32, device="cpu") for shape in ((5, 64), (48, 64), (48,)))
    torch.testing.assert_close(linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- GPU only


@gpu_only
@pytest.mark.parametrize("name", list(REAL_SHAPES))
def test_gpu_m_invariant_real_shapes(name):
    """Qwen2.5-1.5B and Qwen3-8B shapes, bf16: bitwise the same rows at M = 1, 7, 64, 65, 128,
    200 and 256 (64- and 128-row programs, the engine's wide tiles) and every one of the 256 rows
    alone (M=1); every launch (split / fused, 64 / 128 rows) at M = 1, 65 and 200 gives the same
    bits, and so does every wide tile of GPU_WIDE_TILES and WIDE_PICKS on the one-group weights
    (64-row tiles at M = 1, 16 and 64, taller ones at 65, 200 and 256); close to cuBLAS."""
    n, k, bias = REAL_SHAPES[name]
    x, w, b = problem(256, n, k, bias, seed=11)
    full = assert_rows_invariant(x, w, b, ms=GPU_MS, alone="all")
    for m in (1, 65, 200):
        for split, bm in LAUNCHES:
            got = linear_triton(x[:m], w, b, split=split, block_m=bm)
            assert torch.equal(got, full[:m]), f"M={m}: split={split} block_m={bm} differs"
    if choose_config(n, k).num_groups(k) == 1:
        for tile in GPU_WIDE_TILES + [p.tile for p in WIDE_PICKS.get((n, k), ())]:
            for m in (1, 16, 64) if tile.block_m == BLOCK_M else (65, 200, 256):
                assert torch.equal(linear_triton(x[:m], w, b, wide=tile), full[:m]), f"M={m}: {tile} differs"
    ref = F.linear(x, w, b)
    torch.testing.assert_close(full.float(), ref.float(), rtol=2e-2, atol=2e-2)
    exact = linear_ref(x, w, b).float()
    assert (full.float() - exact).norm() <= 1.05 * (ref.float() - exact).norm()  # as accurate as cuBLAS


@gpu_only
def test_gpu_fused_linear_parts_and_dispatch():
    """FusedLinear.forward_parts (a row-slice view of the weight) goes through the kernel on CUDA
    bf16 and is M-invariant; fp32 on CUDA stays F.linear; autograd falls back to F.linear."""
    torch.manual_seed(12)
    qkv = FusedLinear(1536, {"q_proj": 1536, "k_proj": 256, "v_proj": 256}, bias=True).to(DEVICE, torch.bfloat16)
    qkv.requires_grad_(False)
    x = randn(64, 1536, seed=12)
    r = qkv.rows("k_proj", "v_proj")
    kv = qkv.forward_parts(x, "k_proj", "v_proj")
    assert torch.equal(kv, linear_triton(x, qkv.weight[r], qkv.bias[r]))
    assert torch.equal(qkv.forward_parts(x[5:6], "k_proj", "v_proj")[0], kv[5])
    assert torch.equal(qkv(x[None])[0], linear_triton(x, qkv.weight, qkv.bias))  # leading dims
    x32, w32 = x.float(), qkv.weight.float()
    assert torch.equal(linear(x32, w32), F.linear(x32, w32))
    w_grad = qkv.weight.detach().clone().requires_grad_(True)
    linear(x, w_grad).float().sum().backward()
    assert w_grad.grad is not None


@gpu_only
def test_gpu_cuda_graph():
    """Captured once, replayed on new inputs: the same bits as eager (split and fused launches,
    64- and 128-row programs)."""
    for m, (n, k) in ((1, (1536, 8960)), (128, (17920, 1536)), (200, (6144, 1024))):
        x, w, _ = problem(m, n, k, False, seed=13)
        static_x = x.clone()
        linear_triton(static_x, w)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = linear_triton(static_x, w)
        new_x = randn(m, k, seed=14)
        static_x.copy_(new_x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, linear_triton(new_x, w))

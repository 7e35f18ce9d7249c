"""The fused MoE kernels (kernels/moe.py) against the plain-torch reference (kernels/reference.py).

On the CPU the Triton kernels run under TRITON_INTERPRET=1 with small shapes in fp32; the real
Qwen3-30B-A3B shapes in bf16, the CUDA-graph capture and determinism run only on a GPU.
The interpreter's tl.dot is numpy's matmul of the whole tile, whose per-element sums depend on
the tile's width; the bitwise tests between the grouped and the per-token down (tiles of other
widths) patch it (conftest's `ordered_dot`) to add each element's products in K order: the property the
GPU's MMA has, which `test_gpu_mma_bits_ignore_row_place_and_tile_width` checks on the device.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from jetspec_chat.kernels import (  # noqa: E402
    moe_block,
    moe_block_ref,
    moe_block_triton,
    moe_experts_ref,
    moe_route_ref,
    moe_route_triton,
)
from jetspec_chat.kernels.moe import (  # noqa: E402
    BLOCK_M,
    PLACE_TOKENS,
    TILE,
    MoeTile,
    max_blocks,
    router_logits,
    router_partials,
    uses_token_path,
)
from test_fused_kernels import rtne_bf16  # noqa: E402,F401  (the interpreter's bf16 casts round to nearest)
from sm90 import run_compile_script  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
gpu_only = pytest.mark.skipif(not CUDA, reason="needs a GPU")

GROUPED = dataclasses.replace(TILE, token_rows=0)  # the grouped down + combine at every row count


def weights(t, hidden, inter, experts, seed=0, dtype=torch.float32, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, hidden, generator=g)
    router = torch.randn(experts, hidden, generator=g) * hidden**-0.5
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) * hidden**-0.5
    down = torch.randn(experts, hidden, inter, generator=g) * inter**-0.5
    return [a.to(device=device, dtype=dtype) for a in (x, router, gate_up, down)]


# T = 1 and 16: one grouping program; 17, 40: several.
@pytest.mark.parametrize("t,experts,top_k", [(1, 8, 2), (7, 6, 3), (5, 128, 8), (16, 12, 4), (40, 128, 8)])
@pytest.mark.parametrize("norm", [True, False])
def test_route_matches_reference(t, experts, top_k, norm):
    x, router, _, _ = weights(t, 32, 16, experts, seed=t)
    w_ref, ids_ref = moe_route_ref(x, router, top_k, norm)
    routing = moe_route_triton(F.linear(x, router), top_k, norm, x.dtype)
    assert torch.equal(routing.ids.long(), ids_ref)
    torch.testing.assert_close(routing.weights, w_ref, rtol=1e-6, atol=1e-7)
    if norm:
        torch.testing.assert_close(routing.weights.sum(-1), torch.ones(t, device=DEVICE))


@pytest.fixture
def bf16_casts(request):
    """bf16 as the GPU rounds it: natively on a GPU, else the interpreter's casts patched (rtne_bf16)."""
    if not CUDA:
        request.getfixturevalue("rtne_bf16")


@pytest.mark.parametrize("t", [1, 16, 40])  # one grouping program, several
def test_routing_from_the_router_partials_is_the_logits_routing(t, bf16_casts):
    """bf16: routing from linear_partials' K-group sums (added inside the routing kernel) equals
    routing from linear_triton's logits bitwise: ids, weights, layout. On a GPU at the
    Qwen3-30B-A3B router's shape (16 K groups), on the CPU a smaller one (4)."""
    x, router, _, _ = weights(t, 2048 if CUDA else 512, 16, 128, seed=t, dtype=torch.bfloat16)
    partials = router_partials(x, router)
    assert partials.dim() == 3 and partials.shape[0] == (16 if CUDA else 4)
    a = moe_route_triton(partials, 8, True, x.dtype)
    b = moe_route_triton(router_logits(x, router), 8, True, x.dtype)
    for name in ("ids", "weights", "block_expert", "block_rows"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    check_layout(a, t, 128, 8)


@pytest.mark.parametrize("t", [1, 4, 40])
def test_routing_without_grouping_is_the_same_routing(t):
    """The per-token path asks for no grouping: the same ids and weights, no block table."""
    x, router, _, _ = weights(t, 32, 16, 16, seed=t)
    grouped = moe_route_triton(F.linear(x, router), 4, True, x.dtype)
    alone = moe_route_triton(F.linear(x, router), 4, True, x.dtype, group=False)
    assert torch.equal(alone.ids, grouped.ids) and torch.equal(alone.weights, grouped.weights)
    assert alone.block_expert is None and alone.block_rows is None and alone.row_assign is None


def check_layout(routing, t, experts, top_k):
    """Every assignment exactly once, blocks of one expert each, used blocks first with experts
    ascending, tokens in order within an expert, the unused tail marked."""
    block_expert, block_rows, row_assign = (a.cpu() for a in (routing.block_expert, routing.block_rows, routing.row_assign))
    flat = routing.ids.reshape(-1).cpu()
    assert block_expert.numel() == max_blocks(t * top_k, experts)
    seen = []
    for b, (e, rows) in enumerate(zip(block_expert.tolist(), block_rows.tolist())):
        if rows == 0:
            assert e == experts  # only the unused tail
            continue
        assert 0 < rows <= BLOCK_M
        got = row_assign[b * BLOCK_M: b * BLOCK_M + rows].tolist()
        assert all(flat[a] == e for a in got)  # a block holds one expert's rows
        seen += got
    used = block_rows > 0
    n_used = int(used.sum())
    assert bool(used[:n_used].all()) and not bool(used[n_used:].any())  # used blocks first
    assert block_expert[used].tolist() == sorted(block_expert[used].tolist())  # experts ascending
    assert sorted(seen) == list(range(t * top_k))
    assert seen == sorted(range(t * top_k), key=lambda a: (int(flat[a]), a))
    counts = torch.bincount(flat.long(), minlength=experts)
    assert n_used == int(((counts + BLOCK_M - 1) // BLOCK_M).sum())


@pytest.mark.parametrize(
    "t,experts,top_k",
    # one grouping program (T <= PLACE_TOKENS) and several (T = 100: 7), each placing its tokens
    # after the earlier ones; experts with several blocks (T = 100, 4 experts: 75 rows each)
    [(1, 8, 2), (13, 8, 2), (16, 128, 8), (17, 6, 3), (40, 128, 8), (100, 4, 3), (70, 16, 1)],
)
def test_grouping_covers_every_assignment_once_by_expert(t, experts, top_k):
    g = torch.Generator().manual_seed(t)
    logits = torch.randn(t, experts, generator=g).to(DEVICE)
    routing = moe_route_triton(logits, top_k, True, torch.float32)
    check_layout(routing, t, experts, top_k)


SMALL = MoeTile(gate_up_n=16, down_n=32, block_k=32, num_warps=4, num_stages=2)


@pytest.mark.parametrize(
    "t,hidden,inter,experts,top_k,tile",
    [
        (1, 64, 32, 8, 2, TILE),
        (6, 80, 48, 6, 3, TILE),  # ragged N and K tails, block_k > K
        (21, 64, 32, 16, 4, SMALL),  # two grouping programs
        (3, 128, 96, 128, 8, TILE),
        (40, 64, 40, 4, 2, SMALL),  # 20 rows an expert: two blocks each
        (9, 64, 40, 4, 2, SMALL),
    ],
)
@pytest.mark.parametrize("norm", [True, False])
def test_moe_matches_reference(t, hidden, inter, experts, top_k, tile, norm, checked_pointers):
    x, router, gate_up, down = weights(t, hidden, inter, experts, seed=hidden + t)
    ref = moe_block_ref(x, router, gate_up, down, top_k, norm)
    got = moe_block_triton(x, router, gate_up, down, top_k, norm, tile=tile)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


TOKEN_TILES = [
    MoeTile(gate_up_n=16, down_n=32, block_k=32, num_warps=4, num_stages=2, token_rows=4, token_n=16),
    MoeTile(gate_up_n=16, down_n=32, block_k=32, num_warps=4, num_stages=2, token_rows=4, token_n=32),  # ragged H
]


@pytest.mark.parametrize(
    "t,hidden,inter,experts,top_k",
    [(1, 64, 32, 8, 2), (2, 80, 48, 6, 3), (3, 64, 40, 16, 1), (4, 128, 96, 128, 8), (4, 48, 32, 32, 16)],
)
@pytest.mark.parametrize("tile", TOKEN_TILES)
def test_token_path_matches_reference(t, hidden, inter, experts, top_k, tile):
    """Few tokens: down and combine in one launch (_down_combine_kernel), k slots per tl.dot."""
    assert uses_token_path(t, top_k, torch.empty(experts, hidden, inter, device="meta"), tile)
    x, router, gate_up, down = weights(t, hidden, inter, experts, seed=hidden + t)
    for norm in (True, False):
        torch.testing.assert_close(moe_block_triton(x, router, gate_up, down, top_k, norm, tile=tile),
                                   moe_block_ref(x, router, gate_up, down, top_k, norm), rtol=1e-5, atol=1e-6)


def test_token_path_rule():
    down = torch.empty(128, 2048, 768, device="meta")
    assert [uses_token_path(t, 8, down) for t in (1, TILE.token_rows, TILE.token_rows + 1)] == [True, True, False]
    assert not uses_token_path(1, 8, down, GROUPED)
    assert not uses_token_path(1, BLOCK_M + 1, down)  # the k slots must fit in one 16-row tile
    assert not uses_token_path(1, 8, torch.empty(1024, 4096, 1024, device="meta"))  # 2^32 elements: 32-bit offsets


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tile", TOKEN_TILES)
def test_token_path_is_the_grouped_path_bitwise(dtype, tile, ordered_dot, rtne_bf16):
    """Each of T <= token_rows tokens (token path) has the bits of the grouped path on the same
    T tokens and on them inside 40 (several grouping programs, several rows an expert)."""
    x, router, gate_up, down = weights(40, 80, 48, 8, seed=7, dtype=dtype)
    grouped = dataclasses.replace(tile, token_rows=0)
    many = moe_block_triton(x, router, gate_up, down, 3, True, tile=grouped)
    for t in range(1, tile.token_rows + 1):
        few = moe_block_triton(x[:t], router, gate_up, down, 3, True, tile=tile)
        assert torch.equal(few, moe_block_triton(x[:t], router, gate_up, down, 3, True, tile=grouped)), t
        assert torch.equal(few, many[:t]), t


def test_strided_input_and_dispatch_on_cpu():
    x, router, gate_up, down = weights(5, 64, 32, 8, seed=3)
    wide = torch.cat([x, x], dim=-1)[:, :64]  # a strided view, as the fused norms hand out
    torch.testing.assert_close(moe_block_triton(wide, router, gate_up, down, 2, True), moe_block_ref(x, router, gate_up, down, 2, True),
                               rtol=1e-5, atol=1e-6)
    if not CUDA:
        assert torch.equal(moe_block(x, router, gate_up, down, 2, True), moe_block_ref(x, router, gate_up, down, 2, True))


def test_fused_path_reads_nothing_on_the_host():
    """No .item(), nonzero or value-dependent shape anywhere in the wrapper: what lets the block
    live in a CUDA graph (the reference, by contrast, groups with nonzero on the host)."""
    from engine_helpers import NoHostReads

    for t in (3, 9, 40):  # per-token path; one grouping program, several
        x, router, gate_up, down = weights(t, 64, 32, 8, seed=4)
        with NoHostReads():
            moe_block_triton(x, router, gate_up, down, 2, True)
    with pytest.raises(AssertionError, match="on the host"), NoHostReads():
        moe_block_ref(x, router, gate_up, down, 2, True)


def test_too_many_tokens_for_32_bit_offsets_is_refused_before_any_launch():
    x, router, gate_up, down = (torch.empty(shape, device="meta") for shape in
                                ((1 << 18, 2048), (128, 2048), (128, 1536, 2048), (128, 2048, 768)))
    with pytest.raises(ValueError, match="too many for one MoE call"):
        moe_block_triton(x, router, gate_up, down, 8, True)


def test_tile_shapes():
    assert BLOCK_M == 16  # tl.dot needs 16 rows; below 64 Triton stays on mma.sync (no wgmma)
    for v in (BLOCK_M, PLACE_TOKENS, TILE.gate_up_n, TILE.down_n, TILE.block_k):
        assert v & (v - 1) == 0  # powers of two (tl.arange)


def test_sm90_expert_gemms_run_mma_sync():
    """Offline sm_90 compiles (no GPU) of the expert GEMMs (gate/up grouped and per token, the two
    downs) at TILE and at a wide per-token tile, with gpt-oss's and Gemma 4's options at TILE
    too, and of the routing kernels: the GEMMs all on
    mma.sync m16n8k16 (bf16 in, fp32 accumulate; never wgmma, which may round differently), no
    local-memory spills, shared memory within an SM's 227 KB. (Equal bits on
    the device are the GPU tests' to show; this pins what the compiler emits.)"""
    pytest.importorskip("triton.backends.nvidia")
    wide = dataclasses.replace(TILE, token_n=64, token_warps=8, token_stages=2)
    args = [",".join(str(v) for v in (t.gate_up_n, t.down_n, t.block_k, t.num_warps, t.num_stages, t.token_n, t.token_warps,
                                      t.token_stages)) for t in (TILE, wide)]
    out = run_compile_script("sm90_moe_compile.py", args + ["gpt-oss", "gemma4"])  # and their options at TILE
    gemms = ["gate_up", "gate_up_token", "down", "down_combine"]
    assert [o["kernel"] for o in out] == (gemms * 2 + [g + "_gpt_oss" for g in gemms] + ["route_gpt_oss"]
                                          + [g + "_gemma4" for g in gemms] + ["route_gemma4", "route"])
    routes = [o for o in out if o["kernel"].startswith("route")]
    for o in out:
        if o not in routes:
            assert o["mma"] == ["m16n8k16.row.col.f32.bf16.bf16.f32"] and o["wgmma"] == [], o
            assert o["local"] == 0 and o["shared"] <= 227 * 1024, o
    for o in routes:
        assert o["local"] == 0, o  # the routing program's one warp holds its token in registers


def check_batch_invariant(hidden, inter, experts, top_k, many, dtype, tile=TILE, alone=None):
    """Each token's output row computed alone (an AR step) is bitwise its row among `many` tokens
    (a verify), and among the same tokens in another order: routing, grouping, the GEMM tiles and
    the combine all run per row. alone: the tokens checked one by one (default: all)."""
    x, router, gate_up, down = weights(many, hidden, inter, experts, seed=many + hidden, dtype=dtype)
    together = moe_block_triton(x, router, gate_up, down, top_k, True, tile=tile)
    shuffled = torch.randperm(many, generator=torch.Generator().manual_seed(1)).to(x.device)
    other = moe_block_triton(x[shuffled], router, gate_up, down, top_k, True, tile=tile)
    assert torch.equal(other, together[shuffled])
    for i in range(many) if alone is None else alone:
        one = moe_block_triton(x[i:i + 1], router, gate_up, down, top_k, True, tile=tile)
        assert torch.equal(one[0], together[i]), f"token {i}: max |diff| {(one[0].float() - together[i].float()).abs().max()}"


@pytest.mark.parametrize("many", [5, 40])  # one grouping program, several; 40 tokens: several blocks an expert
def test_batch_invariant_bf16(many, rtne_bf16, ordered_dot):
    """bf16: the router through linear_triton, one expert tile at 1 and `many` rows (alone: the
    per-token down). K = 512 is long enough for fp32 sums in another order to change bf16 bits:
    an earlier kernel (GEMV tiles at 1 row an expert, tensor cores among 40 tokens) failed
    this at many = 40 (token 12)."""
    check_batch_invariant(512, 128, 8, 2, many, torch.bfloat16)


# ----------------------------------------------------------------------------- GPU, real shapes

QWEN3_30B = dict(hidden=2048, inter=768, experts=128)


def check_bf16(t, hidden, inter, experts, top_k=8, tile=TILE):
    x, router, gate_up, down = weights(t, hidden, inter, experts, seed=t, dtype=torch.bfloat16)
    got = moe_block_triton(x, router, gate_up, down, top_k, True, tile=tile)
    # Routing: bf16 logits tie often (8-bit mantissa), and any of tied experts is a right pick, so
    # the kernel's picks are checked as sets of probabilities, and the experts part runs the
    # reference on the kernel's own routing.
    routing = moe_route_triton(router_logits(x, router), top_k, True, x.dtype)
    w, ids = routing.weights, routing.ids
    w_ref, _ = moe_route_ref(x, router, top_k, True)
    torch.testing.assert_close(w.float().sort(-1).values, w_ref.float().sort(-1).values, rtol=1e-2, atol=1e-3)
    probs = torch.softmax(router_logits(x, router), dim=-1, dtype=torch.float32)
    assert (probs.gather(1, ids.long()).min(-1).values >= probs.topk(top_k).values[:, -1]).all()  # a true top 8
    ref = moe_experts_ref(x, gate_up, down, w, ids.long())
    # bf16: the reference adds the k experts' rows in bf16 one by one, we sum them in fp32
    torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-2)
    # ... and at least as close as transformers' arithmetic to fp32 arithmetic on the same values
    ref32 = moe_experts_ref(x.float(), gate_up.float(), down.float(), w.float(), ids.long())
    err, ref_err = ((a.float() - ref32).norm() / ref32.norm() for a in (got, ref))
    assert err < 1.1 * ref_err, (err, ref_err)


@pytest.mark.parametrize("t", [1, 13, 40])
def test_bf16_small(t, rtne_bf16):
    """The bf16 epilogue's roundings under the interpreter (its casts made to round to nearest
    even, as the GPU's do): the per-token path, one grouping program, several."""
    check_bf16(t, 64, 32, 16, tile=SMALL)


@gpu_only
@pytest.mark.parametrize("t", [1, 16, 64, 128, 256, 1024])
def test_gpu_bf16_real_shapes(t):
    check_bf16(t, QWEN3_30B["hidden"], QWEN3_30B["inter"], QWEN3_30B["experts"])


@gpu_only
@pytest.mark.parametrize("many", [16, 64, 256, 512])
def test_gpu_bf16_batch_invariant_real_shapes(many):
    """A token's bits alone (an AR step) equal its bits among `many` (a verify, a prefill chunk)."""
    check_batch_invariant(QWEN3_30B["hidden"], QWEN3_30B["inter"], QWEN3_30B["experts"], 8, many, torch.bfloat16,
                          alone=range(0, many, max(1, many // 16)))


@triton.jit
def _dot_probe_kernel(A, W, OUT, N, K, stride_w, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """OUT[BLOCK_M, N] = A [BLOCK_M, K] @ W[N, K].T, as the MoE kernels walk it: W tiles
    [BLOCK_K, BLOCK_N] with K contiguous, one tl.dot per K step from a zero fp32 accumulator."""
    m = tl.arange(0, BLOCK_M)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(A + m[:, None] * K + k[None, :])
        w = tl.load(W + n[None, :] * stride_w + k[:, None])
        acc = tl.dot(a, w, acc)
    tl.store(OUT + m[:, None] * N + n[None, :], acc)


@gpu_only
@pytest.mark.parametrize("n,k", [(2048, 768), (768, 2048)])  # down, gate (Qwen3-30B-A3B)
def test_gpu_mma_bits_ignore_row_place_and_tile_width(n, k):
    """What the per-token down relies on (module docstring): with 16-row bf16 tiles (mma.sync)
    and one BLOCK_K, an output element's fp32 bits depend on its own row of A and column of W
    only: not on the row's place in the tile, the other rows, the tile's width or the warps."""
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(n, k, device="cuda", generator=g).to(torch.bfloat16)
    row = torch.randn(k, device="cuda", generator=g).to(torch.bfloat16)
    expect = None
    for place, filler in ((0, "zeros"), (5, "random"), (15, "random"), (7, "zeros")):
        a = torch.zeros(BLOCK_M, k, device="cuda", dtype=torch.bfloat16)
        if filler == "random":
            a.copy_(torch.randn(BLOCK_M, k, device="cuda", generator=g))
        a[place] = row
        for block_n in (16, 32, 64, 128, 256):
            for warps in (4, 8):
                out = torch.empty(BLOCK_M, n, device="cuda")
                _dot_probe_kernel[(n // block_n,)](a, w, out, n, k, w.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=block_n,
                                                   BLOCK_K=TILE.block_k, num_warps=warps, num_stages=3)
                expect = out[place].clone() if expect is None else expect
                assert torch.equal(out[place], expect), (place, filler, block_n, warps)
    torch.testing.assert_close(expect, row.float() @ w.float().T, rtol=1e-4, atol=1e-4)


@gpu_only
@pytest.mark.parametrize("tile", [TILE, dataclasses.replace(TILE, token_n=32, token_stages=4, token_warps=8)])
def test_gpu_token_path_is_the_grouped_path_bitwise_real_shapes(tile):
    """bf16, Qwen3-30B-A3B: T = 1, 2, 4 tokens through the per-token down (an AR step, a small
    verify) have the bits of the grouped path on the same tokens, and of the same tokens
    inside 16-, 64- and 256-row calls."""
    h, i, e = QWEN3_30B["hidden"], QWEN3_30B["inter"], QWEN3_30B["experts"]
    x, router, gate_up, down = weights(256, h, i, e, seed=11, dtype=torch.bfloat16)
    grouped = dataclasses.replace(tile, token_rows=0)
    many = {m: moe_block_triton(x[:m], router, gate_up, down, 8, True, tile=tile) for m in (16, 64, 256)}
    for t in (1, 2, 4):
        assert uses_token_path(t, 8, down, tile)
        few = moe_block_triton(x[:t], router, gate_up, down, 8, True, tile=tile)
        assert torch.equal(few, moe_block_triton(x[:t], router, gate_up, down, 8, True, tile=grouped)), t
        for m, out in many.items():
            assert torch.equal(few, out[:t]), (t, m)
        middle = moe_block_triton(x[100:100 + t], router, gate_up, down, 8, True, tile=tile)  # not the first rows
        assert torch.equal(middle, many[256][100:100 + t]), t


@gpu_only
@pytest.mark.parametrize("t", [1, 64, 300])
def test_gpu_fp32_real_shapes(t):
    x, router, gate_up, down = weights(t, QWEN3_30B["hidden"], QWEN3_30B["inter"], QWEN3_30B["experts"], seed=t)
    torch.testing.assert_close(moe_block_triton(x, router, gate_up, down, 8, True), moe_block_ref(x, router, gate_up, down, 8, True),
                               rtol=1e-4, atol=1e-5)


@gpu_only
@pytest.mark.parametrize("t", [1, 3, 17, 128])  # per-token down at 1 and 3
def test_gpu_deterministic_and_captured_in_a_cuda_graph(t):
    x, router, gate_up, down = weights(t, QWEN3_30B["hidden"], QWEN3_30B["inter"], QWEN3_30B["experts"], seed=5,
                                       dtype=torch.bfloat16)
    eager = moe_block_triton(x, router, gate_up, down, 8, True)
    assert torch.equal(moe_block_triton(x, router, gate_up, down, 8, True), eager)  # no atomics: bitwise repeatable
    static_x = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        moe_block_triton(static_x, router, gate_up, down, 8, True)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe_block_triton(static_x, router, gate_up, down, 8, True)
    static_x.copy_(x.flip(0))  # other tokens, other routing: the grouping runs on the device
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, moe_block_triton(x.flip(0), router, gate_up, down, 8, True))


@pytest.mark.parametrize("t", [1, 4, 20])
def test_non_finite_tokens_stay_in_bounds(t, checked_pointers, ordered_dot):
    """A token gone NaN or inf upstream (e.g. an fp16 overflow) must not make the block read or
    write outside its tensors (`checked_pointers`), and must leave the other tokens' outputs
    as they are without it; x is a row slice of a bigger tensor, as in the engine's buffers.
    (ordered_dot: the bad token's rows move the others within their tiles; the interpreter's
    whole-tile matmul would then round them differently, the GPU's MMA does not.)"""
    big, router, gate_up, down = weights(t + 6, 32, 16, 8, seed=t)
    x = big[3 : 3 + t]
    clean = moe_block_triton(x.clone(), router, gate_up, down, 2, True)
    bad = x.clone()
    bad[0] = float("nan")
    if t > 1:
        bad[-1, 5] = float("inf")
    got = moe_block_triton(bad, router, gate_up, down, 2, True)
    ok = torch.ones(t, dtype=torch.bool)
    ok[0] = False
    if t > 1:
        ok[-1] = False
    assert torch.equal(got[ok], clean[ok])

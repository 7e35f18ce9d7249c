"""The fused MoE kernels (kernels/moe.py) against the plain-torch reference (kernels/reference.py).

On the CPU the Triton kernels run under TRITON_INTERPRET=1 with small shapes in fp32; the real
Qwen3-30B-A3B shapes in bf16, the CUDA-graph capture and determinism run only on a GPU.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")

from jetspec_chat.kernels import (  # noqa: E402
    moe_block,
    moe_block_ref,
    moe_block_triton,
    moe_experts_ref,
    moe_route_ref,
    moe_route_triton,
)
from jetspec_chat.kernels.moe import BLOCK_M, ROUTE_TOKENS, TILE, MoeTile, max_blocks, router_logits  # noqa: E402
from test_fused_kernels import rtne_bf16  # noqa: E402,F401  (the interpreter's bf16 casts round to nearest)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
gpu_only = pytest.mark.skipif(not CUDA, reason="needs a GPU")


def weights(t, hidden, inter, experts, seed=0, dtype=torch.float32, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, hidden, generator=g)
    router = torch.randn(experts, hidden, generator=g) * hidden**-0.5
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) * hidden**-0.5
    down = torch.randn(experts, hidden, inter, generator=g) * inter**-0.5
    return [a.to(device=device, dtype=dtype) for a in (x, router, gate_up, down)]


# T = 1 and 16: one routing program that also groups; 17, 40: a second launch groups.
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
    # one program (T <= ROUTE_TOKENS) and two launches; several routing programs' counts summed
    # (T = 100 is 7 programs), experts with several blocks (T = 100, 4 experts: 75 rows each)
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
        (21, 64, 32, 16, 4, SMALL),  # two routing launches
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

    for t in (9, 40):  # one routing launch, two
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
    for v in (BLOCK_M, ROUTE_TOKENS, TILE.gate_up_n, TILE.down_n, TILE.block_k):
        assert v & (v - 1) == 0  # powers of two (tl.arange)


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


@pytest.mark.parametrize("many", [5, 40])  # one routing launch, two; 40 tokens: several blocks an expert
def test_batch_invariant_bf16(many, rtne_bf16):
    """bf16: the router through linear_triton, one expert tile at 1 and `many` rows. K = 512 is
    long enough for fp32 sums in another order to change bf16 bits: the previous kernel (GEMV
    tiles at 1 row an expert, tensor cores among 40 tokens) fails this at many = 40 (token 12)."""
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
    even, as the GPU's do), one and two routing launches."""
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


@gpu_only
@pytest.mark.parametrize("t", [1, 64, 300])
def test_gpu_fp32_real_shapes(t):
    x, router, gate_up, down = weights(t, QWEN3_30B["hidden"], QWEN3_30B["inter"], QWEN3_30B["experts"], seed=t)
    torch.testing.assert_close(moe_block_triton(x, router, gate_up, down, 8, True), moe_block_ref(x, router, gate_up, down, 8, True),
                               rtol=1e-4, atol=1e-5)


@gpu_only
@pytest.mark.parametrize("t", [1, 17, 128])
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

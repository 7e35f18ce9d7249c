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
    moe_group_triton,
    moe_route_ref,
    moe_route_triton,
)
from jetspec_chat.kernels.moe import TILES, MoeTile, choose_tile, max_blocks  # noqa: E402
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


@pytest.mark.parametrize("t,experts,top_k", [(1, 8, 2), (7, 6, 3), (5, 128, 8)])
@pytest.mark.parametrize("norm", [True, False])
def test_route_matches_reference(t, experts, top_k, norm):
    x, router, _, _ = weights(t, 32, 16, experts, seed=t)
    w_ref, ids_ref = moe_route_ref(x, router, top_k, norm)
    w, ids = moe_route_triton(F.linear(x, router), top_k, norm, x.dtype)
    assert torch.equal(ids.long(), ids_ref)
    torch.testing.assert_close(w, w_ref, rtol=1e-6, atol=1e-7)
    if norm:
        torch.testing.assert_close(w.sum(-1), torch.ones(t, device=DEVICE))


@pytest.mark.parametrize(
    "t,experts,top_k,block_m",
    [(1, 8, 2, 16), (13, 8, 2, 16), (40, 6, 3, 16), (9, 128, 8, 32), (1, 128, 8, 1), (30, 8, 3, 2), (100, 4, 3, 4)],
)
def test_grouping_covers_every_assignment_once_by_expert(t, experts, top_k, block_m):
    g = torch.Generator().manual_seed(t)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(t)]).int().to(DEVICE)
    block_expert, block_rows, row_assign = moe_group_triton(ids, experts, block_m)
    block_expert, block_rows, row_assign = block_expert.cpu(), block_rows.cpu(), row_assign.cpu()
    flat = ids.reshape(-1).cpu()
    assert block_expert.numel() == max_blocks(t * top_k, experts, block_m)
    seen = []
    for b, (e, rows) in enumerate(zip(block_expert.tolist(), block_rows.tolist())):
        if rows == 0:
            assert e == experts  # only the unused tail
            continue
        assert 0 < rows <= block_m
        got = row_assign[b * block_m: b * block_m + rows].tolist()
        assert all(flat[a] == e for a in got)  # a block holds one expert's rows
        seen += got
    used = block_rows > 0
    n_used = int(used.sum())
    assert bool(used[:n_used].all()) and not bool(used[n_used:].any())  # used blocks first
    assert block_expert[used].tolist() == sorted(block_expert[used].tolist())  # experts ascending
    # every assignment exactly once, tokens in order within an expert
    assert sorted(seen) == list(range(t * top_k))
    assert seen == sorted(range(t * top_k), key=lambda a: (int(flat[a]), a))
    counts = torch.bincount(flat.long(), minlength=experts)
    assert int(used.sum()) == int(((counts + block_m - 1) // block_m).sum())


GEMV = dict(dot=False, num_warps=4, num_stages=2)
DOT = dict(dot=True, num_warps=4, num_stages=2)


@pytest.mark.parametrize(
    "t,hidden,inter,experts,top_k,tile",
    [
        (1, 64, 32, 8, 2, None),
        (6, 80, 48, 6, 3, MoeTile(block_m=16, gate_up_n=32, down_n=64, block_k=64, **DOT)),
        (21, 64, 32, 16, 4, MoeTile(block_m=32, gate_up_n=16, down_n=32, block_k=32, **DOT)),
        (3, 128, 96, 128, 8, None),
        # the GEMV path: one row per block (AR), a few rows, ragged N and K tails, block_k > K
        (1, 64, 32, 8, 2, MoeTile(block_m=1, gate_up_n=16, down_n=16, block_k=32, **GEMV)),
        (7, 80, 48, 6, 3, MoeTile(block_m=2, gate_up_n=32, down_n=32, block_k=32, **GEMV)),
        (9, 64, 40, 4, 2, MoeTile(block_m=4, gate_up_n=16, down_n=32, block_k=128, **GEMV)),
    ],
)
@pytest.mark.parametrize("norm", [True, False])
def test_moe_matches_reference(t, hidden, inter, experts, top_k, tile, norm):
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

    x, router, gate_up, down = weights(9, 64, 32, 8, seed=4)
    with NoHostReads():
        moe_block_triton(x, router, gate_up, down, 2, True)
    with pytest.raises(AssertionError, match="on the host"), NoHostReads():
        moe_block_ref(x, router, gate_up, down, 2, True)


def test_too_many_tokens_for_32_bit_offsets_is_refused_before_any_launch():
    x, router, gate_up, down = (torch.empty(shape, device="meta") for shape in
                                ((1 << 18, 2048), (128, 2048), (128, 1536, 2048), (128, 2048, 768)))
    with pytest.raises(ValueError, match="too many for one MoE call"):
        moe_block_triton(x, router, gate_up, down, 8, True)


def test_tile_table():
    bounds = [bound for bound, _ in TILES]
    assert bounds == sorted(bounds) and bounds[-1] >= 1 << 40  # ascending, the last takes any size
    assert choose_tile(8) is TILES[0][1]  # one AR token at top-8
    assert choose_tile(bounds[0] + 1) is TILES[1][1]
    assert choose_tile(1 << 20) is TILES[-1][1]
    for _, tile in TILES:
        assert tile.block_m >= 16 if tile.dot else 1 <= tile.block_m <= 8  # tl.dot needs 16 rows
        for v in (tile.block_m, tile.gate_up_n, tile.down_n, tile.block_k):
            assert v & (v - 1) == 0  # powers of two (tl.arange)


# ----------------------------------------------------------------------------- GPU, real shapes

QWEN3_30B = dict(hidden=2048, inter=768, experts=128)


def check_bf16(t, hidden, inter, experts, top_k=8, tile=None):
    x, router, gate_up, down = weights(t, hidden, inter, experts, seed=t, dtype=torch.bfloat16)
    got = moe_block_triton(x, router, gate_up, down, top_k, True, tile=tile)
    # Routing: bf16 logits tie often (8-bit mantissa), and any of tied experts is a right pick, so
    # the kernel's picks are checked as sets of probabilities, and the experts part runs the
    # reference on the kernel's own routing.
    w, ids = moe_route_triton(F.linear(x, router), top_k, True, x.dtype)
    w_ref, _ = moe_route_ref(x, router, top_k, True)
    torch.testing.assert_close(w.float().sort(-1).values, w_ref.float().sort(-1).values, rtol=1e-2, atol=1e-3)
    probs = torch.softmax(F.linear(x, router), dim=-1, dtype=torch.float32)
    assert (probs.gather(1, ids.long()).min(-1).values >= probs.topk(top_k).values[:, -1]).all()  # a true top 8
    ref = moe_experts_ref(x, gate_up, down, w, ids.long())
    # bf16: the reference adds the k experts' rows in bf16 one by one, we sum them in fp32
    torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-2)
    # ... and at least as close as transformers' arithmetic to fp32 arithmetic on the same values
    ref32 = moe_experts_ref(x.float(), gate_up.float(), down.float(), w.float(), ids.long())
    err, ref_err = ((a.float() - ref32).norm() / ref32.norm() for a in (got, ref))
    assert err < 1.1 * ref_err, (err, ref_err)


@pytest.mark.parametrize("t", [1, 13])
@pytest.mark.parametrize("dot", [True, False])
def test_bf16_small(t, dot, rtne_bf16):
    """The bf16 epilogue's roundings under the interpreter (its casts made to round to nearest
    even, as the GPU's do), on both GEMM paths."""
    tile = MoeTile(block_m=16, gate_up_n=32, down_n=64, block_k=64, **DOT) if dot else \
        MoeTile(block_m=2, gate_up_n=16, down_n=32, block_k=64, **GEMV)
    check_bf16(t, 64, 32, 16, tile=tile)


@gpu_only
@pytest.mark.parametrize("t", [1, 16, 64, 128, 256, 1024])
def test_gpu_bf16_real_shapes(t):
    check_bf16(t, QWEN3_30B["hidden"], QWEN3_30B["inter"], QWEN3_30B["experts"])


@gpu_only
@pytest.mark.parametrize("t", [1, 20, 200])
@pytest.mark.parametrize("size_class", range(len(TILES)))
def test_gpu_bf16_every_tile_at_every_size(t, size_class):
    """Each table entry is right at any row count (the table picks by size; a sweep may move it)."""
    check_bf16(t, QWEN3_30B["hidden"], QWEN3_30B["inter"], QWEN3_30B["experts"], tile=TILES[size_class][1])


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

"""The fused MoE kernels (kernels/moe.py) against the plain-torch reference (kernels/reference.py).

On the CPU the Triton kernels run under TRITON_INTERPRET=1 with small shapes in fp32; the real
Qwen3-30B-A3B shapes in bf16, the CUDA-graph capture and determinism run only on a GPU.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")

from jetspec_chat.kernels import moe, moe_group_triton, moe_ref, moe_route_ref, moe_route_triton, moe_triton  # noqa: E402
from jetspec_chat.kernels.moe import choose_block_m, max_blocks  # noqa: E402

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


@pytest.mark.parametrize("t,experts,top_k,block_m", [(1, 8, 2, 16), (13, 8, 2, 16), (40, 6, 3, 16), (9, 128, 8, 32)])
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


@pytest.mark.parametrize(
    "t,hidden,inter,experts,top_k,block_m",
    [(1, 64, 32, 8, 2, None), (6, 80, 48, 6, 3, 16), (21, 64, 32, 16, 4, 32), (3, 128, 96, 128, 8, None)],
)
@pytest.mark.parametrize("norm", [True, False])
def test_moe_matches_reference(t, hidden, inter, experts, top_k, block_m, norm):
    x, router, gate_up, down = weights(t, hidden, inter, experts, seed=hidden + t)
    ref = moe_ref(x, router, gate_up, down, top_k, norm)
    got = moe_triton(x, router, gate_up, down, top_k, norm, block_m=block_m)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def test_strided_input_and_dispatch_on_cpu():
    x, router, gate_up, down = weights(5, 64, 32, 8, seed=3)
    wide = torch.cat([x, x], dim=-1)[:, :64]  # a strided view, as the fused norms hand out
    torch.testing.assert_close(moe_triton(wide, router, gate_up, down, 2, True), moe_ref(x, router, gate_up, down, 2, True),
                               rtol=1e-5, atol=1e-6)
    if not CUDA:
        assert torch.equal(moe(x, router, gate_up, down, 2, True), moe_ref(x, router, gate_up, down, 2, True))


def test_fused_path_reads_nothing_on_the_host():
    """No .item(), nonzero or value-dependent shape anywhere in the wrapper: what lets the block
    live in a CUDA graph (the reference, by contrast, groups with nonzero on the host)."""
    from engine_helpers import NoHostReads

    x, router, gate_up, down = weights(9, 64, 32, 8, seed=4)
    with NoHostReads():
        moe_triton(x, router, gate_up, down, 2, True)
    with pytest.raises(AssertionError, match="on the host"), NoHostReads():
        moe_ref(x, router, gate_up, down, 2, True)


def test_block_m_choice():
    assert choose_block_m(8, 128) == 16  # one AR token: 8 rows over 8 experts
    assert choose_block_m(64 * 8, 128) == 16
    assert choose_block_m(256 * 8, 128) == 32
    assert choose_block_m(1024 * 8, 128) == 64


# ----------------------------------------------------------------------------- GPU, real shapes

QWEN3_30B = dict(hidden=2048, inter=768, experts=128)


def _boundary_ties(x, router, top_k):
    """Tokens whose k-th and (k+1)-th router probabilities tie (bf16 logits tie often): there any
    of the tied experts is a correct pick, so those tokens are left out of the comparison."""
    probs = torch.softmax(F.linear(x, router), dim=-1, dtype=torch.float32).sort(dim=-1, descending=True).values
    return probs[:, top_k - 1] == probs[:, top_k]


@gpu_only
@pytest.mark.parametrize("t", [1, 16, 64, 128, 256, 1024])
def test_gpu_bf16_real_shapes(t):
    x, router, gate_up, down = weights(t, QWEN3_30B["hidden"], QWEN3_30B["inter"], QWEN3_30B["experts"], seed=t,
                                       dtype=torch.bfloat16)
    got = moe_triton(x, router, gate_up, down, 8, True)
    ref = moe_ref(x, router, gate_up, down, 8, True)
    keep = ~_boundary_ties(x, router, 8)
    assert keep.float().mean() > 0.9
    # bf16: the reference adds the 8 experts' rows in bf16 one by one, we sum them in fp32
    torch.testing.assert_close(got[keep].float(), ref[keep].float(), rtol=2e-2, atol=2e-2)
    ref32 = moe_ref(x.float(), router.float(), gate_up.float(), down.float(), 8, True)
    err = (got[keep].float() - ref32[keep]).norm() / ref32[keep].norm()
    assert err < 1e-2, err


@gpu_only
@pytest.mark.parametrize("t", [1, 64, 300])
def test_gpu_fp32_real_shapes(t):
    x, router, gate_up, down = weights(t, QWEN3_30B["hidden"], QWEN3_30B["inter"], QWEN3_30B["experts"], seed=t)
    torch.testing.assert_close(moe_triton(x, router, gate_up, down, 8, True), moe_ref(x, router, gate_up, down, 8, True),
                               rtol=1e-4, atol=1e-5)


@gpu_only
def test_gpu_deterministic_and_captured_in_a_cuda_graph():
    x, router, gate_up, down = weights(128, QWEN3_30B["hidden"], QWEN3_30B["inter"], QWEN3_30B["experts"], seed=5,
                                       dtype=torch.bfloat16)
    eager = moe_triton(x, router, gate_up, down, 8, True)
    assert torch.equal(moe_triton(x, router, gate_up, down, 8, True), eager)  # no atomics: bitwise repeatable
    static_x = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        moe_triton(static_x, router, gate_up, down, 8, True)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe_triton(static_x, router, gate_up, down, 8, True)
    static_x.copy_(x.flip(0))  # other tokens, other routing: the grouping runs on the device
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, moe_triton(x.flip(0), router, gate_up, down, 8, True))

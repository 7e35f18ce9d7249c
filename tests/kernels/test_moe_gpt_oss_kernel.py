"""gpt-oss's options of the fused MoE kernels (kernels/moe.py) against the plain-torch reference
`moe_block_gpt_oss_ref` (transformers' GptOssTopKRouter / GptOssExperts, step by step).

On the CPU under TRITON_INTERPRET=1 with tiny shapes; the real gpt-oss-20b shapes in bf16 run only
on a GPU. The bitwise tests between row counts patch the interpreter's tl.dot to add each
element's products in K order (conftest's `ordered_dot`), the property the GPU's MMA has.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

triton = pytest.importorskip("triton")

from jetspec_chat.kernels import (  # noqa: E402
    moe_block_gpt_oss,
    moe_block_gpt_oss_ref,
    moe_block_gpt_oss_triton,
    moe_route_gpt_oss_ref,
    moe_route_triton,
)
from jetspec_chat.kernels.moe import TILE, MoeTile, router_logits, router_partials, uses_token_path  # noqa: E402
from jetspec_chat.kernels.reference import clamped_swiglu_ref  # noqa: E402
from test_fused_kernels import rtne_bf16  # noqa: E402,F401  (the interpreter's bf16 casts round to nearest)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
gpu_only = pytest.mark.skipif(not CUDA, reason="needs a GPU")

ALPHA, LIMIT = 1.702, 7.0  # gpt-oss-20b's swiglu_alpha / swiglu_limit
SMALL = MoeTile(gate_up_n=16, down_n=32, block_k=32, num_warps=4, num_stages=2)
TOKEN_TILE = dataclasses.replace(SMALL, token_rows=4, token_n=16)
GROUPED = dataclasses.replace(SMALL, token_rows=0)


def weights(t, hidden, inter, experts, seed=0, dtype=torch.float32, device=DEVICE, scale=1.0):
    """x, router weight + bias, gate_up [E, H, 2I] + bias, down [E, I, H] + bias (transformers'
    layout). scale > 1 drives gate/up past the clamp limit."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, hidden, generator=g)
    router = torch.randn(experts, hidden, generator=g) * hidden**-0.5
    router_bias = torch.randn(experts, generator=g) * 0.5
    gate_up = torch.randn(experts, hidden, 2 * inter, generator=g) * hidden**-0.5 * scale
    gate_up_bias = torch.randn(experts, 2 * inter, generator=g) * 0.5
    down = torch.randn(experts, inter, hidden, generator=g) * inter**-0.5
    down_bias = torch.randn(experts, hidden, generator=g) * 0.5
    return [a.to(device=device, dtype=dtype) for a in (x, router, router_bias, gate_up, gate_up_bias, down, down_bias)]


def run(args, top_k, tile=TILE, fn=moe_block_gpt_oss_triton):
    x, router, router_bias, gate_up, gate_up_bias, down, down_bias = args
    if fn is moe_block_gpt_oss_triton:
        return fn(x, router, router_bias, gate_up, gate_up_bias, down, down_bias, top_k, ALPHA, LIMIT, tile=tile)
    return fn(x, router, router_bias, gate_up, gate_up_bias, down, down_bias, top_k, ALPHA, LIMIT)


@pytest.mark.parametrize("t,experts,top_k", [(1, 8, 2), (7, 6, 3), (5, 32, 4), (40, 32, 4)])
def test_route_matches_reference(t, experts, top_k):
    """Router bias, the top-k logits, softmax over those k (fp32)."""
    x, router, router_bias = weights(t, 64, 16, experts, seed=t)[:3]
    routing = moe_route_triton(router_logits(x, router), top_k, False, x.dtype, bias=router_bias, topk_softmax=True)
    w_ref, ids_ref = moe_route_gpt_oss_ref(x, router, router_bias, top_k)
    assert torch.equal(routing.ids.long(), ids_ref)
    torch.testing.assert_close(routing.weights, w_ref, rtol=1e-6, atol=1e-7)


def test_route_of_a_nan_token_picks_real_experts():
    logits = torch.full((1, 8), float("nan"), device=DEVICE)
    routing = moe_route_triton(logits, 4, False, torch.float32, bias=torch.zeros(8, device=DEVICE), topk_softmax=True)
    assert sorted(routing.ids[0].tolist()) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "t,hidden,inter,experts,top_k,tile",
    [
        (1, 64, 32, 8, 2, TILE),  # the per-token path
        (3, 80, 48, 6, 3, TOKEN_TILE),  # ragged N and K tails
        (6, 80, 48, 6, 3, TILE),
        (21, 64, 32, 16, 4, SMALL),  # two grouping programs
        (40, 64, 40, 4, 2, SMALL),  # 20 rows an expert: two blocks each
    ],
)
def test_moe_matches_reference(t, hidden, inter, experts, top_k, tile, checked_pointers):
    args = weights(t, hidden, inter, experts, seed=hidden + t, scale=6.0)
    # the clamp is exercised: some gate/up values pass the limit
    x, _, _, gate_up, gate_up_bias = args[:5]
    assert ((torch.einsum("th,ehn->ten", x, gate_up) + gate_up_bias).abs() > LIMIT).any()
    torch.testing.assert_close(run(args, top_k, tile), run(args, top_k, fn=moe_block_gpt_oss_ref), rtol=1e-5, atol=1e-5)


def test_any_weight_strides():
    """The kernels walk the weights by their strides: a K-contiguous copy (same logical tensors)
    gives the same result."""
    args = weights(9, 64, 32, 8, seed=3)
    x, router, rb, gate_up, gub, down, db = args
    k_major = [gate_up.transpose(1, 2).contiguous().transpose(1, 2), down.transpose(1, 2).contiguous().transpose(1, 2)]
    again = [x, router, rb, k_major[0], gub, k_major[1], db]
    for tile in (TOKEN_TILE, GROUPED):
        want = run(args, 3, tile)
        torch.testing.assert_close(run(again, 3, tile), want, rtol=1e-6, atol=1e-6)


def test_clamped_swiglu_reference_form():
    """The reference's activation, against the formula written out (the kernel's epilogue)."""
    gu = torch.tensor([[8.0, -9.0, -2.0, 3.0, 1.0, 0.5]])
    gate, up = torch.tensor([7.0, -2.0, 1.0]), torch.tensor([-7.0, 3.0, 0.5])
    want = (up + 1) * gate * torch.sigmoid(ALPHA * gate)
    torch.testing.assert_close(clamped_swiglu_ref(gu, ALPHA, LIMIT)[0], want)


def test_dispatch_on_cpu_is_the_reference():
    args = weights(5, 64, 32, 8, seed=1, device="cpu")
    assert torch.equal(run(args, 2, fn=moe_block_gpt_oss), run(args, 2, fn=moe_block_gpt_oss_ref))


def check_batch_invariant(hidden, inter, experts, top_k, many, dtype, tile=TILE, alone=None):
    """Each token alone (an AR step) has the bits of its row among `many` (a verify) and among
    the same tokens shuffled."""
    args = weights(many, hidden, inter, experts, seed=many + hidden, dtype=dtype, scale=4.0)
    together = run(args, top_k, tile)
    order = torch.randperm(many, generator=torch.Generator().manual_seed(1)).to(args[0].device)
    assert torch.equal(run([args[0][order], *args[1:]], top_k, tile), together[order])
    for i in range(many) if alone is None else alone:
        one = run([args[0][i:i + 1], *args[1:]], top_k, tile)
        assert torch.equal(one[0], together[i]), f"token {i}: max |diff| {(one[0].float() - together[i].float()).abs().max()}"


@pytest.mark.parametrize("many", [5, 40])
def test_batch_invariant_bf16(many, rtne_bf16, ordered_dot):
    """bf16, K = 512: the per-token path alone, the grouped path among `many`."""
    check_batch_invariant(512, 128, 8, 2, many, torch.bfloat16, alone=range(0, many, max(1, many // 8)))


def test_token_path_is_the_grouped_path_bitwise(rtne_bf16, ordered_dot):
    args = weights(4, 80, 48, 8, seed=7, dtype=torch.bfloat16, scale=4.0)
    assert uses_token_path(4, 3, args[5], TOKEN_TILE)
    assert torch.equal(run(args, 3, TOKEN_TILE), run(args, 3, GROUPED))


def check_bf16(t, hidden, inter, experts, top_k, tile=TILE):
    """bf16 against the reference on the kernel's own routing (bf16 logits tie often; any of tied
    experts is a right pick) and at least as close to fp32 arithmetic as the reference is."""
    args = weights(t, hidden, inter, experts, seed=t, dtype=torch.bfloat16, scale=4.0)
    x, router, router_bias, gate_up, gate_up_bias, down, down_bias = args
    got = run(args, top_k, tile)
    w_ref, _ = moe_route_gpt_oss_ref(x, router, router_bias, top_k)
    # the block's own routing (router_partials + bias, one rounding), so experts_ref runs its picks
    routing = moe_route_triton(router_partials(x, router), top_k, False, x.dtype, bias=router_bias, topk_softmax=True)
    torch.testing.assert_close(routing.weights.float().sort(-1).values, w_ref.float().sort(-1).values, rtol=2e-2, atol=2e-2)

    def experts_ref(dt):  # the reference's expert loop on the kernel's routing
        w, ids = routing.weights.to(dt), routing.ids.long()
        out = torch.zeros_like(x, dtype=dt)
        for e in ids.unique().tolist():
            token, slot = torch.where(ids == e)
            h = clamped_swiglu_ref(x[token].to(dt) @ gate_up[e].to(dt) + gate_up_bias[e].to(dt), ALPHA, LIMIT)
            h = h @ down[e].to(dt) + down_bias[e].to(dt)
            out.index_add_(0, token, h * w[token, slot, None])
        return out

    # Norms, not elements: an output element is a sum of k experts' rows that may cancel, so a
    # one-ulp difference in a term (the bf16 sigmoid rounded from another fp32 value) can be large
    # against the element. The kernel rounds every step as the reference does and sums the k rows
    # in fp32 (the reference in bf16): as close to fp32 arithmetic as the reference, within noise.
    ref, ref32 = experts_ref(torch.bfloat16), experts_ref(torch.float32)
    assert (got.float() - ref.float()).norm() / ref.float().norm() < 1e-2
    err, ref_err = ((a.float() - ref32).norm() / ref32.norm() for a in (got, ref))
    assert err < 1.25 * ref_err, (err, ref_err)


@pytest.mark.parametrize("t", [1, 13])
def test_bf16_small(t, rtne_bf16):
    check_bf16(t, 64, 32, 16, 4, tile=SMALL)


# ----------------------------------------------------------------------------- GPU, real shapes

GPT_OSS_20B = dict(hidden=2880, inter=2880, experts=32, top_k=4)


@gpu_only
@pytest.mark.parametrize("t", [1, 16, 64, 256, 1024])
def test_gpu_bf16_real_shapes(t):
    check_bf16(t, **GPT_OSS_20B)


@gpu_only
@pytest.mark.parametrize("many", [16, 64, 256])
def test_gpu_bf16_batch_invariant_real_shapes(many):
    check_batch_invariant(**GPT_OSS_20B, many=many, dtype=torch.bfloat16, alone=range(0, many, max(1, many // 16)))


@gpu_only
@pytest.mark.parametrize("t", [1, 64])
def test_gpu_fp32_real_shapes(t):
    args = weights(t, **{k: v for k, v in GPT_OSS_20B.items() if k != "top_k"}, seed=t)
    torch.testing.assert_close(run(args, 4), run(args, 4, fn=moe_block_gpt_oss_ref), rtol=1e-4, atol=1e-4)


@gpu_only
@pytest.mark.parametrize("t", [3, 17])  # the per-token path, the grouped one
def test_gpu_deterministic_and_captured_in_a_cuda_graph(t):
    args = weights(t, **{k: v for k, v in GPT_OSS_20B.items() if k != "top_k"}, seed=5, dtype=torch.bfloat16)
    x = args[0]
    assert torch.equal(run(args, 4), run(args, 4))  # no atomics: bitwise repeatable
    static = [x.clone(), *args[1:]]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(static, 4)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(static, 4)
    static[0].copy_(x.flip(0))  # other tokens, other routing: the routing and grouping run on the device
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, run([x.flip(0), *args[1:]], 4))

"""Gemma 4's options of the fused MoE kernels (kernels/moe.py) against the plain-torch reference
`moe_block_gemma4_ref` (transformers' Gemma4TextRouter / Gemma4TextExperts, step by step).

On the CPU under TRITON_INTERPRET=1 with tiny shapes; the real Gemma 4 26B-A4B shapes in bf16 run
only on a GPU. The bitwise tests between row counts patch the interpreter's tl.dot to add each
element's products in K order (conftest's `ordered_dot`), the property the GPU's MMA has.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

triton = pytest.importorskip("triton")

from jetspec_chat.kernels import (  # noqa: E402
    gelu_tanh_mul_ref,
    moe_block_gemma4,
    moe_block_gemma4_ref,
    moe_block_gemma4_triton,
    moe_route_gemma4_ref,
    moe_route_triton,
)
from jetspec_chat.kernels.moe import TILE, MoeTile, gemma4_router_input, router_logits, router_partials, uses_token_path  # noqa: E402
from test_fused_kernels import rtne_bf16  # noqa: E402,F401  (the interpreter's bf16 casts round to nearest)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
gpu_only = pytest.mark.skipif(not CUDA, reason="needs a GPU")

EPS = 1e-6
SMALL = MoeTile(gate_up_n=16, down_n=32, block_k=32, num_warps=4, num_stages=2)
TOKEN_TILE = dataclasses.replace(SMALL, token_rows=4, token_n=16)
GROUPED = dataclasses.replace(SMALL, token_rows=0)


def weights(t, hidden, inter, experts, seed=0, dtype=torch.float32, device=DEVICE, scale=1.0):
    """x (the experts' input), residual (the router's), router scale [H], proj [E, H],
    per_expert_scale [E], gate_up [E, 2I, H], down [E, H, I] (transformers' layout). The scales
    are drawn away from 1 so that a test sees each of them applied."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, hidden, generator=g)
    residual = torch.randn(t, hidden, generator=g) * 3.0
    router_scale = torch.rand(hidden, generator=g) + 0.5
    proj = torch.randn(experts, hidden, generator=g) * 2.0
    per_expert = torch.rand(experts, generator=g) + 0.5
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) * hidden**-0.5 * scale
    down = torch.randn(experts, hidden, inter, generator=g) * inter**-0.5
    return [a.to(device=device, dtype=dtype) for a in (x, residual, router_scale, proj, per_expert, gate_up, down)]


def run(args, top_k, tile=TILE, fn=moe_block_gemma4_triton):
    if fn is moe_block_gemma4_triton:
        return fn(*args, top_k, EPS, tile=tile)
    return fn(*args, top_k, EPS)


def kernel_routing(args, top_k, group=False):
    """The block's own routing (router_partials of gemma4_router_input, one rounding)."""
    x, residual, router_scale, proj, per_expert = args[:5]
    partials = router_partials(gemma4_router_input(residual, router_scale, EPS), proj)
    return moe_route_triton(partials, top_k, True, x.dtype, group=group, expert_scale=per_expert)


@pytest.mark.parametrize("t,experts,top_k", [(1, 8, 2), (7, 6, 3), (5, 32, 8), (40, 128, 8)])
def test_route_matches_reference(t, experts, top_k):
    """The normed, scaled residual's logits, softmax over all experts, top-k renormalised, each
    times its per-expert scale; the weights stay fp32."""
    x, residual, router_scale, proj, per_expert = weights(t, 64, 16, experts, seed=t)[:5]
    logits = router_logits(gemma4_router_input(residual, router_scale, EPS), proj)
    routing = moe_route_triton(logits, top_k, True, x.dtype, expert_scale=per_expert)
    w_ref, ids_ref = moe_route_gemma4_ref(residual, router_scale, proj, per_expert, top_k, EPS)
    assert routing.weights.dtype == torch.float32
    assert torch.equal(routing.ids.long(), ids_ref)
    torch.testing.assert_close(routing.weights, w_ref, rtol=1e-6, atol=1e-7)


def test_router_input_is_the_references():
    """The reference's steps, composed differently (on the CPU: the same torch arithmetic)."""
    _, residual, router_scale = weights(6, 64, 16, 8, seed=2, dtype=torch.bfloat16, device="cpu")[:3]
    from jetspec_chat.kernels import rms_normalize_ref

    want = rms_normalize_ref(residual, EPS) * router_scale * 64**-0.5
    torch.testing.assert_close(gemma4_router_input(residual, router_scale, EPS), want, rtol=0, atol=0)


@pytest.mark.parametrize(
    "t,hidden,inter,experts,top_k,tile",
    [
        (1, 64, 32, 8, 2, TILE),  # the per-token path
        (3, 80, 48, 6, 3, TOKEN_TILE),  # ragged N and K tails
        (6, 80, 48, 6, 3, TILE),
        (21, 64, 32, 16, 8, SMALL),  # two grouping programs, top-8
        (40, 64, 40, 4, 2, SMALL),  # 20 rows an expert: two blocks each
    ],
)
def test_moe_matches_reference(t, hidden, inter, experts, top_k, tile, checked_pointers):
    args = weights(t, hidden, inter, experts, seed=hidden + t, scale=3.0)
    torch.testing.assert_close(run(args, top_k, tile), run(args, top_k, fn=moe_block_gemma4_ref), rtol=1e-5, atol=1e-5)


def test_gelu_tanh_epilogue_over_its_range():
    """Gate values from -12 to 12 (tanh saturated at both ends, gelu's negative dip) through one
    expert with an identity-like down: the kernel's epilogue against gelu_tanh_mul_ref."""
    hidden, inter = 32, 32
    gate = torch.linspace(-12, 12, inter)
    x = torch.ones(1, hidden)
    gate_up = torch.zeros(1, 2 * inter, hidden)
    gate_up[0, :inter, 0] = gate  # gate column n = gate[n] (x's first element is 1)
    gate_up[0, inter:, 1] = 1.0  # up = 1
    down = torch.eye(hidden, inter)[None]
    args = [x, x.clone(), torch.ones(hidden), torch.zeros(1, hidden), torch.ones(1), gate_up, down]
    got = run([a.to(DEVICE) for a in args], 1)
    want = gelu_tanh_mul_ref(gate, torch.ones(inter))
    torch.testing.assert_close(got[0].cpu(), want, rtol=1e-6, atol=1e-6)


def test_dispatch_on_cpu_is_the_reference():
    args = weights(5, 64, 32, 8, seed=1, device="cpu")
    assert torch.equal(run(args, 2, fn=moe_block_gemma4), run(args, 2, fn=moe_block_gemma4_ref))


def check_batch_invariant(hidden, inter, experts, top_k, many, dtype, tile=TILE, alone=None):
    """Each token alone (an AR step) has the bits of its row among `many` (a verify) and among
    the same tokens shuffled."""
    args = weights(many, hidden, inter, experts, seed=many + hidden, dtype=dtype, scale=4.0)
    together = run(args, top_k, tile)
    order = torch.randperm(many, generator=torch.Generator().manual_seed(1)).to(args[0].device)
    assert torch.equal(run([args[0][order], args[1][order], *args[2:]], top_k, tile), together[order])
    for i in range(many) if alone is None else alone:
        one = run([args[0][i:i + 1], args[1][i:i + 1], *args[2:]], top_k, tile)
        assert torch.equal(one[0], together[i]), f"token {i}: max |diff| {(one[0].float() - together[i].float()).abs().max()}"


@pytest.mark.parametrize("many", [5, 40])
def test_batch_invariant_bf16(many, rtne_bf16, ordered_dot):
    """bf16, K = 512: the per-token path alone, the grouped path among `many`."""
    check_batch_invariant(512, 128, 8, 2, many, torch.bfloat16, alone=range(0, many, max(1, many // 8)))


def test_token_path_is_the_grouped_path_bitwise(rtne_bf16, ordered_dot):
    args = weights(4, 80, 48, 8, seed=7, dtype=torch.bfloat16, scale=4.0)
    assert uses_token_path(4, 3, args[6], TOKEN_TILE)
    assert torch.equal(run(args, 3, TOKEN_TILE), run(args, 3, GROUPED))


def check_bf16(t, hidden, inter, experts, top_k, tile=TILE):
    """bf16 against the reference on the kernel's own routing (bf16 logits tie often; any of tied
    experts is a right pick) and at least as close to fp32 arithmetic as the reference is."""
    args = weights(t, hidden, inter, experts, seed=t, dtype=torch.bfloat16, scale=4.0)
    x, residual, router_scale, proj, per_expert, gate_up, down = args
    got = run(args, top_k, tile)
    w_ref, _ = moe_route_gemma4_ref(residual, router_scale, proj, per_expert, top_k, EPS)
    routing = kernel_routing(args, top_k)
    torch.testing.assert_close(routing.weights.sort(-1).values, w_ref.sort(-1).values, rtol=2e-2, atol=2e-2)

    def experts_ref(dt):  # the reference's expert loop on the kernel's routing
        w, ids = routing.weights, routing.ids.long()
        out = torch.zeros_like(x, dtype=dt)
        for e in ids.unique().tolist():
            token, slot = torch.where(ids == e)
            gu = x[token].to(dt) @ gate_up[e].to(dt).T
            h = gelu_tanh_mul_ref(gu[:, :inter], gu[:, inter:]) @ down[e].to(dt).T
            out.index_add_(0, token, (h * w[token, slot, None]).to(dt))
        return out

    # Norms, not elements (an output element is a sum of k experts' rows that may cancel): the
    # kernel rounds every step as the reference does and sums the k rows in fp32 (the reference
    # in bf16): as close to fp32 arithmetic as the reference, within noise.
    ref, ref32 = experts_ref(torch.bfloat16), experts_ref(torch.float32)
    assert (got.float() - ref.float()).norm() / ref.float().norm() < 1e-2
    err, ref_err = ((a.float() - ref32).norm() / ref32.norm() for a in (got, ref))
    assert err < 1.25 * ref_err, (err, ref_err)


@pytest.mark.parametrize("t", [1, 13])
def test_bf16_small(t, rtne_bf16):
    check_bf16(t, 64, 32, 16, 4, tile=SMALL)


# ----------------------------------------------------------------------------- GPU, real shapes

# google/gemma-4-26B-A4B-it's text model (engine/models/configs/google--gemma-4-26B-A4B-it.json)
GEMMA4_26B = dict(hidden=2816, inter=704, experts=128, top_k=8)


@gpu_only
@pytest.mark.parametrize("t", [1, 16, 64, 256, 1024])
def test_gpu_bf16_real_shapes(t):
    check_bf16(t, **GEMMA4_26B)


@gpu_only
@pytest.mark.parametrize("many", [16, 64, 256])
def test_gpu_bf16_batch_invariant_real_shapes(many):
    check_batch_invariant(**GEMMA4_26B, many=many, dtype=torch.bfloat16, alone=range(0, many, max(1, many // 16)))


@gpu_only
@pytest.mark.parametrize("t", [1, 64])
def test_gpu_fp32_real_shapes(t):
    args = weights(t, **{k: v for k, v in GEMMA4_26B.items() if k != "top_k"}, seed=t)
    torch.testing.assert_close(run(args, 8), run(args, 8, fn=moe_block_gemma4_ref), rtol=1e-4, atol=1e-4)


@gpu_only
@pytest.mark.parametrize("t", [3, 17])  # the per-token path, the grouped one
def test_gpu_deterministic_and_captured_in_a_cuda_graph(t):
    args = weights(t, **{k: v for k, v in GEMMA4_26B.items() if k != "top_k"}, seed=5, dtype=torch.bfloat16)
    x, residual = args[:2]
    assert torch.equal(run(args, 8), run(args, 8))  # no atomics: bitwise repeatable
    static = [x.clone(), residual.clone(), *args[2:]]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(static, 8)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(static, 8)
    static[0].copy_(x.flip(0))  # other tokens, other routing: the routing and grouping run on the device
    static[1].copy_(residual.flip(0))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, run([x.flip(0), residual.flip(0), *args[2:]], 8))

"""Fused elementwise kernels (kernels/fused.py) against their torch references, and the
references against the engine's eager code in engine/layers.py.

On a CPU-only machine the Triton kernels run under TRITON_INTERPRET=1 (set by conftest.py), so
shapes stay small. The interpreter truncates fp32 -> bf16 casts instead of rounding them to
nearest even as the GPU does, so the CPU bf16 tests patch that one conversion (see
`rtne_bf16`); the big bf16 shapes and the CUDA-graph check run only on a GPU.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")

from jetspec_chat.engine.layers import MLP, AttentionWeights, RMSNorm, Rotary  # noqa: E402
from jetspec_chat.kernels import (  # noqa: E402
    add_rms_norm,
    add_rms_norm_ref,
    add_rms_norm_triton,
    qk_norm_rope,
    qk_norm_rope_ref,
    qk_norm_rope_triton,
    rms_norm,
    rms_norm_ref,
    rms_norm_triton,
    rope_ref,
    silu_mul,
    silu_mul_ref,
    silu_mul_triton,
)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
gpu_only = pytest.mark.skipif(not CUDA, reason="needs a GPU")
# exp(-gate) overflows to inf on purpose for very negative gates (silu -> -0, as in torch).
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
EPS = 1e-6
F32_TOL = dict(rtol=1e-6, atol=0.0)


# ----------------------------------------------------------------------------- helpers


@pytest.fixture
def rtne_bf16(monkeypatch):
    """Make the interpreter's fp32 -> bf16 cast round to nearest even, as the GPU's cvt.rn does
    (the interpreter truncates). Only the interpreter's conversion helper is replaced."""
    if CUDA:
        pytest.skip("GPU: bf16 is tested natively")
    interp = pytest.importorskip("triton.runtime.interpreter")
    tl = pytest.importorskip("triton.language")
    original = getattr(interp, "_convert_float", None)
    if original is None:
        pytest.skip("this triton's interpreter has no _convert_float")

    def convert(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16:
            f = torch.from_numpy(np.ascontiguousarray(data).view(np.float32).copy())
            return f.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        return original(data, src, dst, rounding_mode)

    monkeypatch.setattr(interp, "_convert_float", convert)


def randn(*shape, seed, dtype=torch.float32, scale=1.0, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)


def norm_weight(h, seed, dtype=torch.float32, device=DEVICE):
    """Around 1 like trained norm weights, but never exactly 1 (so the product is exercised)."""
    return (1.0 + 0.3 * randn(h, seed=seed, device="cpu")).to(device=device, dtype=dtype)


def cos_sin(t, head_dim, dtype=torch.float32, start=0, theta=1e6, device=DEVICE):
    rot = Rotary(head_dim, theta).to(device)
    positions = torch.arange(start, start + t, device=device)
    return rot.cos_sin(positions, dtype)  # [T, 1, D] each


def strided_rows(t, h, seed, dtype=torch.float32, pad=37):
    """[T, H] view with row stride H + pad (as a slice of a fused projection would be)."""
    base = randn(t, h + pad, seed=seed, dtype=dtype)
    view = base[:, pad // 2 : pad // 2 + h]
    assert not view.is_contiguous()
    return view


def bf16_close(out, ref, *, min_equal=0.98):
    """Within two bf16 roundings of the row's largest value, and mostly bit-identical. A one-ulp
    difference in a norm's output (fp32 sum order) becomes two after RoPE's bf16 multiply-add,
    and RoPE's x*cos - y*sin can cancel to a small result that keeps the operands' absolute error
    (seen on an H100, Qwen3-8B shapes: 0.0078 at 0.94; at T=1024, 0.0078 on a result of 0.026)."""
    assert out.dtype == ref.dtype == torch.bfloat16 and out.shape == ref.shape
    o, r = out.float(), ref.float()
    scale = r.abs().amax(dim=-1, keepdim=True)
    bad = (o - r).abs() > 2**-6 * r.abs() + 2**-7 * scale
    assert not bad.any(), f"{int(bad.sum())} elements off by more than two roundings; max diff {(o - r).abs().max()}"
    assert (out == ref).float().mean().item() >= min_equal


# ----------------------------------------------------------------------------- references = engine


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 896), (5, 96), (3, 4, 64)])
def test_rms_norm_ref_is_engine_rmsnorm(dtype, shape):
    h = shape[-1]
    mod = RMSNorm(h, EPS).to(dtype)
    with torch.no_grad():
        mod.weight.copy_(norm_weight(h, 1, device="cpu"))
    x = randn(*shape, seed=2, dtype=dtype, device="cpu")
    out = rms_norm_ref(x, mod.weight, EPS)
    assert torch.equal(out, mod(x))
    assert torch.equal(rms_norm(x, mod.weight, EPS), mod(x))  # CPU dispatch = reference
    # add + norm: the engine's `h = h + o; y = norm(h)`.
    resid, o = randn(*shape, seed=3, dtype=dtype, device="cpu"), x
    y, new_h = add_rms_norm_ref(o, resid, mod.weight, EPS)
    h_engine = resid + o
    assert torch.equal(new_h, h_engine) and torch.equal(y, mod(h_engine))
    y2, h2 = add_rms_norm(o, resid, mod.weight, EPS)
    assert torch.equal(y2, y) and torch.equal(h2, new_h)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_ref_is_engine_mlp(dtype):
    torch.manual_seed(0)
    mlp = MLP(64, 160).to(dtype)
    x = randn(7, 64, seed=4, dtype=dtype, device="cpu")
    gate, up = mlp.gate_up_proj(x).chunk(2, dim=-1)  # strided halves, as MLP.forward passes them
    assert torch.equal(mlp.down_proj(silu_mul_ref(gate, up)), mlp(x))
    assert torch.equal(silu_mul(gate, up), silu_mul_ref(gate, up))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("qk_norm", [True, False])
def test_qk_norm_rope_ref_is_engine_attention(dtype, qk_norm):
    """project_q / project_kv + Rotary.apply (TargetModel.forward, DraftHead) == the reference."""
    torch.manual_seed(0)
    hidden, n_heads, n_kv, d, t = 96, 6, 2, 16, 5
    attn = AttentionWeights(hidden, n_heads, n_kv, d, bias=True, qk_norm=qk_norm, eps=EPS).to(dtype)
    if qk_norm:
        with torch.no_grad():
            attn.q_norm.weight.copy_(norm_weight(d, 5, device="cpu"))
            attn.k_norm.weight.copy_(norm_weight(d, 6, device="cpu"))
    x = randn(t, hidden, seed=7, dtype=dtype, device="cpu")
    cos, sin = cos_sin(t, d, dtype, start=1000, device="cpu")
    q_engine = Rotary.apply(attn.project_q(x), cos, sin)
    k_engine, _ = attn.project_kv(x)
    k_engine = Rotary.apply(k_engine, cos, sin)
    q_raw, k_raw, _ = attn.qkv_proj(x).split([n_heads * d, n_kv * d, n_kv * d], dim=-1)  # strided views
    q_raw, k_raw = q_raw.view(t, n_heads, d), k_raw.view(t, n_kv, d)
    qw = attn.q_norm.weight if qk_norm else None
    kw = attn.k_norm.weight if qk_norm else None
    for c, s in ((cos, sin), (cos[:, 0], sin[:, 0])):  # [T, 1, D] and [T, D]
        q_out, k_out = qk_norm_rope_ref(q_raw, k_raw, qw, kw, c, s, EPS)
        assert torch.equal(q_out, q_engine) and torch.equal(k_out, k_engine)
        q_out, k_out = qk_norm_rope(q_raw, k_raw, qw, kw, c, s, EPS)
        assert torch.equal(q_out, q_engine) and torch.equal(k_out, k_engine)
    assert torch.equal(rope_ref(q_raw, cos, sin), Rotary.apply(q_raw, cos, sin))
    # One operand only (the draft head's context K).
    q_none, k_only = qk_norm_rope_ref(None, k_raw, None, kw, cos, sin, EPS)
    assert q_none is None and torch.equal(k_only, k_engine)


# ----------------------------------------------------------------------------- rms_norm (fp32)

# (T, H, block): Qwen2.5-0.5B / 1.5B hidden sizes (896 / 1536, not powers of two), the chunked
# loop (block < H, ragged last chunk) and a row longer than the single-block limit.
NORM_CASES = [
    (1, 896, None),
    (3, 1536, None),
    (17, 896, None),
    (64, 96, None),
    (3, 896, 256),     # 4 chunks, the last one ragged
    (1, 4096, None),   # Qwen3-8B hidden
    (1, 8320, None),   # > MAX_SINGLE_BLOCK: default chunked path
]


@pytest.mark.parametrize("t,h,block", NORM_CASES)
def test_rms_norm_triton(t, h, block, poisoned_alloc):
    x = randn(t, h, seed=t * 7 + h, scale=3.0)
    w = norm_weight(h, seed=h)
    out = rms_norm_triton(x, w, EPS, block=block)
    assert out.shape == x.shape and out.dtype == x.dtype and out.is_contiguous()
    torch.testing.assert_close(out, rms_norm_ref(x, w, EPS), **F32_TOL)


@pytest.mark.parametrize("t,h,block", NORM_CASES)
def test_add_rms_norm_triton(t, h, block, poisoned_alloc):
    x = randn(t, h, seed=t + h, scale=0.5)
    resid = randn(t, h, seed=t + h + 1, scale=4.0)
    w = norm_weight(h, seed=h + 2)
    y, new_resid = add_rms_norm_triton(x, resid, w, EPS, block=block)
    y_ref, resid_ref = add_rms_norm_ref(x, resid, w, EPS)
    assert torch.equal(new_resid, resid_ref)  # a plain fp32 add: bit-identical
    torch.testing.assert_close(y, y_ref, **F32_TOL)


@pytest.mark.parametrize("block", [None, 128])
def test_norms_strided_and_3d(block, poisoned_alloc):
    t, h = 17, 896
    x = strided_rows(t, h, seed=11)
    resid = strided_rows(t, h, seed=12, pad=5)
    w = norm_weight(h, seed=13)
    torch.testing.assert_close(rms_norm_triton(x, w, EPS, block=block), rms_norm_ref(x, w, EPS), **F32_TOL)
    y, new_resid = add_rms_norm_triton(x, resid, w, EPS, block=block)
    y_ref, resid_ref = add_rms_norm_ref(x, resid, w, EPS)
    assert torch.equal(new_resid, resid_ref)
    torch.testing.assert_close(y, y_ref, **F32_TOL)
    # [T, heads, D]: a per-head norm through the generic row kernel.
    x3 = randn(3, 5, 64, seed=14)
    w3 = norm_weight(64, seed=15)
    out3 = rms_norm_triton(x3, w3, EPS, block=block)
    assert out3.shape == x3.shape
    torch.testing.assert_close(out3, rms_norm_ref(x3, w3, EPS), **F32_TOL)


def test_norms_empty_rows():
    w = norm_weight(64, seed=0)
    assert rms_norm_triton(torch.empty(0, 64, device=DEVICE), w, EPS).shape == (0, 64)
    y, h = add_rms_norm_triton(torch.empty(0, 64, device=DEVICE), torch.empty(0, 64, device=DEVICE), w, EPS)
    assert y.shape == h.shape == (0, 64)


# ----------------------------------------------------------------------------- silu_mul (fp32)


def gate_values(t, i, seed):
    """Wide-ranging gates, incl. exp over/underflow territory and exact zeros."""
    g = randn(t, i, seed=seed, scale=6.0)
    flat = g.view(-1)
    extremes = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 20.0, -20.0, 87.0, -87.0, 95.0, -95.0, -200.0, 200.0])
    n = min(flat.numel(), extremes.numel())
    flat[:n] = extremes[:n].to(flat.device)
    return g


@pytest.mark.parametrize("t,i", [(1, 4864), (3, 1000), (17, 896), (64, 72)])
def test_silu_mul_triton(t, i, poisoned_alloc):
    gate = gate_values(t, i, seed=t + i)
    up = randn(t, i, seed=t + i + 1)
    out = silu_mul_triton(gate, up)
    assert out.shape == gate.shape and out.dtype == gate.dtype
    torch.testing.assert_close(out, silu_mul_ref(gate, up), rtol=1e-6, atol=1e-37)


def test_silu_mul_strided_fused_gate_up(poisoned_alloc):
    """gate/up as the two halves of a fused [T, 2I] projection (row stride 2I)."""
    t, i = 5, 1000
    gu = randn(t, 2 * i, seed=21, scale=4.0)
    gate, up = gu[:, :i], gu[:, i:]
    out = silu_mul_triton(gate, up, block=256)
    torch.testing.assert_close(out, silu_mul_ref(gate, up), rtol=1e-6, atol=1e-37)
    assert silu_mul_triton(torch.empty(0, 8, device=DEVICE), torch.empty(0, 8, device=DEVICE)).shape == (0, 8)


# ----------------------------------------------------------------------------- qk_norm_rope (fp32)

# (T, Hq, Hk, D, heads_per_program): Qwen2.5-0.5B (14/2 x 64), 1.5B (12/2 x 64),
# Qwen3-8B (32/8 x 128), Gemma 4's global heads (512), small test heads (16/32), one and several
# heads per program.
ROPE_CASES = [
    (1, 14, 2, 64, 1),      # 1 head per program: the default, whatever T (batch invariance)
    (3, 12, 2, 64, 1),
    (17, 4, 1, 32, 1),
    (64, 6, 2, 16, 4),      # 4 heads per program, a partial head block
    (1, 32, 8, 128, 1),
    (3, 14, 2, 64, 4),
    (5, 3, 3, 16, 2),
    (2, 2, 1, 512, 1),
]


def qk_inputs(t, hq, hk, d, seed, dtype=torch.float32, fused=False):
    """q [T, Hq, D], k [T, Hk, D]: contiguous, or strided views of one fused qkv projection."""
    if fused:
        qkv = randn(t, (hq + 2 * hk) * d, seed=seed, dtype=dtype, scale=2.0)
        q = qkv[:, : hq * d].view(t, hq, d)
        k = qkv[:, hq * d : (hq + hk) * d].view(t, hk, d)
        assert not q.is_contiguous() or t == 1
        return q, k
    return randn(t, hq, d, seed=seed, dtype=dtype, scale=2.0), randn(t, hk, d, seed=seed + 1, dtype=dtype, scale=2.0)


@pytest.mark.parametrize("t,hq,hk,d,heads", ROPE_CASES)
def test_qk_norm_rope_triton(t, hq, hk, d, heads, poisoned_alloc):
    q, k = qk_inputs(t, hq, hk, d, seed=t * 13 + d)
    qw, kw = norm_weight(d, seed=1), norm_weight(d, seed=2)
    cos, sin = cos_sin(t, d, start=4000 + t)
    q_out, k_out = qk_norm_rope_triton(q, k, qw, kw, cos, sin, EPS, heads_per_program=heads)
    q_ref, k_ref = qk_norm_rope_ref(q, k, qw, kw, cos, sin, EPS)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    # The norm's scale can differ by an ulp (sum order); RoPE's add can cancel, hence the atol.
    torch.testing.assert_close(q_out, q_ref, rtol=1e-6, atol=2e-6)
    torch.testing.assert_close(k_out, k_ref, rtol=1e-6, atol=2e-6)
    # Without the norm (Llama / Qwen2) RoPE is the same arithmetic as torch: bit-identical.
    q_out, k_out = qk_norm_rope_triton(q, k, None, None, cos, sin, EPS, heads_per_program=heads)
    q_ref, k_ref = qk_norm_rope_ref(q, k, None, None, cos, sin, EPS)
    assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)


def test_qk_norm_rope_strided_and_partial(poisoned_alloc):
    t, hq, hk, d = 17, 14, 2, 64
    q, k = qk_inputs(t, hq, hk, d, seed=31, fused=True)
    qw, kw = norm_weight(d, seed=3), norm_weight(d, seed=4)
    cos, sin = cos_sin(t, d, start=123)
    c2, s2 = cos[:, 0], sin[:, 0]  # [T, D]
    q_out, k_out = qk_norm_rope_triton(q, k, qw, kw, c2, s2, EPS, heads_per_program=4)
    q_ref, k_ref = qk_norm_rope_ref(q, k, qw, kw, cos, sin, EPS)
    assert q_out.is_contiguous() and k_out.is_contiguous()
    torch.testing.assert_close(q_out, q_ref, rtol=1e-6, atol=2e-6)
    torch.testing.assert_close(k_out, k_ref, rtol=1e-6, atol=2e-6)
    # K only (draft context_kv), norm on K only, and Q only.
    q_none, k_only = qk_norm_rope_triton(None, k, None, kw, cos, sin, EPS)
    assert q_none is None
    torch.testing.assert_close(k_only, k_ref, rtol=1e-6, atol=2e-6)
    q_only, k_none = qk_norm_rope_triton(q, None, None, None, cos, sin, EPS)
    assert k_none is None and torch.equal(q_only, qk_norm_rope_ref(q, None, None, None, cos, sin, EPS)[0])
    # One cos/sin row for every token (broadcast).
    q_out, _ = qk_norm_rope_triton(q, k, qw, kw, cos[:1], sin[:1], EPS)
    q_ref, _ = qk_norm_rope_ref(q, k, qw, kw, cos[:1], sin[:1], EPS)
    torch.testing.assert_close(q_out, q_ref, rtol=1e-6, atol=2e-6)


# ----------------------------------------------------------------------------- bf16 on the interpreter


def test_bf16_interpreter_with_rtne(rtne_bf16, poisoned_alloc):
    """The kernels' bf16 rounding steps mirror torch's: bit-identical here except for rare
    one-ulp differences of the norms (fp32 sum order)."""
    bf = torch.bfloat16
    for t, h, block in ((1, 896, None), (17, 1536, None), (3, 896, 256)):
        x, resid = randn(t, h, seed=h, dtype=bf), randn(t, h, seed=h + 1, dtype=bf, scale=3.0)
        w = norm_weight(h, seed=h + 2, dtype=bf)
        bf16_close(rms_norm_triton(x, w, EPS, block=block), rms_norm_ref(x, w, EPS))
        y, new_resid = add_rms_norm_triton(x, resid, w, EPS, block=block)
        y_ref, resid_ref = add_rms_norm_ref(x, resid, w, EPS)
        assert torch.equal(new_resid, resid_ref)
        bf16_close(y, y_ref)
    gate, up = gate_values(17, 1000, seed=5).to(bf), randn(17, 1000, seed=6, dtype=bf)
    assert torch.equal(silu_mul_triton(gate, up), silu_mul_ref(gate, up))
    t, hq, hk, d = 17, 14, 2, 64
    q, k = qk_inputs(t, hq, hk, d, seed=7, dtype=bf, fused=True)
    qw, kw = norm_weight(d, seed=8, dtype=bf), norm_weight(d, seed=9, dtype=bf)
    cos, sin = cos_sin(t, d, bf, start=3000)
    q_out, k_out = qk_norm_rope_triton(q, k, qw, kw, cos, sin, EPS, heads_per_program=4)
    q_ref, k_ref = qk_norm_rope_ref(q, k, qw, kw, cos, sin, EPS)
    bf16_close(q_out, q_ref, min_equal=0.95)
    bf16_close(k_out, k_ref, min_equal=0.95)
    q_out, k_out = qk_norm_rope_triton(q, k, None, None, cos, sin, EPS, heads_per_program=4)
    q_ref, k_ref = qk_norm_rope_ref(q, k, None, None, cos, sin, EPS)
    assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)


# ----------------------------------------------------------------------------- GPU only


@gpu_only
@pytest.mark.parametrize("t", [1, 3, 64, 1024])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_qwen3_8b_shapes(t, dtype, poisoned_alloc):
    """Qwen3-8B: hidden 4096, intermediate 12288, 32 / 8 heads x 128; the dispatchers take Triton."""
    h, inter, hq, hk, d = 4096, 12288, 32, 8, 128
    x, resid = randn(t, h, seed=1, dtype=dtype), randn(t, h, seed=2, dtype=dtype, scale=4.0)
    w = norm_weight(h, seed=3, dtype=dtype)

    def close(out, ref, exact=False):
        if exact:
            assert torch.equal(out, ref)
        elif dtype == torch.bfloat16:
            bf16_close(out, ref)
        else:
            torch.testing.assert_close(out, ref, rtol=1e-6, atol=2e-6)

    assert torch.equal(rms_norm(x, w, EPS), rms_norm_triton(x, w, EPS))
    close(rms_norm(x, w, EPS), rms_norm_ref(x, w, EPS))
    y, new_resid = add_rms_norm(x, resid, w, EPS)
    y_ref, resid_ref = add_rms_norm_ref(x, resid, w, EPS)
    close(new_resid, resid_ref, exact=True)
    close(y, y_ref)
    gu = randn(t, 2 * inter, seed=4, dtype=dtype, scale=4.0)
    gate, up = gu[:, :inter], gu[:, inter:]
    # Same CUDA expf and IEEE division as torch's silu, same roundings: bit-identical.
    close(silu_mul(gate, up), silu_mul_ref(gate, up), exact=True)
    q, k = qk_inputs(t, hq, hk, d, seed=5, dtype=dtype, fused=True)
    qw, kw = norm_weight(d, seed=6, dtype=dtype), norm_weight(d, seed=7, dtype=dtype)
    cos, sin = cos_sin(t, d, dtype, start=30000)
    q_out, k_out = qk_norm_rope(q, k, qw, kw, cos, sin, EPS)
    q_ref, k_ref = qk_norm_rope_ref(q, k, qw, kw, cos, sin, EPS)
    close(q_out, q_ref)
    close(k_out, k_ref)
    q_out, k_out = qk_norm_rope(q, k, None, None, cos, sin, EPS)
    q_ref, k_ref = qk_norm_rope_ref(q, k, None, None, cos, sin, EPS)
    close(q_out, q_ref, exact=True)
    close(k_out, k_ref, exact=True)


@gpu_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_small_model_shapes(dtype):
    """Qwen2.5-0.5B / 1.5B shapes (896 / 1536 hidden, 14 / 12 heads, 2 kv heads, head_dim 64)."""
    for h, inter, hq in ((896, 4864, 14), (1536, 8960, 12)):
        for t in (1, 17, 300):
            x, resid = randn(t, h, seed=h + t, dtype=dtype), randn(t, h, seed=h - t, dtype=dtype)
            w = norm_weight(h, seed=t, dtype=dtype)
            y, new_resid = add_rms_norm(x, resid, w, EPS)
            y_ref, resid_ref = add_rms_norm_ref(x, resid, w, EPS)
            assert torch.equal(new_resid, resid_ref)
            if dtype == torch.bfloat16:
                bf16_close(y, y_ref)
            else:
                torch.testing.assert_close(y, y_ref, **F32_TOL)
            gate, up = randn(t, inter, seed=1, dtype=dtype, scale=4.0), randn(t, inter, seed=2, dtype=dtype)
            assert torch.equal(silu_mul(gate, up), silu_mul_ref(gate, up))
            q, k = qk_inputs(t, hq, 2, 64, seed=t, dtype=dtype, fused=True)
            cos, sin = cos_sin(t, 64, dtype, start=t)
            q_out, k_out = qk_norm_rope(q, k, None, None, cos, sin, EPS)
            q_ref, k_ref = qk_norm_rope_ref(q, k, None, None, cos, sin, EPS)
            assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)


@gpu_only
def test_gpu_cuda_graph_capture():
    """All four kernels captured in one CUDA graph, replayed on new inputs, match eager runs."""
    dtype, t, h, inter, hq, hk, d = torch.bfloat16, 4, 1024, 2048, 8, 2, 128
    x, resid = randn(t, h, seed=1, dtype=dtype), randn(t, h, seed=2, dtype=dtype)
    w = norm_weight(h, seed=3, dtype=dtype)
    gate, up = randn(t, inter, seed=4, dtype=dtype), randn(t, inter, seed=5, dtype=dtype)
    q, k = randn(t, hq, d, seed=6, dtype=dtype), randn(t, hk, d, seed=7, dtype=dtype)
    qw, kw = norm_weight(d, seed=8, dtype=dtype), norm_weight(d, seed=9, dtype=dtype)
    cos, sin = cos_sin(t, d, dtype, start=100)
    inputs = (x, resid, gate, up, q, k, cos, sin)

    def step():
        return (rms_norm(x, w, EPS), *add_rms_norm(x, resid, w, EPS), silu_mul(gate, up),
                *qk_norm_rope(q, k, qw, kw, cos, sin, EPS))

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    for seed in (10, 20):
        for i, buf in enumerate(inputs):
            buf.copy_(randn(*buf.shape, seed=seed + i, dtype=dtype))
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(static_out, step()):
            assert torch.equal(got, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_training_gets_gradients_through_the_dispatchers():
    """The Triton kernels have no backward: with parameters that need grad (train-head on a GPU)
    the dispatchers must take the differentiable torch references."""
    from jetspec_chat.kernels import rms_norm, silu_mul

    w = torch.ones(64, device="cuda", requires_grad=True)
    x = torch.randn(4, 64, device="cuda", requires_grad=True)
    (silu_mul(rms_norm(x, w, 1e-6), x).sum()).backward()
    assert w.grad is not None and x.grad is not None and torch.isfinite(x.grad).all()

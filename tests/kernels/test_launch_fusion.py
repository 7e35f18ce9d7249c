"""The split linear's group sum folded into its consumer: add_rms_norm
and qkv_rope_write take a split launch's `Partials` and add them as they load. Each must give
bitwise what the two-step path gives (linear_triton's group-sum pass, then the consumer on its
output), and so stay M-invariant: a row at M=1 (split, partials) equals the same row inside a
large M (fused launch, bf16 output).

On the CPU the kernels run under TRITON_INTERPRET=1 (conftest.py) at small shapes and a small
linear config (3 K groups), where both paths are the same numpy operations in the same order:
bitwise too. The sm_90 compile test pins what makes that hold on the GPU, where the norms reduce
in parallel: the partials variant reduces in the same register layout as the plain one. The real
shapes (Qwen2.5-1.5B: qkv bias; Qwen3-8B: q/k norm) run on a GPU only.
"""
from __future__ import annotations


import pytest
import torch

triton = pytest.importorskip("triton")

from test_fused_kernels import bf16_close, rtne_bf16  # noqa: E402,F401
from sm90 import run_compile_script  # noqa: E402

from jetspec_chat.kernels import (  # noqa: E402
    Partials,
    add_rms_norm,
    add_rms_norm_ref,
    add_rms_norm_triton,
    linear_partials_triton,
    linear_ref,
    linear_triton,
    qk_norm_rope_triton,
    qkv_rope_write,
    qkv_rope_write_ref,
    qkv_rope_write_triton,
    write_kv_triton,
)
from jetspec_chat.kernels.matmul import LinearConfig, choose_config, use_split  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
gpu_only = pytest.mark.skipif(not CUDA, reason="needs a GPU")
EPS = 1e-6
BF = torch.bfloat16
SMALL = LinearConfig(block_n=32, block_k=32, groups=3)  # K=192: 3 groups of 2 blocks
BLOCK = 16  # KV cache block size


def randn(*shape, seed, dtype=BF, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(device=DEVICE, dtype=dtype)


def norm_weight(n, seed, dtype=BF):
    return (1.0 + 0.3 * randn(n, seed=seed, dtype=torch.float32)).to(dtype)


def cos_sin(t, d, start, dtype=BF):
    from jetspec_chat.engine.layers import Rotary

    rot = Rotary(d, 1e6).to(DEVICE)
    return rot.cos_sin(torch.arange(start, start + t, device=DEVICE), dtype)


def pools(n_slots, n_kv, d, dtype=BF):
    """Fresh (zeroed) k/v pools of whole blocks: [blocks, BLOCK, n_kv, d]."""
    blocks = -(-n_slots // BLOCK)
    return (torch.zeros(blocks, BLOCK, n_kv, d, device=DEVICE, dtype=dtype),
            torch.zeros(blocks, BLOCK, n_kv, d, device=DEVICE, dtype=dtype))


def two_step_add_rms_norm(x, w, b, resid, nw, **linear_kw):
    """Before the fusion: the linear (group-sum pass included), then add_rms_norm on its output."""
    return add_rms_norm_triton(linear_triton(x, w, b, **linear_kw), resid, nw, EPS)


def two_step_qkv(x, w, b, heads, kv, qn, kn, cos, sin, k_pool, v_pool, slots, **linear_kw):
    """Before the fusion: the qkv linear, qk_norm_rope on its q/k views, write_kv of k and v."""
    t, d = x.shape[0], w.shape[0] // (heads + 2 * kv)
    q, k, v = linear_triton(x, w, b, **linear_kw).split([heads * d, kv * d, kv * d], dim=-1)
    q, k = qk_norm_rope_triton(q.view(t, heads, d), k.view(t, kv, d), qn, kn, cos, sin, EPS)
    write_kv_triton(k_pool, v_pool, slots, k, v.view(t, kv, d))
    return q


# ----------------------------------------------------------------------------- CPU (interpreter) and GPU


@pytest.mark.parametrize("bias", [False, True])
def test_partials_sum_is_the_group_sum_pass(bias, rtne_bf16):
    """Partials.sum() (torch) is the split launch's output, and so the fused launch's, bitwise."""
    x, w = randn(5, 192, seed=1), randn(80, 192, seed=2, scale=192**-0.5)
    b = randn(80, seed=3) if bias else None
    p = linear_partials_triton(x, w, b, config=SMALL, split=True)
    assert isinstance(p, Partials) and p.groups.shape == (3, 5, 80) and p.shape == (5, 80)
    assert torch.equal(p.sum(), linear_triton(x, w, b, config=SMALL, split=True))
    assert torch.equal(p.sum(), linear_triton(x, w, b, config=SMALL, split=False))
    # No split: the output itself (what the consumers also take).
    y = linear_partials_triton(x, w, b, config=SMALL, split=False)
    assert isinstance(y, torch.Tensor) and torch.equal(y, p.sum())


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("block", [None, 32])  # one chunk; three (the two-pass loop, ragged)
def test_add_rms_norm_partials_bitwise(bias, block, poisoned_alloc):
    """add_rms_norm on Partials == the group-sum pass then add_rms_norm, both outputs, bitwise;
    and the same as the fused launch's output (M-invariance of the pair)."""
    m, n, k = 7, 80, 192
    x, w = randn(m, k, seed=4), randn(n, k, seed=5, scale=k**-0.5)
    b = randn(n, seed=6) if bias else None
    resid, nw = randn(m, n, seed=7, scale=3.0), norm_weight(n, seed=8)
    p = linear_partials_triton(x, w, b, config=SMALL, split=True)
    y, h = add_rms_norm_triton(p, resid, nw, EPS, block=block)
    for split in (True, False):
        y2, h2 = add_rms_norm_triton(linear_triton(x, w, b, config=SMALL, split=split), resid, nw, EPS, block=block)
        assert torch.equal(y, y2) and torch.equal(h, h2), split
    # One row alone (AR) is the same row of the 7-row call.
    y1, h1 = add_rms_norm_triton(linear_partials_triton(x[3:4], w, b, config=SMALL, split=True), resid[3:4], nw, EPS, block=block)
    assert torch.equal(y1[0], y[3]) and torch.equal(h1[0], h[3])


def test_add_rms_norm_partials_matches_reference(rtne_bf16):
    """Against the torch reference of the unfused ops (fp32 sums in another order: close)."""
    m, n, k = 9, 80, 192
    x, w, b = randn(m, k, seed=9), randn(n, k, seed=10, scale=k**-0.5), randn(n, seed=11)
    resid, nw = randn(m, n, seed=12, scale=3.0), norm_weight(n, seed=13)
    p = linear_partials_triton(x, w, b, config=SMALL, split=True)
    y, h = add_rms_norm_triton(p, resid, nw, EPS)
    y_ref, h_ref = add_rms_norm_ref(linear_ref(x, w, b), resid, nw, EPS)
    bf16_close(h, h_ref, min_equal=0.9)
    bf16_close(y, y_ref, min_equal=0.9)
    # The dispatcher: Triton on CUDA, else the reference on the summed partials (bitwise here,
    # where the interpreter rounds as torch does).
    y_d, h_d = add_rms_norm(p, resid, nw, EPS)
    if not CUDA:
        y_s, h_s = add_rms_norm_ref(p.sum(), resid, nw, EPS)
        assert torch.equal(h_d, h_s) and torch.equal(y_d, y_s)


QKV_CASES = [  # (heads, kv, d, bias, qk_norm)
    (4, 2, 16, True, False),   # Qwen2: qkv bias, RoPE only
    (4, 2, 16, False, True),   # Qwen3: q/k norm
    (2, 2, 32, True, True),    # MHA
]


@pytest.mark.parametrize("heads,kv,d,bias,qk_norm", QKV_CASES)
def test_qkv_rope_write_bitwise(heads, kv, d, bias, qk_norm, poisoned_alloc, checked_pointers):
    """qkv_rope_write on Partials or on the linear's output == linear + qk_norm_rope + write_kv:
    q and both pools bitwise, at M = 5 and for a row alone."""
    m, k = 5, 192
    n = (heads + 2 * kv) * d
    x, w = randn(m, k, seed=20), randn(n, k, seed=21, scale=k**-0.5)
    b = randn(n, seed=22) if bias else None
    qn, kn = (norm_weight(d, 23), norm_weight(d, 24)) if qk_norm else (None, None)
    cos, sin = cos_sin(m, d, start=1000)
    slots = torch.tensor([9, 2, 30, 17, 5], device=DEVICE)  # scattered over 2 blocks
    k2, v2 = pools(32, kv, d)
    q2 = two_step_qkv(x, w, b, heads, kv, qn, kn, cos, sin, k2, v2, slots, config=SMALL, split=True)
    for qkv in (linear_partials_triton(x, w, b, config=SMALL, split=True), linear_triton(x, w, b, config=SMALL, split=False)):
        kp, vp = pools(32, kv, d)
        q = qkv_rope_write_triton(qkv, heads, kv, qn, kn, cos, sin, EPS, kp, vp, slots)
        assert q.shape == (m, heads, d) and q.is_contiguous()
        assert torch.equal(q, q2) and torch.equal(kp, k2) and torch.equal(vp, v2)
    # Row 2 alone (AR: split launch, partials) lands on the same bits.
    kp, vp = pools(32, kv, d)
    p1 = linear_partials_triton(x[2:3], w, b, config=SMALL, split=True)
    q1 = qkv_rope_write_triton(p1, heads, kv, qn, kn, cos[2:3], sin[2:3], EPS, kp, vp, slots[2:3])
    assert torch.equal(q1[0], q2[2])
    s = int(slots[2])
    assert torch.equal(kp.view(-1, kv, d)[s], k2.view(-1, kv, d)[s]) and torch.equal(vp.view(-1, kv, d)[s], v2.view(-1, kv, d)[s])


@pytest.mark.parametrize("qk_norm", [False, True])
def test_qkv_rope_write_matches_reference(qk_norm, rtne_bf16):
    """Against qkv_rope_write_ref on the same projection output (the norm's fp32 sum order is
    the only difference: close; bitwise without the norm); the dispatcher on the CPU is the
    reference on the summed partials."""
    heads, kv, d, m, k = 4, 2, 16, 6, 192
    n = (heads + 2 * kv) * d
    x, w, b = randn(m, k, seed=30), randn(n, k, seed=31, scale=k**-0.5), randn(n, seed=32)
    qn, kn = (norm_weight(d, 33), norm_weight(d, 34)) if qk_norm else (None, None)
    cos, sin = cos_sin(m, d, start=50)
    slots = torch.arange(m, device=DEVICE) * 3
    p = linear_partials_triton(x, w, b, config=SMALL, split=True)
    kp, vp = pools(3 * m, kv, d)
    q = qkv_rope_write_triton(p, heads, kv, qn, kn, cos, sin, EPS, kp, vp, slots)
    kr, vr = pools(3 * m, kv, d)
    q_ref = qkv_rope_write_ref(p.sum(), heads, kv, qn, kn, cos, sin, EPS, kr, vr, slots)
    assert torch.equal(vp, vr)  # v is copied: bitwise
    if qk_norm:
        bf16_close(q, q_ref, min_equal=0.95)
        bf16_close(kp[:, :, :, :], kr, min_equal=0.95)
    else:
        assert torch.equal(q, q_ref) and torch.equal(kp, kr)
    if not CUDA:
        kd, vd = pools(3 * m, kv, d)
        assert torch.equal(qkv_rope_write(p, heads, kv, qn, kn, cos, sin, EPS, kd, vd, slots), q_ref)
        assert torch.equal(kd, kr) and torch.equal(vd, vr)


def order_sensitive(n: int, k: int = 192, dtype=torch.float16):
    """x [1, K], w [n, K] whose 3 K groups (SMALL) sum to 2^24, 1 and -2^24 for every output: in
    group order 0 + 2^24 + 1 - 2^24 = 0 (the 1 is lost at 2^24), any other order gives 1 or 2.
    fp16: the interpreter's fp16 casts round as the GPU's do."""
    x = torch.zeros(1, k, dtype=dtype, device=DEVICE)
    w = torch.zeros(n, k, dtype=dtype, device=DEVICE)
    x[0, 0] = x[0, 128] = 4096.0
    x[0, 64] = 1.0
    w[:, 0], w[:, 64], w[:, 128] = 4096.0, 1.0, -4096.0
    return x, w


def test_partials_consumers_keep_the_group_order():
    """The consumers add the groups in group order (a reversed or re-associated sum fails here),
    starting from zero, the bias last (-0.25 stays: bias first would give 2^24 - 0.25 -> 2^24)."""
    x, w = order_sensitive(64)
    b = torch.full((64,), -0.25, dtype=x.dtype, device=DEVICE)
    p = linear_partials_triton(x, w, b, config=SMALL, split=True)
    assert isinstance(p, Partials) and (p.sum() == -0.25).all()
    resid = torch.full((1, 64), 2.0, dtype=x.dtype, device=DEVICE)
    _, h = add_rms_norm_triton(p, resid, torch.ones(64, dtype=x.dtype, device=DEVICE), EPS)
    assert (h == 1.75).all(), h
    kp, vp = pools(16, 1, 16, dtype=x.dtype)  # 2 q heads, 1 kv head of 16: 64 columns
    cos = torch.ones(1, 16, dtype=x.dtype, device=DEVICE)
    q = qkv_rope_write_triton(p, 2, 1, None, None, cos, torch.zeros_like(cos), EPS, kp, vp, torch.tensor([3], device=DEVICE))
    assert (q == -0.25).all() and (kp[0, 3] == -0.25).all() and (vp[0, 3] == -0.25).all()


def test_sm90_partials_reduce_in_the_same_layout():
    """Offline sm_90 compiles (no GPU): the norms' reductions of the partials variants run in the
    register layout of the plain ones (so the same threads add the same elements in the same
    order), at the 1.5B / 8B hidden sizes and head_dim 128 with q/k norm; no layout conversions."""
    pytest.importorskip("triton.backends.nvidia")
    out = run_compile_script("sm90_fused_compile.py", [])
    by_kernel: dict[str, list[dict]] = {}
    for o in out:
        by_kernel.setdefault(o["case"], []).append(o)
    assert set(by_kernel) == {"norm-1536", "norm-4096", "rope-128"}
    for case, variants in by_kernel.items():
        assert all(v["reduce_layouts"] for v in variants), case
        assert all(v["reduce_layouts"] == variants[0]["reduce_layouts"] for v in variants), (case, variants)
        assert all(v["converts"] == 0 for v in variants), (case, variants)


# ----------------------------------------------------------------------------- GPU only: real shapes

MODELS = {  # hidden, heads, kv heads, head_dim, intermediate, qkv bias, q/k norm
    "1.5B": (1536, 12, 2, 128, 8960, True, False),
    "8B": (4096, 32, 8, 128, 12288, False, True),
}
GPU_MS = (1, 16, 64, 65, 128, 256)
ALONE = (0, 5, 63, 64, 127, 200, 255)


@gpu_only
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("proj", ["o_proj", "down"])
def test_gpu_add_rms_norm_partials_real_shapes(model, proj):
    """o_proj / down + residual add + norm at the real shapes: the fused consumer equals the
    two-step path bitwise at M = 1..256 (split at small M, fused launch at large M), every row
    alone equals its row of M=256, and each launch forced at M = 1, 65, 200 gives the same bits."""
    hidden, heads, _, d, inter, _, _ = MODELS[model]
    k = heads * d if proj == "o_proj" else inter
    x, w = randn(256, k, seed=40), randn(hidden, k, seed=41, scale=k**-0.5)
    resid, nw = randn(256, hidden, seed=42, scale=3.0), norm_weight(hidden, 43)
    assert use_split(1, hidden, k, choose_config(hidden, k)), "AR takes the split launch here"
    full_y, full_h = add_rms_norm(linear_partials_triton(x, w), resid, nw, EPS)
    for m in GPU_MS:
        y, h = add_rms_norm(linear_partials_triton(x[:m], w), resid[:m], nw, EPS)
        y2, h2 = two_step_add_rms_norm(x[:m], w, None, resid[:m], nw)
        assert torch.equal(y, y2) and torch.equal(h, h2), f"M={m}: fused consumer != two-step"
        assert torch.equal(y, full_y[:m]) and torch.equal(h, full_h[:m]), f"M={m}: rows differ from M=256"
    for i in ALONE:
        y, h = add_rms_norm(linear_partials_triton(x[i : i + 1], w), resid[i : i + 1], nw, EPS)
        assert torch.equal(y[0], full_y[i]) and torch.equal(h[0], full_h[i]), f"row {i} alone"
    for m in (1, 65, 200):
        for split in (False, True):
            y, h = add_rms_norm(linear_partials_triton(x[:m], w, split=split), resid[:m], nw, EPS)
            assert torch.equal(y, full_y[:m]) and torch.equal(h, full_h[:m]), (m, split)


@gpu_only
@pytest.mark.parametrize("model", list(MODELS))
def test_gpu_qkv_rope_write_real_shapes(model):
    """qkv + bias (1.5B) or q/k norm (8B) + RoPE + KV write at the real shapes: q and the pools
    equal the two-step path bitwise at M = 1..256, rows alone equal their rows of M=256, each
    launch forced gives the same bits."""
    hidden, heads, kv, d, _, bias, qk_norm = MODELS[model]
    n = (heads + 2 * kv) * d
    x, w = randn(256, hidden, seed=50), randn(n, hidden, seed=51, scale=hidden**-0.5)
    b = randn(n, seed=52) if bias else None
    qn, kn = (norm_weight(d, 53), norm_weight(d, 54)) if qk_norm else (None, None)
    cos, sin = cos_sin(256, d, start=700)
    slots = torch.randperm(512, generator=torch.Generator().manual_seed(55))[:256].to(DEVICE)

    def fused(rows, **kw):
        kp, vp = pools(512, kv, d)
        q = qkv_rope_write(linear_partials_triton(x[rows], w, b, **kw), heads, kv, qn, kn, cos[rows], sin[rows], EPS,
                           kp, vp, slots[rows])
        return q, kp.view(-1, kv, d)[slots[rows]], vp.view(-1, kv, d)[slots[rows]]

    full = fused(slice(0, 256))
    for m in GPU_MS:
        got = fused(slice(0, m))
        kp, vp = pools(512, kv, d)
        q2 = two_step_qkv(x[:m], w, b, heads, kv, qn, kn, cos[:m], sin[:m], kp, vp, slots[:m])
        two = (q2, kp.view(-1, kv, d)[slots[:m]], vp.view(-1, kv, d)[slots[:m]])
        for name, a, c, f in zip("qkv", got, two, full):
            assert torch.equal(a, c), f"M={m}: {name} differs from the two-step path"
            assert torch.equal(a, f[:m]), f"M={m}: {name} rows differ from M=256"
    for i in ALONE:
        got = fused(slice(i, i + 1))
        assert all(torch.equal(a[0], f[i]) for a, f in zip(got, full)), f"row {i} alone"
    for m in (1, 65, 200):
        for split in (False, True):
            got = fused(slice(0, m), split=split)
            assert all(torch.equal(a, f[:m]) for a, f in zip(got, full)), (m, split)


@gpu_only
def test_gpu_cuda_graph_partials_consumers():
    """Captured in one CUDA graph (split linears handing partials on), replayed on new inputs:
    the same bits as eager."""
    hidden, heads, kv, d, inter, _, _ = MODELS["1.5B"]
    n = (heads + 2 * kv) * d
    w_qkv, b = randn(n, hidden, seed=60, scale=hidden**-0.5), randn(n, seed=61)
    w_down = randn(hidden, inter, seed=62, scale=inter**-0.5)
    nw = norm_weight(hidden, 63)
    x, a, resid = randn(1, hidden, seed=64), randn(1, inter, seed=65), randn(1, hidden, seed=66)
    cos, sin = cos_sin(1, d, start=3)
    slots = torch.tensor([7], device=DEVICE)
    kp, vp = pools(32, kv, d)

    def step():
        q = qkv_rope_write(linear_partials_triton(x, w_qkv, b), heads, kv, None, None, cos, sin, EPS, kp, vp, slots)
        return (q, *add_rms_norm(linear_partials_triton(a, w_down), resid, nw, EPS))

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    for seed in (70, 80):
        for i, buf in enumerate((x, a, resid)):
            buf.copy_(randn(*buf.shape, seed=seed + i))
        graph.replay()
        torch.cuda.synchronize()
        k_graph = kp.clone()
        for got, want in zip(static, step()):
            assert torch.equal(got, want)
        assert torch.equal(kp, k_graph)


# ----------------------------------------------------------------------------- the engine's forward


def unfused_forward(model, batch, kv, attention, write):
    """TargetModel.forward as a plain loop of the unfused kernels (the qkv GEMM with its group-sum
    pass, then qk_norm_rope and write_kv; o_proj and down with their group-sum passes, then
    add_rms_norm), taps left out: the reference the fused forward must equal bitwise."""
    from jetspec_chat.kernels import add_rms_norm, visible_keys

    t = batch.input_ids.shape[0]
    h = model.model.embed_tokens(batch.input_ids)
    cos, sin = model.rotary.cos_sin(batch.positions, h.dtype)
    slots = kv.slots_of(batch.prefix_len + torch.arange(t, device=h.device))
    keys = visible_keys(batch.tree_mask)
    layers = model.model.layers
    eps = model.cfg.rms_norm_eps
    x = layers[0].input_layernorm(h)
    for i, layer in enumerate(layers):
        attn = layer.self_attn
        q, k, v = attn.qkv_rope(x, cos, sin)
        k_pool, v_pool = kv.layer(i)
        write(k_pool, v_pool, slots, k, v)
        o = attention(q, k_pool, v_pool, kv.block_table, batch.prefix_len, batch.tree_mask, model.scale, keys)
        x, h = add_rms_norm(attn.o_proj(o.reshape(t, -1)), h, layer.post_attention_layernorm.weight, eps)
        next_norm = layers[i + 1].input_layernorm if i + 1 < len(layers) else model.model.norm
        x, h = add_rms_norm(layer.mlp(x), h, next_norm.weight, eps)
    return x


@pytest.mark.skipif(CUDA, reason="the interpreter check; on the GPU the engine tests cover the forward")
@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_target_forward_equals_the_unfused_loop(model_type, monkeypatch, rtne_bf16):
    """TargetModel.forward (partials handed to qkv_rope_write / add_rms_norm) == the unfused
    loop (group-sum passes, qk_norm_rope, write_kv) through the Triton kernels under the
    interpreter (the dispatchers forced onto them): final hidden states and K/V pools bitwise, at
    T = 1 and a 5-token chunk. Shapes big enough that qkv, o_proj and down split at T=1."""
    from jetspec_chat.engine import layers as layers_mod
    from jetspec_chat.engine import model as model_mod
    from jetspec_chat.engine.kv_cache import PagedKVCache
    from jetspec_chat.engine.model import ForwardBatch, build_target
    from jetspec_chat.engine.model_config import ModelConfig
    from jetspec_chat.kernels import fused, paged_tree_attention_triton

    def attention(q, k_pool, v_pool, table, prefix, mask, scale, keys=None, window=0, sinks=None):
        return paged_tree_attention_triton(q, k_pool, v_pool, table, prefix, keys if keys is not None else mask, scale,
                                           window=window, sinks=sinks)

    monkeypatch.setattr(fused, "_use_triton", lambda *tensors: True)
    monkeypatch.setattr(layers_mod, "_batch_invariant", lambda *args: True)
    monkeypatch.setattr(layers_mod, "linear", lambda x, w, b=None: linear_triton(x, w, b))  # not the CPU skinny path
    monkeypatch.setattr(model_mod, "paged_tree_attention", attention)
    hidden, inter, heads, kv_heads, d = 256, 512, 4, 2, 64
    cfg = ModelConfig.from_hf(dict(model_type=model_type, vocab_size=64, hidden_size=hidden, intermediate_size=inter,
                                   num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=kv_heads,
                                   head_dim=d, rope_theta=1e4))
    for n, k in (((heads + 2 * kv_heads) * d, hidden), (hidden, heads * d), (hidden, inter)):
        assert use_split(1, n, k, choose_config(n, k)), (n, k)
    model = build_target(cfg, torch.device("cpu"), BF)
    model.init_random(seed=3, std=0.05)
    kv = PagedKVCache(cfg.num_layers, kv_heads, d, 128, torch.device("cpu"), BF)
    kv.pool.copy_(randn(*kv.pool.shape, seed=4))
    prefix, first = 40, {}
    for t in (1, 5):
        batch = ForwardBatch(torch.arange(t) + 7, prefix + torch.arange(t), torch.ones(t, t, dtype=torch.bool).tril(),
                             torch.tensor(prefix))
        pools = [kv.pool.clone(), kv.pool.clone()]
        before = kv.pool.clone()
        runs = []
        paths = (lambda: unfused_forward(model, batch, kv, attention, write_kv_triton), lambda: model(batch, kv)[0])
        for path, pool in zip(paths, pools):
            kv.pool = pool
            with torch.no_grad():
                runs.append(path())
        assert torch.equal(runs[0], runs[1]), f"T={t}: hidden states differ"
        assert torch.equal(pools[0], pools[1]), f"T={t}: K/V pools differ"
        assert not torch.equal(pools[0], before) and runs[0].isfinite().all()
        first.setdefault("x", runs[1][0])
        assert torch.equal(runs[1][0], first["x"]), "token 0 of the chunk differs from its AR step"

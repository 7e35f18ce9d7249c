"""RoPE's cos/sin table in one launch (kernels/rope.py) against its torch formula
(kernels/reference.py::rope_cos_sin_ref).

On a CPU the kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py), where
cos and sin are numpy's, not torch's, and the rounding to bf16 is toward zero: the fp32 values are
compared to a few ulp and the bf16 ones to one bf16 step. On a GPU the kernel's cos and sin are libdevice's, as torch's are: the tables
must be equal bit for bit, at positions 0..200,000 and the frequencies of the models the engine
runs (plain theta 1e6, Llama 3 scaling, YaRN with its attention factor, Gemma 4's proportional
RoPE with zero frequencies, the hybrid's partial rotary), and inside a CUDA graph.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

from jetspec_chat.engine.layers import Rotary  # noqa: E402
from jetspec_chat.kernels import rope_cos_sin, rope_cos_sin_ref, rope_cos_sin_triton  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from sm90 import run_compile_script  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
gpu_only = pytest.mark.skipif(not CUDA, reason="needs a GPU")

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 4096}
PROPORTIONAL = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "factor": 1.0}
# (head_dim, theta, rope_scaling, max_positions) of the rotaries the engine builds
ROTARIES = {
    "qwen_1e6_d128": (128, 1e6, None, 32768),
    "qwen_1e6_d64": (64, 1e6, None, 32768),
    "llama3_d128": (128, 5e5, LLAMA3, 131072),
    "yarn_d64": (64, 150000.0, YARN, 131072),
    "proportional_d256": (256, 1e6, PROPORTIONAL, 131072),
}


def rotary(name: str) -> Rotary:
    head_dim, theta, scaling, max_positions = ROTARIES[name]
    return Rotary(head_dim, theta, scaling, max_positions).to(DEVICE)


def random_inv_freq(h: int, seed: int) -> torch.Tensor:
    """Log-uniform frequencies over the models' range (1e-8 .. 1), and one exact 0."""
    g = torch.Generator().manual_seed(seed)
    f = torch.exp(torch.empty(h).uniform_(-18.5, 0.0, generator=g))
    f[-1] = 0.0
    return f.to(DEVICE)


def positions_of(t: int, start: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Increasing runs and a shuffle (tree rows revisit positions), from `start`."""
    g = torch.Generator().manual_seed(seed)
    p = start + torch.arange(t)
    p[t // 2 :] = p[t // 2 :][torch.randperm(t - t // 2, generator=g)]
    return p.to(dtype).to(DEVICE)


def assert_close_to_ref(got, want, dtype):
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype == dtype
        if CUDA:
            assert torch.equal(g, w), f"{(g != w).sum().item()} of {g.numel()} differ, max {(g.float() - w.float()).abs().max().item():.3g}"
        elif dtype == torch.float32:  # numpy's cos/sin vs torch's: a few ulp
            torch.testing.assert_close(g, w, rtol=0, atol=4e-7)
        else:  # the interpreter rounds to bf16 toward zero (the GPU to nearest): one bf16 step
            torch.testing.assert_close(g.float(), w.float(), rtol=2**-7, atol=1e-30)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("t", [1, 7, 257])
def test_kernel_matches_reference(t, d, dtype):
    inv_freq = random_inv_freq(d // 2, seed=d)
    pos = positions_of(t, start=1000 * t, dtype=torch.int64, seed=t)
    got = rope_cos_sin_triton(pos, inv_freq, 1.0, dtype)
    assert_close_to_ref(got, rope_cos_sin_ref(pos, inv_freq, 1.0, dtype), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pos_dtype", [torch.int64, torch.int32])
def test_attention_factor_and_int32_positions(pos_dtype, dtype):
    """YaRN's factor (1.3) scales both tables; int32 positions read as the int64 ones."""
    inv_freq = random_inv_freq(64, seed=5)
    pos = positions_of(33, start=150_000, dtype=pos_dtype)
    got = rope_cos_sin_triton(pos, inv_freq, 1.3, dtype)
    want = rope_cos_sin_ref(pos.long(), inv_freq, 1.3, dtype)
    assert_close_to_ref(got, want, dtype)
    plain = rope_cos_sin_ref(pos.long(), inv_freq, 1.0, torch.float32)
    assert not torch.equal(got[0].float(), plain[0].to(dtype).float())  # the factor was applied


def test_every_element_is_written(poisoned_alloc):
    """Allocations start as NaN here: every element of both tables is the kernel's."""
    inv_freq = random_inv_freq(32, seed=1)
    pos = positions_of(9, start=12, dtype=torch.int64)
    cos, sin = rope_cos_sin_triton(pos, inv_freq, 1.0, torch.float32)
    assert not cos.isnan().any() and not sin.isnan().any()
    assert_close_to_ref((cos, sin), rope_cos_sin_ref(pos, inv_freq, 1.0, torch.float32), torch.float32)


def test_dispatcher_on_cpu_runs_the_formula():
    """CPU tensors take the torch formula itself (bit for bit): the CPU engine's results do not
    change."""
    inv_freq = random_inv_freq(64, seed=2).cpu()
    pos = torch.arange(40, 60)
    want = rope_cos_sin_ref(pos, inv_freq, 1.3, torch.bfloat16)
    got = rope_cos_sin(pos, inv_freq, 1.3, torch.bfloat16)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_rotary_uses_the_formula():
    """Rotary.cos_sin is rope_cos_sin with its own frequencies and factor (YaRN's here)."""
    rot = rotary("yarn_d64")
    assert rot.attention_factor != 1.0
    pos = positions_of(5, start=3, dtype=torch.int64)
    got = rot.cos_sin(pos, torch.bfloat16)
    assert_close_to_ref(got, rope_cos_sin_ref(pos, rot.inv_freq, rot.attention_factor, torch.bfloat16), torch.bfloat16)


# ----------------------------------------------------------------------------- GPU only


@gpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(ROTARIES))
def test_gpu_bitwise_at_every_position_to_200k(name, dtype):
    """The engine's rotaries: one launch equals torch's formula bit for bit at 0..200,000."""
    rot = rotary(name)
    pos = torch.arange(200_001, device=DEVICE)
    for p in (pos, pos.int()):
        got = rope_cos_sin(p, rot.inv_freq, rot.attention_factor, dtype)
        assert_close_to_ref(got, rope_cos_sin_ref(pos, rot.inv_freq, rot.attention_factor, dtype), dtype)


@gpu_only
@pytest.mark.parametrize("factor", [1.0, 1.3])
@pytest.mark.parametrize("seed", range(4))
def test_gpu_bitwise_random_frequencies(seed, factor):
    pos = torch.arange(200_001, device=DEVICE)
    inv_freq = random_inv_freq(64, seed=seed)
    for dtype in (torch.float32, torch.bfloat16):
        got = rope_cos_sin_triton(pos, inv_freq, factor, dtype)
        assert_close_to_ref(got, rope_cos_sin_ref(pos, inv_freq, factor, dtype), dtype)


@gpu_only
def test_gpu_partial_rotary_bitwise():
    """The hybrid's PartialRotary (64 of 256 dims) goes through the same launch."""
    from jetspec_chat.engine.hybrid_model import PartialRotary

    rot = PartialRotary(64, 1e7).to(DEVICE)
    pos = torch.arange(200_001, device=DEVICE)
    got = rot.cos_sin(pos, torch.bfloat16)
    assert_close_to_ref(got, rope_cos_sin_ref(pos, rot.inv_freq, 1.0, torch.bfloat16), torch.bfloat16)


@gpu_only
def test_gpu_captured_in_a_cuda_graph():
    """Captured once, replayed with new positions written into the same buffer: the table of
    the new positions (the positions are read on the device, never on the host)."""
    rot = rotary("yarn_d64")
    pos = torch.arange(64, device=DEVICE)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        rope_cos_sin(pos, rot.inv_freq, rot.attention_factor, torch.bfloat16)  # compile
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rope_cos_sin(pos, rot.inv_freq, rot.attention_factor, torch.bfloat16)
    for start in (100, 77_777):
        pos.copy_(positions_of(64, start=start, dtype=torch.int64, seed=start))
        graph.replay()
        torch.cuda.synchronize()
        assert_close_to_ref(out, rope_cos_sin_ref(pos, rot.inv_freq, rot.attention_factor, torch.bfloat16), torch.bfloat16)


def test_sm90_compile_uses_no_approximate_math_and_does_not_spill():
    """Compiled for sm_90 (no GPU needed): cos and sin are libdevice's full-precision functions,
    as torch's kernels' cosf / sinf, not an approximate instruction; no variant spills."""
    out = run_compile_script("sm90_rope_compile.py", [])
    assert len(out) == 12
    for variant in out:
        assert variant["approx"] == [], variant
        assert variant["local"] in (0, None), variant

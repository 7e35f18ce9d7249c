"""The fused top-k of log-softmax (kernels/top_logprobs.py) against its torch reference: the same
ids in the same order, the values to fp32 rounding.

On a CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py): rows
and chunks stay small here; the engine's shape (15 x 151,936, CHUNK 4096) runs on a GPU.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

from jetspec_chat.kernels import top_log_probs, top_log_probs_ref, top_log_probs_triton  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from sm90 import run_compile_script  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
gpu_only = pytest.mark.skipif(not CUDA, reason="needs a GPU")


def logits_of(kind: str, depth: int, vocab: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(depth, vocab, generator=g) * 3
    if kind == "tied":  # coarse logits: many exactly equal values, the top ones tied across chunks
        x = torch.randint(0, 4, (depth, vocab), generator=g).float()
        x[:, torch.randperm(vocab, generator=g)[:70]] = 5.0
    elif kind == "neg_inf":  # masked tokens, a whole chunk of them included
        x[:, : vocab // 3] = float("-inf")
        x[:, torch.randperm(vocab, generator=g)[: vocab // 4]] = float("-inf")
        x[0, torch.randperm(vocab, generator=g)[vocab // 2 :]] = float("-inf")  # mostly -inf
        x[0, 600:605] = 1.0  # fewer finite logits than k: the -inf ones follow by id
        x[0, 605:] = float("-inf")
    elif kind == "confident":  # one token takes (nearly) all the mass
        x[:, 5] = 80.0
    return x.to(dtype).to(DEVICE)


def check(logits: torch.Tensor, k: int, chunk: int) -> None:
    values, ids = top_log_probs_triton(logits, k, chunk=chunk)
    want_values, want_ids = top_log_probs_ref(logits, k)
    assert values.shape == (logits.shape[0], k) and values.dtype == torch.float32
    assert ids.dtype == torch.long and torch.equal(ids, want_ids), (ids, want_ids)
    torch.testing.assert_close(values, want_values, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("k", [1, 8, 64])
@pytest.mark.parametrize("kind", ["random", "tied", "neg_inf", "confident"])
def test_kernel_equals_reference(kind, k):
    # V = 777 is not a multiple of the chunk (128: 7 chunks, the last one partial)
    check(logits_of(kind, 3, 777, seed=k, dtype=torch.float32), k, chunk=128)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("depth", [1, 16])
def test_half_inputs(dtype, depth):
    # bf16 logits are coarse: ties everywhere, broken by the lower id as in the reference
    check(logits_of("random", depth, 200, seed=depth, dtype=dtype), 32, chunk=64)


@pytest.mark.parametrize("kind", ["tied", "neg_inf", "confident"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_ties_and_masks(kind, dtype):
    # 16-bit rows select on int32 keys: ties across and within chunks, -inf chunks, signed zeros
    x = logits_of(kind, 3, 777, seed=11, dtype=dtype)
    if kind == "tied":
        x[1, 100:700:3] = -0.0
        x[1, 101:700:3] = 0.0
    check(x, 64, chunk=128)


def test_one_chunk_and_chunk_below_k():
    check(logits_of("random", 2, 100, seed=3, dtype=torch.float32), 8, chunk=128)  # one partial chunk
    check(logits_of("random", 2, 300, seed=4, dtype=torch.float32), 64, chunk=16)  # chunk grows to k


def test_deterministic():
    x = logits_of("tied", 2, 900, seed=5, dtype=torch.float32)
    a, b = top_log_probs_triton(x, 16, chunk=128), top_log_probs_triton(x, 16, chunk=128)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_dispatch_wider_than_the_kernel_uses_the_reference():
    x = logits_of("random", 2, 300, seed=6, dtype=torch.float32)
    values, ids = top_log_probs(x, 100)
    want_values, want_ids = top_log_probs_ref(x, 100)
    assert torch.equal(ids, want_ids) and torch.allclose(values, want_values)


def test_reference_is_log_softmax_topk():
    x = logits_of("random", 3, 1000, seed=7, dtype=torch.float32)
    values, ids = top_log_probs_ref(x, 10)
    want = torch.log_softmax(x, -1).topk(10, dim=-1)
    torch.testing.assert_close(values, want.values)
    assert torch.equal(ids, want.indices)  # no ties in random fp32 rows


@gpu_only
@pytest.mark.parametrize("k", [8, 32, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_engine_shape_on_gpu(k, dtype):
    x = logits_of("random", 15, 151_936, seed=k, dtype=dtype)
    values, ids = top_log_probs(x, k)
    want_values, want_ids = top_log_probs_ref(x, k)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(values, want_values, rtol=1e-5, atol=2e-5)


@gpu_only
def test_cuda_graph_replay():
    x = logits_of("random", 15, 151_936, seed=1, dtype=torch.float32)
    top_log_probs(x, 32)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        values, ids = top_log_probs(x, 32)
    x.copy_(logits_of("tied", 15, 151_936, seed=2, dtype=torch.float32))
    graph.replay()
    want_values, want_ids = top_log_probs_ref(x, 32)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(values, want_values, rtol=1e-5, atol=2e-5)


def test_sm90_compile_at_the_engine_shape_does_not_spill():
    """k = 64 (the widest) at the engine's chunk: both kernels stay in registers on sm_90."""
    out = run_compile_script("sm90_top_logprobs_compile.py", ["4096", "64", "bf16"])
    assert [o["kernel"] for o in out] == ["chunk_top", "chunk_top", "merge_top"]
    for o in out:
        assert o["local"] == 0, o

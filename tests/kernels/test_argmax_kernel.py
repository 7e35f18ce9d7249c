"""The two-pass argmax (kernels/argmax.py) against torch.argmax: the same index for every row,
ties to the first maximum, for bf16 / fp16 rows as for their fp32 copies.

On a CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py) with
small chunks; the engine's shape (up to 256 x 151,936, CHUNK 4096) runs on a GPU.
"""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from jetspec_chat.kernels import argmax_rows, argmax_rows_triton  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
gpu_only = pytest.mark.skipif(not CUDA, reason="needs a GPU")


def rows_of(kind: str, rows: int, vocab: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g) * 3
    if kind == "tied":  # coarse values: the maximum repeats, within a chunk and across chunks
        x = torch.randint(0, 4, (rows, vocab), generator=g).float()
        x[:, torch.randperm(vocab, generator=g)[:9]] = 5.0
    elif kind == "neg_inf":  # masked tokens: whole chunks of -inf, and a row with no finite value
        x[:, : vocab // 2] = float("-inf")
        x[0] = float("-inf")
    elif kind == "signed_zero":  # the maximum is zero, -0.0 first: torch takes the first of them
        x = -x.abs() - 1
        x[:, vocab // 3] = -0.0
        x[:, vocab // 2] = 0.0
    elif kind == "last":  # the maximum in the partial last chunk
        x[:, -1] = 100.0
    return x.to(dtype).to(DEVICE)


@pytest.mark.parametrize("kind", ["random", "tied", "neg_inf", "signed_zero", "last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_equals_torch(kind, dtype):
    # V = 777 is not a multiple of the chunk (128: 7 chunks, the last one partial)
    x = rows_of(kind, 5, 777, seed=3, dtype=dtype)
    got = argmax_rows_triton(x, chunk=128)
    assert got.dtype == torch.long and got.shape == (5,)
    assert torch.equal(got, x.argmax(dim=-1)) and torch.equal(got, x.float().argmax(dim=-1))


@pytest.mark.parametrize("vocab", [1, 100, 128, 129])
def test_one_chunk_and_edges(vocab):
    x = rows_of("tied", 3, vocab, seed=vocab, dtype=torch.float16)
    assert torch.equal(argmax_rows_triton(x, chunk=128), x.argmax(dim=-1))


def test_strided_rows_and_dispatch():
    x = rows_of("random", 4, 300, seed=1, dtype=torch.bfloat16)
    view = x[:, :200]  # rows strided past their width: read in place
    assert torch.equal(argmax_rows_triton(view, chunk=64), view.argmax(dim=-1))
    cpu = x.float().cpu()
    assert torch.equal(argmax_rows(cpu), cpu.argmax(dim=-1))  # CPU tensors: torch


@gpu_only
@pytest.mark.parametrize("rows", [1, 64, 256])
@pytest.mark.parametrize("kind", ["random", "tied", "neg_inf", "signed_zero", "last"])
def test_gpu_engine_shape(rows, kind):
    x = rows_of(kind, rows, 151_936, seed=rows, dtype=torch.bfloat16)
    got = argmax_rows(x)
    assert torch.equal(got, x.float().argmax(dim=-1))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = argmax_rows(x)
    graph.replay()
    assert torch.equal(out, got)

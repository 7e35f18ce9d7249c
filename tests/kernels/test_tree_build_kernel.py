"""The one-launch tree build (kernels/tree_build.py) against its torch reference, bit for bit.

On a CPU the kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py),
which is slow for the bitonic top-k: shapes stay small here; the engine's shapes (budgets up
to 1024, width up to 64) and CUDA-graph capture run on a GPU (each shape class compiles once,
seconds for the larger ones).
"""
from __future__ import annotations

import math

import pytest
import torch

triton = pytest.importorskip("triton")

from jetspec_chat.engine.tree import ADAPTIVE_MIN_RATIO, static_tree_size
from jetspec_chat.kernels import accum_tree_ref, accum_tree_triton

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
gpu_only = pytest.mark.skipif(not CUDA, reason="needs a GPU")


def logp_of(kind: str, depth: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        return torch.log_softmax(torch.randn(depth, vocab, generator=g) * 3, dim=-1)
    if kind == "tied":  # coarse logits (as bf16 ones are): many exactly equal scores
        logits = torch.randint(0, 4, (depth, vocab), generator=g).float()
        logits[::2, :6] = 5.0
        return torch.log_softmax(logits, dim=-1)
    if kind == "confident":  # top-1 log-prob exactly 0 at some depths: children tie their parents
        logits = torch.randn(depth, vocab, generator=g)
        logits[1::2, 3] = 60.0
        return torch.log_softmax(logits, dim=-1)
    if kind == "pruned":  # adaptive's input: -inf inside the top-K, fewer finite nodes than asked
        logp = torch.log_softmax(torch.randn(depth, vocab, generator=g) * 4, dim=-1)
        top1 = logp.max(dim=-1, keepdim=True).values
        return logp.masked_fill(logp < top1 + math.log(ADAPTIVE_MIN_RATIO), float("-inf"))
    raise ValueError(kind)


def check(budget: int, width: int, depth: int, kind: str, seed: int = 0, vocab: int = 50) -> None:
    logp = logp_of(kind, depth, vocab, seed).to(DEVICE)
    k = min(width, vocab)
    n = static_tree_size(budget, k, depth)
    top_lp, top_tok = logp.topk(k, dim=-1)
    root = torch.tensor(7, device=DEVICE)
    got = accum_tree_triton(top_lp, top_tok, root, n)
    want = accum_tree_ref(top_lp, top_tok, root, n)
    for name, a, b in zip(("tokens", "parents", "depths", "scores", "ancestors"), got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), f"{name} differs at {torch.nonzero(a != b).flatten()[:8].tolist()}"


@pytest.mark.parametrize("budget,width,depth", [(2, 1, 1), (2, 8, 3), (3, 2, 3), (16, 4, 3), (16, 8, 15),
                                                (40, 2, 6), (7, 20, 5), (33, 3, 4)])
@pytest.mark.parametrize("kind", ["random", "tied", "confident", "pruned"])
def test_kernel_equals_reference(budget, width, depth, kind):
    check(budget, width, depth, kind)


def test_kernel_equals_reference_engine_width():
    check(64, 8, 15, "tied", seed=1)


@gpu_only
@pytest.mark.parametrize("budget,width,depth", [(64, 8, 15), (256, 8, 15), (1024, 8, 15), (1024, 64, 15),
                                                (100, 8, 31)])
@pytest.mark.parametrize("kind", ["random", "tied", "pruned"])
def test_kernel_equals_reference_at_engine_sizes(budget, width, depth, kind):
    check(budget, width, depth, kind, vocab=151936)


@gpu_only
def test_kernel_replays_in_a_cuda_graph():
    logp = logp_of("random", 15, 151936, 0).cuda()
    top_lp, top_tok = logp.topk(8, dim=-1)
    root = torch.tensor(7, device="cuda")
    accum_tree_triton(top_lp, top_tok, root, 256)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = accum_tree_triton(top_lp, top_tok, root, 256)
    new = logp_of("tied", 15, 151936, 1).cuda().topk(8, dim=-1)
    top_lp.copy_(new.values)
    top_tok.copy_(new.indices)
    graph.replay()
    for a, b in zip(out, accum_tree_ref(top_lp, top_tok, root, 256)):
        assert torch.equal(a, b)

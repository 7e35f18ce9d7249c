"""Static-buffer runners for the two forwards of a round, CUDA-graphed on the GPU.

VerifyRunner: the target forward over a tree (or one AR token), per tree-size bucket.
DraftRunner: the draft head's block forward (through lm_head and log-softmax) and the tree
built from it, per depth and tree shape. Each bucket is captured once and replayed; lengths are read from device
scalars, so one graph serves every context length, turn and budget mapping to the bucket.
Elsewhere (CPU) the same functions run eagerly on exact sizes.
"""
from __future__ import annotations

from typing import Callable

import torch

from .draft_head import DraftHead, DraftKVCache
from .tree import FIXED_SHAPE_ALGOS, TREE_ALGOS, Tree
from .kv_cache import PagedKVCache
from .model import ForwardBatch, TargetModel

TREE_BUCKETS = (1, 16, 32, 64, 128, 256, 512, 1024)
SCRATCH_ROWS = TREE_BUCKETS[-1]  # KV rows past the context limit reserved for one padded tree


def bucket_for(n: int, buckets: tuple[int, ...]) -> int:
    return next(b for b in buckets if b >= n)


def capture(fn: Callable[[], object], device: torch.device, pool) -> tuple[torch.cuda.CUDAGraph, object]:
    """Warm fn up on a side stream (Triton compiles, the allocator settles), then capture it."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


class _TreeBucket:
    def __init__(self, size: int, device: torch.device):
        self.ids = torch.zeros(size, dtype=torch.long, device=device)
        self.positions = torch.zeros(size, dtype=torch.long, device=device)
        self.eye = torch.eye(size, dtype=torch.bool, device=device)
        self.mask = self.eye.clone()
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: tuple[torch.Tensor, torch.Tensor | None] | None = None


class VerifyRunner:
    """Trees are padded to the bucket with nodes that see only themselves (and the prefix);
    they write K/V into scratch rows and are never accepted."""

    def __init__(self, target: TargetModel, kv: PagedKVCache, tap_layers: tuple[int, ...]):
        self.target, self.kv, self.tap_layers = target, kv, tap_layers
        self.device = kv.pool.device
        self.use_graphs = self.device.type == "cuda"
        self.prefix = torch.zeros((), dtype=torch.long, device=self.device)
        self._buckets: dict[int, _TreeBucket] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None

    def run(
        self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, prefix_len: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Forward n new tokens after `prefix_len` committed ones; K/V land at prefix_len + i.
        Returns (final hidden [n, H], taps [n, taps*H] or None)."""
        n = tokens.shape[0]
        if not self.use_graphs:
            return self.target(ForwardBatch(tokens, positions, mask, prefix_len), self.kv, self.tap_layers)
        size = bucket_for(n, TREE_BUCKETS)
        b = self._buckets.get(size) or self._buckets.setdefault(size, _TreeBucket(size, self.device))
        b.ids[:n] = tokens
        b.positions[:n] = positions
        b.mask.copy_(b.eye)
        b.mask[:n, :n] = mask
        self.prefix.fill_(prefix_len)
        if b.graph is None:
            batch = ForwardBatch(b.ids, b.positions, b.mask, self.prefix)
            b.graph, b.out = capture(lambda: self.target(batch, self.kv, self.tap_layers), self.device, self._pool)
        b.graph.replay()
        hidden, taps = b.out
        return hidden[:n], (taps[:n] if taps is not None else None)


class DraftRunner:
    """The draft forward, and (for fixed-shape tree algorithms) the tree built from it, in one
    graph per (depth, tree shape): the context length is a device scalar and the draft's
    attention kernel reads only the rows it needs, so no graph depends on the context."""

    def __init__(self, head: DraftHead, cache: DraftKVCache, embed: torch.nn.Embedding, lm_head_weight: torch.Tensor):
        self.head, self.cache, self.embed, self.lm_head_weight = head, cache, embed, lm_head_weight
        self.device = cache.k.device
        self.use_graphs = self.device.type == "cuda"
        self.anchor = torch.zeros((), dtype=torch.long, device=self.device)
        self.length = torch.zeros((), dtype=torch.long, device=self.device)
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, object]] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None

    def _logp(self, anchor: torch.Tensor, depth: int, length) -> torch.Tensor:
        logits = self.head.draft_logits(self.cache, anchor, depth, self.embed, self.lm_head_weight, length)
        return torch.log_softmax(logits, dim=-1)

    def _replay(self, key: tuple, fn: Callable[[], object], anchor: torch.Tensor):
        self.anchor.copy_(anchor)
        self.length.fill_(self.cache.length)
        if key not in self._graphs:
            self._graphs[key] = capture(fn, self.device, self._pool)
        graph, out = self._graphs[key]
        graph.replay()
        return out

    def logp(self, anchor: torch.Tensor, depth: int) -> torch.Tensor:
        """Draft log-probs [depth, vocab] (fp32) for the block after `anchor`."""
        if not self.use_graphs:
            return self._logp(anchor, depth, self.cache.length)
        return self._replay(("logp", depth), lambda: self._logp(self.anchor, depth, self.length), anchor)

    def tree(self, anchor: torch.Tensor, depth: int, algo: str, budget: int, width: int, mark) -> Tree:
        """The draft tree for the block after `anchor`; graphed together with the draft when the
        algorithm has fixed shapes (then the tree phase reads 0 ms: it is inside the draft's).
        `mark(phase)` closes a timing phase."""
        build = TREE_ALGOS[algo]
        if not self.use_graphs or algo not in FIXED_SHAPE_ALGOS:
            logp = self.logp(anchor, depth)
            mark("draft_ms")
            tree = build(anchor, logp, budget, width)
        else:
            fn = lambda: build(self.anchor, self._logp(self.anchor, depth, self.length), budget, width)  # noqa: E731
            tree = self._replay(("tree", depth, algo, budget, width), fn, anchor)
            mark("draft_ms")
        mark("tree_ms")
        return tree

"""Static-buffer runners for the two forwards of a round, CUDA-graphed on the GPU.

VerifyRunner: the target forward over a tree (or one AR token), per tree-size bucket; for
greedy decoding the same graph also finishes the round (accept, KV commit, packing).
DraftRunner: the draft head's block forward (through lm_head and log-softmax) and the tree
built from it, per depth and tree shape. Each bucket is captured once and replayed; lengths are read from device
scalars, so one graph serves every context length, turn and budget mapping to the bucket.
Elsewhere (CPU) the same functions run eagerly on exact sizes.
"""
from __future__ import annotations

from typing import Callable

import torch

from .accept import PackedRound, finish_round, target_choices
from .draft_head import DraftHead, DraftKVCache
from .kv_cache import PagedKVCache
from .model import ForwardBatch, TargetModel
from .params import SamplingParams
from .tree import FIXED_SHAPE_ALGOS, TREE_ALGOS, Tree

TREE_BUCKETS = (1, 16, 32, 64, 128, 256, 512, 1024)
SCRATCH_ROWS = TREE_BUCKETS[-1]  # KV rows past the context limit reserved for one padded tree
GREEDY = SamplingParams()


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
    """Static inputs of one bucket's graphs: a tree padded to `size` nodes. Entries past the
    real node count `n` (a device scalar) are stale values of earlier trees: in range, masked
    out of attention and of acceptance, never read back."""

    def __init__(self, size: int, path_len: int, device: torch.device):
        self.tokens = torch.zeros(size, dtype=torch.long, device=device)
        # Initial values are a root-only tree, which bucket 1 keeps (see VerifyRunner._stage).
        self.parents = torch.full((size,), -1, dtype=torch.long, device=device)
        self.depths = torch.zeros(size, dtype=torch.long, device=device)
        self.scores = torch.zeros(size, dtype=torch.float32, device=device)
        self.eye = torch.eye(size, dtype=torch.bool, device=device)
        self.ancestors = self.eye.clone()
        self.n = torch.ones((), dtype=torch.long, device=device)
        self.index = torch.arange(size, device=device)
        self.path_len = path_len
        self.forward_graph: torch.cuda.CUDAGraph | None = None
        self.forward_out: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self.round_graph: torch.cuda.CUDAGraph | None = None
        self.round_out: PackedRound | None = None


class VerifyRunner:
    """The target forward over a tree (K/V written after the committed prefix). On CUDA, trees
    are padded to a bucket whose padding nodes see only themselves (and the prefix), write K/V
    into scratch rows and are never accepted; per bucket one graph for the forward alone and,
    for greedy decoding, one for the whole verify step: forward, logits, argmax and
    finish_round (accept, KV commit, packing, the next anchor), so a greedy round needs no
    launches after the replay but its one device->host copy.

    `anchor` is the engine's 0-d device scalar for the next round's root, which finish_round
    sets to the bonus token. The graphs read a tree's root token from the staged tree, never
    from the anchor: capture warms the step up twice, and each run rewrites the anchor."""

    def __init__(
        self, target: TargetModel, kv: PagedKVCache, tap_layers: tuple[int, ...], anchor: torch.Tensor, max_depth: int
    ):
        self.target, self.kv, self.tap_layers, self.anchor = target, kv, tap_layers, anchor
        self.max_path = max_depth + 1  # no tree is deeper than the draft head drafts
        self.device = kv.pool.device
        self.use_graphs = self.device.type == "cuda"
        self.prefix = torch.zeros((), dtype=torch.long, device=self.device)
        self._buckets: dict[int, _TreeBucket] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None

    def _stage(self, tree: Tree, prefix_len: int) -> _TreeBucket:
        """Copy the tree into its bucket's static inputs (device to device, no host value
        besides the two scalars)."""
        n = tree.size
        size = bucket_for(n, TREE_BUCKETS)
        b = self._buckets.get(size)
        if b is None:
            # A tree of n <= size nodes is at most size - 1 deep: its path fits in min(size, max_path).
            b = self._buckets[size] = _TreeBucket(size, min(size, self.max_path), self.device)
        b.tokens[:n].copy_(tree.tokens)
        if n > 1:  # a one-node tree is the root: parent, depth, score and mask are bucket 1's initial values
            b.parents[:n].copy_(tree.parents)
            b.depths[:n].copy_(tree.depths)
            b.scores[:n].copy_(tree.scores)
            b.ancestors[:n, :n].copy_(tree.ancestors)
            b.n.fill_(n)
        self.prefix.fill_(prefix_len)
        return b

    def _padded_forward(self, b: _TreeBucket) -> tuple[Tree, torch.Tensor, torch.Tensor | None]:
        """The forward over a bucket's staged tree (inside its graphs)."""
        valid = b.index < b.n
        ancestors = (b.ancestors & valid[:, None] & valid[None, :]) | b.eye  # padding sees only itself
        tree = Tree(b.tokens, b.parents, b.depths, b.scores, ancestors, b.path_len - 1)
        batch = ForwardBatch(b.tokens, self.prefix + b.depths, ancestors, self.prefix)
        hidden, taps = self.target(batch, self.kv, self.tap_layers)
        return tree, hidden, taps

    def _greedy_round(self, b: _TreeBucket) -> PackedRound:
        tree, hidden, taps = self._padded_forward(b)
        choices = target_choices(self.target.logits(hidden), GREEDY, None)
        return finish_round(tree, choices, self.kv, self.prefix, taps, self.anchor, b.n, b.path_len)

    def forward(self, tree: Tree, prefix_len: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Forward the tree's nodes after `prefix_len` committed tokens; node i's K/V land at
        prefix_len + i. Returns (final hidden [n, H], taps [n, taps*H] or None)."""
        if not self.use_graphs:
            batch = ForwardBatch(tree.tokens, prefix_len + tree.depths, tree.ancestors, prefix_len)
            return self.target(batch, self.kv, self.tap_layers)
        n = tree.size
        b = self._stage(tree, prefix_len)
        if b.forward_graph is None:
            b.forward_graph, b.forward_out = capture(lambda: self._padded_forward(b)[1:], self.device, self._pool)
        b.forward_graph.replay()
        hidden, taps = b.forward_out
        return hidden[:n], (taps[:n] if taps is not None else None)

    def round(
        self, tree: Tree, prefix_len: int, sampling: SamplingParams, generator: torch.Generator | None, mark
    ) -> PackedRound:
        """Verify the tree and finish the round (finish_round): accept, commit the K/V rows, pack
        the integers, set the anchor. `mark(phase)` closes the verify phase: after the graph on
        the CUDA greedy path (which holds the acceptance too), else after the target's choices."""
        if self.use_graphs and sampling.greedy:
            b = self._stage(tree, prefix_len)
            if b.round_graph is None:
                b.round_graph, b.round_out = capture(lambda: self._greedy_round(b), self.device, self._pool)
            b.round_graph.replay()
            mark("verify_ms")
            return b.round_out
        # Sampling draws from a torch.Generator on the host side of the graph; the CPU has no graphs.
        hidden, taps = self.forward(tree, prefix_len)
        choices = target_choices(self.target.logits(hidden), sampling, generator)
        mark("verify_ms")
        return finish_round(tree, choices, self.kv, prefix_len, taps, self.anchor)


class DraftRunner:
    """The draft forward, and (for fixed-shape tree algorithms) the tree built from it, in one
    graph per (depth, tree shape): the context length is a device scalar and the draft's
    attention kernel reads only the rows it needs, so no graph depends on the context."""

    def __init__(
        self, head: DraftHead, cache: DraftKVCache, embed: torch.nn.Embedding, lm_head_weight: torch.Tensor,
        anchor: torch.Tensor,
    ):
        self.head, self.cache, self.embed, self.lm_head_weight = head, cache, embed, lm_head_weight
        self.device = cache.k.device
        self.use_graphs = self.device.type == "cuda"
        # The graphs' anchor input is the engine's device anchor, which the verify step sets:
        # a round's draft starts without any copy.
        self.anchor = anchor
        self.length = torch.zeros((), dtype=torch.long, device=self.device)
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, object]] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None

    def _logp(self, anchor: torch.Tensor, depth: int, length) -> torch.Tensor:
        logits = self.head.draft_logits(self.cache, anchor, depth, self.embed, self.lm_head_weight, length)
        return torch.log_softmax(logits, dim=-1)

    def _replay(self, key: tuple, fn: Callable[[], object], anchor: torch.Tensor):
        if anchor is not self.anchor:  # another root (the bench's)
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

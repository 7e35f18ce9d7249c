"""Static-buffer runners for the two forwards of a round, CUDA-graphed on the GPU.

VerifyRunner: the target forward over a tree (or one AR token), per tree-size bucket; the same
graph also takes the target's choices (argmax, or samples from uniforms drawn before the replay)
and finishes the round (accept, KV commit, packing).
DraftRunner: the draft head's block forward (through lm_head and log-softmax) and the tree
built from it, per depth and tree shape. Each bucket is captured once and replayed; lengths are read from device
scalars, so one graph serves every context length, turn and budget mapping to the bucket.
Elsewhere (CPU) the same functions run eagerly on exact sizes.

A greedy round with a fixed-shape tree on CUDA is two graph replays and one copy (a sampling
round adds the draw of its uniforms, and a write of the temperature or top_p when they change): the draft
graph (draft forward, tree build, and the tree written straight into the verify bucket's static
inputs) and the verify graph (target forward, accept, KV commit, draft-context append (an AR
round holds its row instead: VerifyRunner), lengths and anchor advanced on the device, packing);
then the packed integers go to the host.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..kernels import top_log_probs
from .accept import DraftAppend, PackedRound, finish_round, target_choices
from .sampling import sample, uniforms
from .draft_head import DraftHead, DraftKVCache
from .kv_cache import PagedKVCache
from .model import ForwardBatch, TargetModel
from .params import SamplingParams
from .tree import FIXED_SHAPE_ALGOS, TREE_BUILDERS, Tree, build_accum_top, fixed_tree_size, fixed_tree_width

TREE_BUCKETS = (1, 16, 32, 64, 128, 256, 512, 1024)
SCRATCH_ROWS = TREE_BUCKETS[-1]  # KV rows past the context limit reserved for one padded tree

# What a verify-round graph bakes in of the sampling parameters: None for greedy, else (top_k,
# whether top_p < 1). The temperature and top_p themselves are device scalars (VerifyRunner).
RoundKey = tuple[int, bool] | None


def round_key(sampling: SamplingParams) -> RoundKey:
    return None if sampling.greedy else (sampling.top_k, sampling.top_p < 1.0)


def bucket_for(n: int, buckets: tuple[int, ...]) -> int:
    return next(b for b in buckets if b >= n)


def capture(
    fn: Callable[[], object], device: torch.device, pool, keep: tuple[torch.Tensor, ...] = ()
) -> tuple[torch.cuda.CUDAGraph, object]:
    """Warm fn up on a side stream (Triton compiles, the allocator settles), then capture it.
    `keep`: state fn advances (lengths, the anchor), put back after each warm-up run, so the
    warm-ups neither run past the caches' scratch rows nor leave the state a round ahead."""
    saved = [t.clone() for t in keep]

    def restore():
        for t, v in zip(keep, saved):
            t.copy_(v)

    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
            restore()
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
        # Initial values are a root-only tree, which bucket 1 keeps (see load).
        self.parents = torch.full((size,), -1, dtype=torch.long, device=device)
        self.depths = torch.zeros(size, dtype=torch.long, device=device)
        self.scores = torch.zeros(size, dtype=torch.float32, device=device)
        self.eye = torch.eye(size, dtype=torch.bool, device=device)
        self.ancestors = self.eye.clone()
        self.n = torch.ones((), dtype=torch.long, device=device)
        self.index = torch.arange(size, device=device)
        self.uniforms = torch.zeros(size, dtype=torch.float64, device=device)  # one per node, sampling rounds
        self.path_len = path_len
        self.forward_graph: torch.cuda.CUDAGraph | None = None
        self.forward_out: tuple[torch.Tensor, torch.Tensor | None] | None = None
        # per (round_key, whether an AR round holds its draft-context row: VerifyRunner.round)
        self.rounds: dict[tuple[RoundKey, bool], tuple[torch.cuda.CUDAGraph, PackedRound]] = {}
        # A recurrent cache's handles on the graphs' own tensors (HybridCache.stash / last_round
        # as each capture left them; each replay rewrites those tensors).
        self.forward_stash = None
        self.round_commits: dict[tuple[RoundKey, bool], tuple | None] = {}

    @property
    def root_only(self) -> bool:
        """Bucket 1: the root alone (AR rounds), with no padding."""
        return self.index.shape[0] == 1

    def load(self, tree: Tree) -> None:
        """Write a tree into the static inputs (device to device; inside the draft graph for
        fixed-shape trees, else the eager staging)."""
        n = tree.size
        self.tokens[:n].copy_(tree.tokens)
        if n > 1:  # a one-node tree is the root: parent, depth, score and mask are bucket 1's initial values
            self.parents[:n].copy_(tree.parents)
            self.depths[:n].copy_(tree.depths)
            self.scores[:n].copy_(tree.scores)
            self.ancestors[:n, :n].copy_(tree.ancestors)
            self.n.fill_(n)


class VerifyRunner:
    """The target forward over a tree (K/V written after the committed prefix). On CUDA, trees
    are padded to a bucket whose padding nodes see only themselves (and the prefix), write K/V
    into scratch rows and are never accepted; per bucket one graph for the forward alone and,
    per round_key, one for the whole verify step: forward, logits, the target's choices (argmax,
    or sampling.sample from the bucket's uniforms and the runner's temperature and top_p device
    scalars) and finish_round (accept, KV commit, draft-context append, lengths, packing, the
    next anchor), so a round needs no launches after the replay but its one device->host copy.

    The committed length is read from `kv.device_length` (advanced by finish_round), and a
    tree's positions are computed from it inside the graphs. `anchor` is the engine's 0-d
    device scalar for the next round's root, which finish_round sets to the bonus token; the
    greedy graph reads the root token from it (capture puts it back after the warm-ups).

    The draft-context append of the accepted rows (finish_round's `draft_append`) sits at the
    end of this graph rather than at the start of the draft graph: the path and the taps are
    made here (each bucket's graph has its own taps buffer, which a draft graph would have to
    pick by the last round's bucket). A graphed AR round (`hold`: no draft forward, one accepted
    row) only keeps that row's taps (DraftKVCache.hold, one copy) instead of the ~10 kernels of
    the append; `append_held` projects the held rows in one fixed-size append (its own graph),
    which the engine runs before the next draft forward or prefill append, and every
    held_rows AR rounds. The eager path (CPU, recurrent caches, which roll back inside a round)
    appends in every round: finish_round with `draft_append`."""

    def __init__(
        self, target: TargetModel, kv: PagedKVCache, tap_layers: tuple[int, ...], anchor: torch.Tensor, max_depth: int,
        draft_kv: DraftKVCache | None = None, draft_append: DraftAppend | None = None,
    ):
        self.target, self.kv, self.tap_layers, self.anchor = target, kv, tap_layers, anchor
        self.draft_kv, self.draft_append = draft_kv, draft_append
        self.max_path = max_depth + 1  # no tree is deeper than the draft head drafts
        self.device = kv.device_length.device
        self.use_graphs = self.device.type == "cuda"
        # A recurrent cache (HybridCache) also holds the committed state and conv windows, which
        # the round graph's commit rewrites, and per round a stash of the nodes' operands that
        # the host keeps a handle on for a rollback inside the round (HybridCache.replayed).
        self.recurrent = getattr(kv, "recurrent", False)
        self._buckets: dict[int, _TreeBucket] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        # The sampling graphs' temperature and top_p, written when an answer changes them.
        self.temperature = torch.ones((), dtype=torch.float32, device=self.device)
        self.top_p = torch.ones((), dtype=torch.float64, device=self.device)
        self._loaded: tuple[float, float] | None = None
        self._held_graph: tuple[torch.cuda.CUDAGraph, object] | None = None  # append_held's

    def bucket(self, n: int) -> _TreeBucket:
        """The static inputs for trees of n nodes (created on first use)."""
        size = bucket_for(n, TREE_BUCKETS)
        b = self._buckets.get(size)
        if b is None:
            # A tree of n <= size nodes is at most size - 1 deep: its path fits in min(size, max_path).
            b = self._buckets[size] = _TreeBucket(size, min(size, self.max_path), self.device)
        return b

    def _stage(self, tree: Tree) -> _TreeBucket:
        """Copy the tree into its bucket's static inputs (eager launches: trees the draft graph
        did not write, i.e. non-fixed-shape algorithms and the bench's)."""
        b = self.bucket(tree.size)
        b.load(tree)
        return b

    def _padded_forward(self, b: _TreeBucket, tokens: torch.Tensor | None = None) -> tuple[Tree, torch.Tensor, torch.Tensor | None]:
        """The forward over a bucket's staged tree (inside its graphs); `tokens`: in place of
        the bucket's (the round graph's root-only tree reads the anchor itself)."""
        tokens = b.tokens if tokens is None else tokens
        prefix = self.kv.device_length
        if b.root_only:
            # Bucket 1: the root alone, which sees itself, at the committed length (no mask or
            # position kernels; the positions are a view of the length, read before the round
            # advances it).
            ancestors, positions = b.eye, prefix.reshape(1)
        else:
            valid = b.index < b.n
            ancestors = (b.ancestors & valid[:, None] & valid[None, :]) | b.eye  # padding sees only itself
            positions = prefix + b.depths
        tree = Tree(tokens, b.parents, b.depths, b.scores, ancestors, b.path_len - 1)
        batch = ForwardBatch(tokens, positions, ancestors, prefix)
        hidden, taps = self.target(batch, self.kv, self.tap_layers)
        return tree, hidden, taps

    def _hold(self, taps: torch.Tensor, count: torch.Tensor) -> None:
        """An AR round's draft_append: keep the row (DraftKVCache.hold) for `append_held`."""
        self.draft_kv.hold(self.kv.device_length, taps, count)

    def append_held(self) -> None:
        """Append the rows that AR rounds held (DraftKVCache.hold) to the draft context: one
        fixed-size append (`draft_append`) of all held_rows rows, committed length - draft
        length of them real, read on the device (graphed once, replayed). The host's count and
        length are the caller's."""
        d = self.draft_kv
        fn = lambda: self.draft_append(d.held_taps, self.kv.device_length - d.device_length)
        if not self.use_graphs:
            fn()
            return
        if self._held_graph is None:
            self._held_graph = capture(fn, self.device, self._pool, (d.device_length,))
        self._held_graph[0].replay()

    def _graph_round(self, b: _TreeBucket, key: RoundKey, hold: bool) -> PackedRound:
        # The root is the anchor: a drafted tree gets its root token here, in the graph; the AR
        # round's tree (bucket 1) is a view of the anchor (read before finish_round sets it).
        if b.root_only:
            tree, hidden, taps = self._padded_forward(b, self.anchor.reshape(1))
        else:
            b.tokens[:1].copy_(self.anchor)
            tree, hidden, taps = self._padded_forward(b)
        if key is None:
            choices = self.target.greedy(hidden)
        else:
            top_k, nucleus = key
            choices = sample(self.target.logits(hidden), self.temperature, self.top_p if nucleus else 1.0, top_k,
                             b.uniforms)
        append = self._hold if hold else self.draft_append
        return finish_round(tree, choices, self.kv, taps, self.anchor, append, b.n, b.path_len)

    def _load_sampling(self, sampling: SamplingParams) -> None:
        """Write the temperature and top_p into the graphs' device scalars if they changed."""
        values = (sampling.temperature, sampling.top_p)
        if values != self._loaded:
            self.temperature.fill_(sampling.temperature)
            self.top_p.fill_(sampling.top_p)
            self._loaded = values

    def forward(self, tree: Tree) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Forward the tree's nodes after the kv.length committed tokens; node i's K/V land at
        kv.length + i. Returns (final hidden [n, H], taps [n, taps*H] or None)."""
        if not self.use_graphs:
            prefix_len = self.kv.length
            batch = ForwardBatch(tree.tokens, prefix_len + tree.depths, tree.ancestors, prefix_len)
            return self.target(batch, self.kv, self.tap_layers)
        n = tree.size
        b = self._stage(tree)
        if b.forward_graph is None:
            b.forward_graph, b.forward_out = capture(lambda: self._padded_forward(b)[1:], self.device, self._pool)
            b.forward_stash = getattr(self.kv, "stash", None)
        b.forward_graph.replay()
        if self.recurrent:  # the eager commit after this forward reads this graph's stash
            self.kv.stash = b.forward_stash
        hidden, taps = b.forward_out
        return hidden[:n], (taps[:n] if taps is not None else None)

    def round(
        self, tree: Tree, staged: bool, sampling: SamplingParams, generator: torch.Generator | None, mark,
        hold: bool = False,
    ) -> PackedRound:
        """Verify the tree and finish the round (finish_round). `staged`: the tree is already in
        its bucket's inputs (the draft graph wrote it, or it is the root-only tree, whose token
        the round graph reads from the anchor). `hold` (graph path, root-only trees): the round
        keeps its accepted row's taps for `append_held` instead of appending it. `mark(phase)`
        closes the verify phase: after the graph on the CUDA path (which holds the acceptance
        too), else after the target's choices. Sampling: one uniform per node from `generator`,
        drawn before the replay (the graph holds no generator state), so a seed gives the same
        answer every time."""
        if self.use_graphs:
            b = self.bucket(tree.size) if staged else self._stage(tree)
            key = round_key(sampling)
            if key is not None:
                self._load_sampling(sampling)
                uniforms(b.uniforms.shape[0], generator, self.device, out=b.uniforms)
            assert not hold or (tree.size == 1 and self.draft_kv is not None)
            graph_key = (key, hold)
            if graph_key not in b.rounds:
                keep = (self.anchor, self.kv.device_length) + ((self.draft_kv.device_length,) if self.draft_kv else ())
                if self.recurrent:  # the warm-ups commit: put the committed state back too
                    keep += (self.kv.conv, self.kv.state)
                b.rounds[graph_key] = capture(lambda: self._graph_round(b, key, hold), self.device, self._pool, keep)
                b.round_commits[graph_key] = self.kv.last_round if self.recurrent else None
            graph, out = b.rounds[graph_key]
            graph.replay()
            if self.recurrent:  # this round's commit, for a rollback inside it
                self.kv.replayed(b.round_commits[graph_key])
            mark("verify_ms")
            return out
        assert not hold
        hidden, taps = self.forward(tree)
        choices = target_choices(self.target.logits(hidden), sampling, generator)
        mark("verify_ms")
        return finish_round(tree, choices, self.kv, taps, self.anchor, self.draft_append)


class DraftRunner:
    """The draft forward, and (for fixed-shape tree algorithms) the tree built from it, in one
    graph per (depth, tree shape) that also writes the tree into the verify bucket's static
    inputs: the context length is the draft cache's device scalar (advanced by the verify
    step) and the draft's attention kernel reads only the rows it needs, so no graph depends on
    the context and a round launches nothing between the draft and verify replays."""

    def __init__(self, head: DraftHead, cache: DraftKVCache, target: TargetModel, anchor: torch.Tensor, verify: VerifyRunner):
        # The head drafts through the target's embedding and lm_head (under tensor parallelism
        # this rank's vocabulary rows, gathered: target.vocab_split).
        self.head, self.cache, self.target = head, cache, target
        self.verify = verify
        self.device = cache.k.device
        self.use_graphs = self.device.type == "cuda"
        # The graphs' anchor input is the engine's device anchor, which the verify step sets:
        # a round's draft starts without any copy.
        self.anchor = anchor
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, object]] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None

    def _logits(self, anchor: torch.Tensor, depth: int, length, upcast: bool = True) -> torch.Tensor:
        t = self.target
        return self.head.draft_logits(self.cache, anchor, depth, t.model.embed_tokens, t.lm_head_weight(), length,
                                      t.vocab_split, upcast)

    def _logp(self, anchor: torch.Tensor, depth: int, length) -> torch.Tensor:
        return torch.log_softmax(self._logits(anchor, depth, length), dim=-1)

    def _replay(self, key: tuple, fn: Callable[[], object], anchor: torch.Tensor):
        if anchor is not self.anchor:  # another root (the bench's)
            self.anchor.copy_(anchor)
        if key not in self._graphs:
            self._graphs[key] = capture(fn, self.device, self._pool)
        graph, out = self._graphs[key]
        graph.replay()
        return out

    def logp(self, anchor: torch.Tensor, depth: int) -> torch.Tensor:
        """Draft log-probs [depth, vocab] (fp32) for the block after `anchor`."""
        if not self.use_graphs:
            return self._logp(anchor, depth, self.cache.length)
        return self._replay(("logp", depth), lambda: self._logp(self.anchor, depth, self.cache.device_length), anchor)

    def tree(self, anchor: torch.Tensor, depth: int, algo: str, budget: int, width: int, mark) -> tuple[Tree, bool]:
        """The draft tree for the block after `anchor`, and whether it is already staged in its
        verify bucket. Graphed together with the draft when the algorithm has fixed shapes (then
        the tree phase reads 0 ms: it is inside the draft's), and then the same graph writes it
        into the bucket: the key fixes the tree's size, hence its bucket, at capture time.
        The graph takes each depth's top-k straight from the draft's logits (`top_log_probs`:
        no whole-vocabulary log-softmax or sort) and builds with `build_accum_top`.
        `mark(phase)` closes a timing phase."""
        if not self.use_graphs or algo not in FIXED_SHAPE_ALGOS:
            logp = self.logp(anchor, depth)
            mark("draft_ms")
            tree, staged = TREE_BUILDERS[algo](anchor, logp, budget, width), False
        else:
            vocab = self.target.cfg.vocab_size
            size = fixed_tree_size(algo, budget, width, depth, vocab)
            k = fixed_tree_width(algo, width, vocab)
            b = self.verify.bucket(size)  # created here, outside the capture's side stream

            def fn() -> Tree:
                # the lm_head's bf16 logits as they are: top_log_probs widens them as it reads
                logits = self._logits(self.anchor, depth, self.cache.device_length, upcast=False)
                top_lp, top_tok = top_log_probs(logits, k)
                t = build_accum_top(self.anchor, top_lp, top_tok, budget)
                assert t.size == size
                b.load(t)
                return t

            tree, staged = self._replay(("tree", depth, algo, budget, width), fn, anchor), True
            mark("draft_ms")
        mark("tree_ms")
        return tree, staged

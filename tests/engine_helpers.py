"""Shared helpers for engine tests: tiny random engines, the transformers oracle, and an
"oracle draft" that lets a random-weight model accept long paths."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from jetspec_chat.engine import FinishEvent, GenerationParams, RoundEvent, SamplingParams, SpecParams, load_engine
from jetspec_chat.engine import graphs
from jetspec_chat.kernels import paged_tree_attention_ref
from jetspec_chat.engine.models.oracle import transformers_model


# The tree grid the lossless tests run: chains, wide and deep trees, every algorithm.
TREE_GRID = [  # (budget, width, depth, algo)
    (1, 1, None, "accum_logp"),
    (2, 2, None, "accum_logp"),
    (16, 4, None, "accum_logp"),
    (64, 8, None, "accum_logp"),
    (16, 3, 2, "accum_logp"),
    (64, 1, None, "chain"),
    (16, 4, None, "adaptive"),
    (64, 8, 5, "adaptive"),
]


@functools.cache
def _cached_engine(name: str, head: str | None, max_context: int):
    return load_engine(f"random:{name}", head, device="cpu", dtype="float32", max_context=max_context)


def tiny_engine(name: str = "tiny-qwen3", head: str | None = None, max_context: int = 1024):
    """A tiny random engine, reset (shared across tests: loading costs more than the tests)."""
    engine = _cached_engine(name, head, max_context)
    engine.reset()
    return engine


def run(engine, prompt_ids, cancel=None, **kw):
    """Generate with keyword shortcuts (budget=, width=, temperature=, ...); returns (events, result)."""
    spec_keys = {"budget", "depth", "width", "tree_algo", "enabled"}
    samp_keys = {"temperature", "top_p", "top_k", "seed"}
    spec = SpecParams(**{k: v for k, v in kw.items() if k in spec_keys})
    sampling = SamplingParams(**{k: v for k, v in kw.items() if k in samp_keys})
    rest = {k: v for k, v in kw.items() if k not in spec_keys | samp_keys}
    events = list(engine.generate(prompt_ids, GenerationParams(spec=spec, sampling=sampling, **rest), cancel))
    assert isinstance(events[-1], FinishEvent)
    return events, events[-1].result


@functools.cache
def hf_model(name: str):
    return transformers_model(tiny_engine(name))


def hf_greedy(name: str, prompt_ids: list[int], n: int) -> list[int]:
    """transformers' greedy answer on the same weights (the model is built once per name)."""
    model, engine = hf_model(name), _cached_engine(name, None, 1024)
    eos = sorted(engine.stop_token_ids)
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                             pad_token_id=eos[0], temperature=None, top_p=None, top_k=None)
    return out[0, len(prompt_ids):].tolist()


def random_prompt(seed: int, length: int, vocab: int = 256) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (length,), generator=g).tolist()


class OracleDraft:
    """Replaces the draft head with one that knows the target: at each depth it returns the
    target's own next-token logits (sharpened) along the target's greedy continuation, except
    that with probability `error_rate` the right token is demoted to rank 2-4. So drafts are
    often right, sometimes right only on a side branch: this exercises long accepted paths,
    branching, the KV commit and the draft-context bookkeeping on random-weight models. The
    engine under test still decides acceptance itself; losslessness must hold whatever the
    draft says. Target logits are cached per prefix, so tests stay fast."""

    def __init__(self, engine, model, error_rate: float, seed: int = 0):
        self.engine, self.model, self.error_rate = engine, model, error_rate
        self.gen = torch.Generator().manual_seed(seed)
        self.original = engine.head.draft_logits
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}

    def _target_logits(self, ids: tuple[int, ...]) -> torch.Tensor:
        if ids not in self._cache:
            with torch.inference_mode():
                logits = self.model(torch.tensor([ids])).logits[0, -1].float()
            self._cache[ids] = (logits - logits.mean()) / logits.std() * 3.0
        return self._cache[ids]

    def __call__(self, cache, anchor, depth, embed, lm_head_weight, length=None, vocab_split=None, upcast=True):
        ids = list(self.engine.tokens)
        assert ids[-1] == int(anchor)
        out = []
        for _ in range(depth):
            logits = self._target_logits(tuple(ids)).clone()
            top = logits.topk(5)
            true = int(top.indices[0])
            if float(torch.rand((), generator=self.gen)) < self.error_rate:
                rank = int(torch.randint(1, 4, (), generator=self.gen))  # 0-based rank 1..3
                logits[true] = top.values[rank] - 1e-3
            out.append(logits)
            ids.append(true)
        return torch.stack(out)

    def __enter__(self):
        # It reads the host's committed tokens, which a queued round's draft would outrun.
        self.engine.head.draft_logits, self.engine.queue_rounds = self, False
        return self

    def __exit__(self, *exc):
        self.engine.head.draft_logits, self.engine.queue_rounds = self.original, True


class NoHostReads(TorchDispatchMode):
    """Fails on ops that read a tensor's value on the host (.item(), int(), a 0-d tensor used
    as an index) or whose output shape depends on values: on CUDA they sync, and a graph
    capture rejects them. Functions in `exempt` (and what they call) may."""

    BANNED = frozenset({torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default,  # item: inference mode
                        torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default})

    def __init__(self, exempt=()):
        super().__init__()
        self.exempt = {f.__code__ for f in exempt}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.BANNED and not self._exempt_caller():
            raise AssertionError(f"{func} reads a device value on the host")
        return func(*args, **(kwargs or {}))

    def _exempt_caller(self) -> bool:
        frame = sys._getframe()
        while frame is not None:
            if frame.f_code in self.exempt:
                return True
            frame = frame.f_back
        return False


class _EmulatedGraph:
    """A CUDA graph's contract on the CPU: replay reruns the captured function and writes its
    results into the tensors the capture returned (static outputs, overwritten each replay)."""

    def __init__(self, fn):
        self.fn = fn

    def replay(self) -> None:
        _copy_into(self.out, self.fn())


def _copy_into(dst, src) -> None:
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
    elif isinstance(dst, (tuple, list)):
        for d, s in zip(dst, src):
            _copy_into(d, s)
    elif dataclasses.is_dataclass(dst):
        for f in dataclasses.fields(dst):
            _copy_into(getattr(dst, f.name), getattr(src, f.name))
    # ints and None are fixed by the capture


def _emulated_capture(fn, device, pool, keep=()):
    saved = [t.clone() for t in keep]

    def restore():  # as graphs.capture: the state the runs advance is put back after each
        for t, v in zip(keep, saved):
            t.copy_(v)

    for _ in range(2):  # the warm-up runs, with their side effects
        fn()
        restore()
    graph = _EmulatedGraph(fn)
    # On the CPU the attention reference reads the prefix length on the host (Triton reads it
    # on the device) and the tests' oracle draft reads the anchor: neither is in a CUDA graph.
    with NoHostReads(exempt=(paged_tree_attention_ref, OracleDraft.__call__)):  # what a capture rejects
        graph.out = fn()
    restore()  # a real capture records without running
    return graph, graph.out


@contextlib.contextmanager
def emulated_graphs(engine):
    """Run the engine's CUDA-graph code path on the CPU (bucket padding, static inputs and
    outputs, the verify step's finish_round on padded trees), with emulated graphs whose
    capture fails on host reads of device values."""
    engine.allocate()
    runners = [r for r in (engine.verify, engine.drafter) if r is not None]
    saved = graphs.capture
    graphs.capture = _emulated_capture
    for r in runners:
        r.use_graphs = True
    try:
        yield
    finally:
        graphs.capture = saved
        for r in runners:
            r.use_graphs = False
        engine.verify._buckets.clear()
        engine.verify._held_graph = None
        if engine.drafter is not None:
            engine.drafter._graphs.clear()


class RoundLaunches(TorchDispatchMode):
    """What the host issues around the graphs: counts graph replays (real CUDA graphs or the
    emulated ones) and records every tensor op dispatched outside a replay, except views and
    conjugation bookkeeping (no kernel). On CUDA, ops inside a replay are not dispatched at
    all; on the CPU, the emulated replay's own ops are skipped. `host_ops` then lists the eager
    launches and the device->host copies (a copy into a host buffer, or `aten.to`)."""

    # No kernel: conjugation bookkeeping, and the allocation of the host buffer a copy fills.
    FREE = frozenset({"aten.resolve_conj.default", "aten.resolve_neg.default", "aten.empty.memory_format"})

    def __init__(self):
        super().__init__()
        self.replays = 0
        self.host_ops: list[str] = []
        self._inside = 0

    def _wrap(self, cls):
        original = cls.replay

        def replay(graph):
            self.replays += 1
            self._inside += 1
            try:
                original(graph)
            finally:
                self._inside -= 1

        cls.replay = replay
        return original

    def __enter__(self):
        classes = [_EmulatedGraph] + ([torch.cuda.CUDAGraph] if torch.cuda.is_available() else [])
        self._saved = [(cls, self._wrap(cls)) for cls in classes]
        return super().__enter__()

    def __exit__(self, *exc):
        for cls, original in self._saved:
            cls.replay = original
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name == "aten.copy_.default" and args[0].device.type == "cpu":
            name = self.COPY  # into a host buffer: the round's copy to the host
        # aten.to is schema-wise an alias (a no-op on the same device), but the copy to the host.
        if not self._inside and (self._is_copy(name) or not func.is_view and name not in self.FREE):
            self.host_ops.append(name)
        return func(*args, **(kwargs or {}))

    COPY = "copy to the host"

    @classmethod
    def _is_copy(cls, name: str) -> bool:
        return name == cls.COPY or name.startswith(("aten.to.", "aten._to_copy."))

    @property
    def copies_to_host(self) -> int:
        return sum(map(self._is_copy, self.host_ops))

    @property
    def launches(self) -> list[str]:
        """Host ops other than the copies."""
        return [op for op in self.host_ops if not self._is_copy(op)]


def assert_launches_per_round(
    rounds: list[tuple[int, int, list[str]]], replays: int, ops: int = 0, held_rows: int | None = None
) -> None:
    """round_launches' records of one answer: each round launched `replays` graph replays, its
    one copy to the host and `ops` other host ops. The round after next is queued before a round
    is collected, so the first event's record holds two rounds' launches, the next ones one
    each, and the last ones none (a round that could end the answer by its length queues
    none; one may be dropped where the answer ends at a stop token). `held_rows`: AR rounds
    that hold their draft-context row, so the launch of every (held_rows + 1)-th one (after the
    prefill's) also replays the held rows' append graph."""
    assert len(rounds) > 2, rounds
    launched = [copies for _, copies, _ in rounds]  # one copy a round
    appends = [0] * len(rounds)
    if held_rows is not None:
        cumulative = list(itertools.accumulate(launched))
        appends = [(c - 1) // held_rows - (p - 1) // held_rows for p, c in zip([1] + cumulative, cumulative)]
        assert sum(appends) > 0, rounds  # the answer is long enough to show them
    assert [r for r, _, _ in rounds] == [k * replays + a for k, a in zip(launched, appends)], rounds
    assert [len(o) for _, _, o in rounds] == [k * ops for k in launched], rounds
    assert launched[0] == 2 and set(launched[1:-2]) <= {1} and launched[-1] == 0, rounds
    assert sum(launched) in (len(rounds), len(rounds) + 1), rounds


def round_launches(engine, prompt, params) -> list[tuple[int, int, list[str]]]:
    """Per round of one answer, after a first answer captured its graphs: (graph replays,
    device->host copies, other host ops)."""
    list(engine.generate(prompt, params))
    engine.reset()
    events = engine.generate(prompt, params)
    next(events)  # the prefill
    out = []
    while True:
        with RoundLaunches() as rec:
            event = next(events)
        if not isinstance(event, RoundEvent):
            return out
        out.append((rec.replays, rec.copies_to_host, rec.launches))


def run_two_ranks(target, out: str):
    """target(rank, port, out) in two spawned processes (a rank each, on a free port); both must
    exit 0. Returns what rank 0 saved to `out` (torch.save)."""
    from jetspec_chat.engine.tp_launcher import _free_port

    port = _free_port()
    ctx = torch.multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    return torch.load(out)


def spec_change_rounds(engine, prompt, params, changes) -> list:
    """Round events of one answer; `changes` maps a round index to the spec from the next round."""
    out = []
    for ev in engine.generate(prompt, params):
        if isinstance(ev, RoundEvent):
            out.append(ev)
            if ev.index in changes:
                engine.update_spec(changes[ev.index])
    return out


def held_rows_scenario(engine, drafts: list, graphs_context) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Two answers on the graph path mixing drafting rounds, AR rounds (spec off, budget 1) past
    held_rows of them and live changes between them, then a second prompt whose reused prefix
    ends inside the held rows (its prefill rolls back, appends what is held and its own rows).
    `drafts` gets (committed length, draft length) on the device at every draft forward.
    `graphs_context`: emulated_graphs(engine) on the CPU, a null context on CUDA. Returns
    the draft cache's K and V rows [0, draft length), the committed length and the rows held at
    the end of the first answer."""
    spec, ar, budget_1 = SpecParams(budget=16, width=4), SpecParams(enabled=False), SpecParams(budget=1)
    engine.allocate()
    tree = engine.drafter.tree

    def recorded_tree(*args, **kwargs):
        drafts.append((int(engine.kv.device_length), int(engine.draft_kv.device_length)))
        return tree(*args, **kwargs)

    engine.reset()
    engine.drafter.tree = recorded_tree
    try:
        with graphs_context:
            prompt = random_prompt(305, 12)
            spec_change_rounds(engine, prompt, GenerationParams(max_new_tokens=47, spec=spec), {1: ar, 13: spec, 15: budget_1})
            held = engine.draft_kv.held
            second = engine.tokens[: engine.kv.length - 2] + random_prompt(306, 5)
            spec_change_rounds(engine, second, GenerationParams(max_new_tokens=30, spec=ar), {10: spec, 12: budget_1})
    finally:
        del engine.drafter.tree
    d = engine.draft_kv
    assert d.length + d.held == engine.kv.length  # no round in flight
    return d.k[:, : d.length].clone(), d.v[:, : d.length].clone(), engine.kv.length, held


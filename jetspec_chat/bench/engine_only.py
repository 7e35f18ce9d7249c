"""Engine-only benchmark: copy bandwidth, one AR step, one verify per tree size, one draft forward
and one whole round per context length, GPU idle inside a round; with the ratios to report.
Timed through the engine's own entry points (`engine.verify.forward`, `engine.drafter.logp`,
`engine.round`), so whatever the engine does (CUDA graphs, Triton kernels) is what gets timed.
GPU timings use CUDA events after a device sync (a sample is one call's latency including its host
launch overhead); CPU timings use the wall clock."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from ..engine.errors import ConfigError
from ..engine.models.loader import default_max_context
from ..engine.params import DEFAULT_WIDTH, MAX_BUDGET, GenerationParams, SpecParams
from ..engine.tree import build_accum_logp, root_only
from .gpu_idle import GpuIdle, measure_gpu_idle
from .moe_bytes import expected_distinct_experts, expected_weight_bytes
from .report import options_dict
from .timing import (
    ProgressFn,
    Stat,
    environment,
    free_device_memory,
    measure_copy_bandwidth,
    peak_memory,
    peak_memory_reset,
    ratio,
    time_fn,
    weight_bytes,
)


@dataclass
class EngineOnlyOptions:
    models: list[str | None] = field(default_factory=lambda: ["random:Qwen/Qwen3-8B"])
    draft_head: str | None = None  # None: the model's own (random:Qwen/Qwen3-8B: 5 layers, block 16)
    device: str = "auto"
    dtype: str = "auto"
    contexts: tuple[int, ...] = (512, 2048, 8192)
    tree_sizes: tuple[int, ...] = (1, 16, 32, 64, 128, 256)
    round_budget: int = 128
    width: int = DEFAULT_WIDTH
    warmup: int = 5
    reps: int = 20
    copy_mib: int | None = None  # copy-bandwidth buffer; None: 1024 MiB on CUDA, 256 MiB on CPU
    profile_rounds: int = 5  # rounds under the torch profiler for the GPU idle analysis (CUDA only)
    bar_context: int | None = None  # context of the headline numbers; None: the smallest context
    seed: int = 0
    tp: int | None = None  # tensor-parallel ranks (one GPU each; None: load_engine's choice); every rank
    # runs the measurements, rank 0 reports

    def validate(self) -> None:
        if not self.models:
            raise ConfigError("give at least one model")
        if not self.contexts or any(c < 1 for c in self.contexts):
            raise ConfigError(f"contexts must be positive token counts, got {list(self.contexts)}")
        if not self.tree_sizes or any(not 1 <= n <= MAX_BUDGET for n in self.tree_sizes):
            raise ConfigError(f"tree sizes must be between 1 and {MAX_BUDGET}, got {list(self.tree_sizes)}")
        if not 1 <= self.round_budget <= MAX_BUDGET:
            raise ConfigError(f"round budget must be between 1 and {MAX_BUDGET}, got {self.round_budget}")
        if self.warmup < 0 or self.reps < 1:
            raise ConfigError(f"need warmup >= 0 and reps >= 1, got {self.warmup} and {self.reps}")
        if self.copy_mib is not None and self.copy_mib < 1:
            raise ConfigError(f"copy buffer must be at least 1 MiB, got {self.copy_mib}")
        if self.bar_context is not None and self.bar_context not in self.contexts:
            raise ConfigError(f"bar context {self.bar_context} is not one of the contexts {list(self.contexts)}")
        SpecParams(budget=self.round_budget, width=self.width).validate(None)

    @property
    def headline_context(self) -> int:
        return self.bar_context if self.bar_context is not None else min(self.contexts)


@dataclass
class VerifyResult:
    nodes: int
    ms: Stat
    over_ar_step: float  # verify ms / AR step ms at the same context
    weight_bytes: int  # weights N rows read: all of a dense model; a MoE's expected distinct experts
    experts_per_layer: float | None  # MoE: expected distinct experts per MoE layer (uniform routing)
    bound_ms: float  # (weight_bytes + recurrent state read and written) / copy bandwidth
    over_bound: float  # verify ms / bound_ms
    tree_state_bytes: int  # hybrid targets: the per-node operands kept for the commit (0 otherwise)


@dataclass
class ContextResult:
    context: int
    kv_bytes: int  # target K/V bytes an AR step reads at this context
    draft_kv_bytes: int | None  # draft-head context K/V bytes a draft forward reads
    ar_step_ms: Stat  # target forward of 1 token + logits + argmax
    ar_bound_ms: float  # (weights + recurrent state read and written) per step / copy bandwidth
    ar_bound_kv_ms: float  # plus K/V, / copy bandwidth
    state_bytes: int  # hybrid targets: the committed recurrent state (conv windows + fp32 states); 0 otherwise
    ar_step_over_bound: float
    ar_step_over_bound_kv: float  # against ar_bound_kv_ms: at long contexts the K/V is part of a step's bytes
    ar_round_ms: Stat  # engine._round with speculation off (the engine's real AR step)
    verify: list[VerifyResult]
    draft_ms: Stat | None  # one draft forward over the full block (engine.drafter.logp)
    draft_bound_ms: float | None  # (head weights + lm_head) / copy bandwidth
    draft_bound_kv_ms: float | None  # plus the draft context K/V
    draft_over_bound: float | None
    round_ms: Stat | None  # engine._round at round_budget: draft + tree + verify + accept + commit
    round_phases_ms: dict[str, float] | None  # medians of the engine's own per-phase timings
    round_tree_nodes: int | None


@dataclass
class Bars:
    """The headline numbers and ratios (one run, one device)."""

    context: int
    copy_bandwidth_gb_s: float
    ar_step_ms: float
    ar_bound_ms: float
    ar_step_over_bound: float
    ar_bound_kv_ms: float
    ar_step_over_bound_kv: float
    verify_ms: dict[int, float]  # at 128 and 256 nodes (those measured)
    verify_over_ar_step: dict[int, float]
    verify_over_bound: dict[int, float]  # verify ms / its weight-bytes bound (MoE: the expected experts')
    draft_ms: float | None
    draft_bound_ms: float | None
    draft_over_bound: float | None
    draft_long_context: int | None
    draft_long_ms: float | None
    draft_long_over_short: float | None  # draft at the largest context / at the smallest
    round_budget: int
    round_ms: float | None
    round_phases_ms: dict[str, float] | None
    gpu_idle_ms: float | None
    gpu_idle_fraction: float | None


@dataclass
class EngineOnlyResult:
    model: str
    draft_head: str | None
    device: str
    dtype: str
    copy_bytes: int  # buffer size; a copy reads and writes this many bytes
    copy_ms: Stat
    copy_bandwidth_gb_s: float  # (read + written) bytes / median copy time
    weight_bytes_per_ar_step: int  # target weights one token reads: lm_head included, one embedding row, k experts
    head_weight_bytes: int  # draft head weights + the target's lm_head
    contexts: list[ContextResult]
    bars: Bars
    gpu_idle: GpuIdle | None
    peak_memory_bytes: int | None
    load_seconds: float


@dataclass
class EngineOnlyReport:
    mode: str
    env: dict
    options: dict
    models: list[EngineOnlyResult]


def weight_bytes_per_ar_step(target) -> int:
    """Bytes of weights one AR step reads: every target weight once (lm_head included), but only
    one row of the input embedding (a tied lm_head still reads the full matrix) and, in a MoE
    layer, only the k routed experts (the active-weight floor)."""
    return round(expected_weight_bytes(target, 1))


def head_weight_bytes(engine) -> int:
    lm = engine.target.lm_head_weight()
    return weight_bytes(engine.head) + lm.numel() * lm.element_size()


def kv_bytes(num_layers: int, tokens: int, num_kv_heads: int, head_dim: int, element_size: int) -> int:
    return 2 * num_layers * tokens * num_kv_heads * head_dim * element_size


def recurrent_state_bytes(engine) -> int:
    """A hybrid target's committed recurrent state (every linear layer's conv window and fp32
    state), which each step reads and rewrites; 0 for attention-only targets."""
    return getattr(engine.kv, "committed_state_nbytes", 0)


def tree_state_bytes(engine, nodes: int) -> int:
    """What a hybrid target's verify of `nodes` nodes keeps for its commit (no per-node state:
    the nodes' recurrence operands); 0 for attention-only targets."""
    fn = getattr(engine.kv, "stash_nbytes", None)
    return fn(nodes) if fn is not None else 0


def bound_ms(nbytes: int, gb_s: float) -> float:
    """Milliseconds to stream `nbytes` at `gb_s` (1e9 bytes per second)."""
    return nbytes / (gb_s * 1e9) * 1e3


def _verify_forward(engine, tree, prefix: int):
    """A target forward over a tree's nodes, the way the engine runs it (its verify runner: the
    bucket's forward graph on the GPU), after the engine's committed length."""
    assert engine.kv.length == prefix
    return engine.verify.forward(tree)


def _draft_forward(engine, anchor: torch.Tensor, depth: int) -> torch.Tensor:
    """One draft forward over the current draft context, as the engine's round runs it: its
    draft runner (head forward + log-softmax; one CUDA graph on the GPU). Returns [depth, vocab]."""
    return engine.drafter.logp(anchor, depth)


def _random_tree(engine, nodes: int, width: int, gen: torch.Generator):
    """A tree of exactly `nodes` nodes from random draft log-probs (the engine's tree builder)."""
    device = engine.torch_device
    vocab = engine.target.cfg.vocab_size
    root = torch.randint(0, vocab, (), generator=gen).to(device)
    if nodes == 1:
        return root_only(root)
    depth = engine.max_depth or 15
    logp = torch.log_softmax(torch.randn(depth, vocab, generator=gen), dim=-1).to(device)
    tree = build_accum_logp(root, logp, nodes, width)
    if tree.size != nodes:
        raise ConfigError(f"a tree of {nodes} nodes does not fit depth {depth} at width {width}; raise --width")
    return tree


class _State:
    """A prepared engine state at a given context: KV and draft caches filled (random values)
    up to the context, anchor set. `restore()` puts it back after a round, so every timed round
    starts from the same state."""

    def __init__(self, engine, context: int, gen: torch.Generator):
        self.engine, self.context = engine, context
        vocab = engine.target.cfg.vocab_size
        self.tokens = torch.randint(0, vocab, (context + 1,), generator=gen).tolist()

    def restore(self) -> None:
        e, c = self.engine, self.context
        e.rollback(min(e.kv.length, c))
        e.kv.length = c
        e.tokens = list(self.tokens)
        e.anchor.fill_(self.tokens[-1])
        if e.draft_kv is not None:
            e.draft_kv.length = c


def _prepare_engine(engine, capacity: int, seed: int) -> None:
    """Allocate the caches and fill them with finite random values (uninitialized memory may
    hold NaNs; values do not change the timings, but NaNs could on some CPUs)."""
    engine.set_max_context(capacity)
    engine.reset()
    engine.allocate()
    gen = torch.Generator(device=engine.torch_device).manual_seed(seed)
    for pool in engine.kv.pools:  # a pool per K/V shape of the layers (Gemma 4 has two)
        pool.normal_(0.0, 1.0, generator=gen)
    if engine.draft_kv is not None:
        engine.draft_kv.k.normal_(0.0, 1.0, generator=gen)
        engine.draft_kv.v.normal_(0.0, 1.0, generator=gen)


def _round_tree_size(out) -> int:
    tokens = getattr(out, "tree_tokens", None)
    return len(tokens) if tokens is not None else out.tree.size


def _measure_context(engine, opts: EngineOnlyOptions, context: int, bw: float, gen: torch.Generator) -> ContextResult:
    device = engine.torch_device
    cfg = engine.target.cfg
    el = engine.torch_dtype.itemsize  # the K/V pools hold the model's dtype
    state = _State(engine, context, gen)
    state.restore()
    timed = lambda fn, setup=None: time_fn(fn, opts.warmup, opts.reps, device, setup)

    # (a) AR step: forward of 1 token at position `context` and its greedy token (as a round).
    one = root_only(torch.tensor(state.tokens[-1], device=device))

    def ar_step():
        hidden, _ = _verify_forward(engine, one, context)
        return engine.target.greedy(hidden)

    ar = Stat.of(timed(ar_step))
    w_bytes = weight_bytes_per_ar_step(engine.target)
    attn_layers = len(cfg.hybrid.full_layers) if cfg.hybrid is not None else cfg.num_layers
    kvb = kv_bytes(attn_layers, context, cfg.num_kv_heads, cfg.head_dim, el)
    # A recurrent layer reads its committed state and writes the updated one every step.
    state_rw = 2 * recurrent_state_bytes(engine)
    ar_bound = bound_ms(w_bytes + state_rw, bw)
    ar_round = Stat.of(timed(lambda: engine.round(GenerationParams(spec=SpecParams(enabled=False)), None),
                             state.restore))
    state.restore()

    # (b) verify: forward over a random tree of N nodes + the greedy token at every node.
    verify = []
    for n in opts.tree_sizes:
        tree = _random_tree(engine, n, opts.width, gen)

        def verify_fn(tree=tree):
            hidden, _ = _verify_forward(engine, tree, context)
            return engine.target.greedy(hidden)

        ms = Stat.of(timed(verify_fn))
        nbytes = round(expected_weight_bytes(engine.target, n))
        experts = expected_distinct_experts(cfg.num_experts, cfg.num_experts_per_tok, n) if cfg.num_experts else None
        v_bound = bound_ms(nbytes + state_rw, bw)
        verify.append(VerifyResult(nodes=n, ms=ms, over_ar_step=ms.median / ar.median, weight_bytes=nbytes,
                                   experts_per_layer=experts, bound_ms=v_bound, over_bound=ms.median / v_bound,
                                   tree_state_bytes=tree_state_bytes(engine, n)))

    # (c) draft forward over the full block, (d) a whole round at the round budget.
    draft = draft_bound = draft_bound_kv = round_ms = phases = nodes = dkv = None
    if engine.head is not None:
        hcfg = engine.head.cfg
        anchor = torch.tensor(state.tokens[-1], device=device)
        engine.draft_kv.length = context
        draft = Stat.of(timed(lambda: _draft_forward(engine, anchor, hcfg.max_depth)))
        dkv = kv_bytes(hcfg.num_layers, context, hcfg.num_kv_heads, hcfg.head_dim, el)
        draft_bound = bound_ms(head_weight_bytes(engine), bw)
        draft_bound_kv = bound_ms(head_weight_bytes(engine) + dkv, bw)
        params = GenerationParams(spec=SpecParams(budget=opts.round_budget, width=opts.width))
        outs = []
        round_ms = Stat.of(timed(lambda: outs.append(engine.round(params, None)), state.restore))
        outs = outs[opts.warmup:]
        phases = {k: statistics.median(o.timings[k] for o in outs) for k in outs[0].timings}
        nodes = _round_tree_size(outs[0])
        state.restore()

    ar_bound_kv = bound_ms(w_bytes + state_rw + kvb, bw)
    return ContextResult(
        context=context, kv_bytes=kvb, draft_kv_bytes=dkv,
        ar_step_ms=ar, ar_bound_ms=ar_bound, ar_bound_kv_ms=ar_bound_kv,
        state_bytes=recurrent_state_bytes(engine),
        ar_step_over_bound=ar.median / ar_bound, ar_step_over_bound_kv=ar.median / ar_bound_kv,
        ar_round_ms=ar_round, verify=verify,
        draft_ms=draft, draft_bound_ms=draft_bound, draft_bound_kv_ms=draft_bound_kv,
        draft_over_bound=ratio(draft.median if draft else None, draft_bound),
        round_ms=round_ms, round_phases_ms=phases, round_tree_nodes=nodes,
    )


def _bars(opts: EngineOnlyOptions, bw: float, contexts: list[ContextResult], idle: GpuIdle | None) -> Bars:
    by_ctx = {c.context: c for c in contexts}
    head = by_ctx[opts.headline_context]
    short, long = by_ctx[min(by_ctx)], by_ctx[max(by_ctx)]
    wanted = [n for n in (128, 256) if n in opts.tree_sizes] or list(opts.tree_sizes)
    verify = {v.nodes: v for v in head.verify if v.nodes in wanted}
    return Bars(
        context=head.context, copy_bandwidth_gb_s=bw,
        ar_step_ms=head.ar_step_ms.median, ar_bound_ms=head.ar_bound_ms, ar_step_over_bound=head.ar_step_over_bound,
        ar_bound_kv_ms=head.ar_bound_kv_ms, ar_step_over_bound_kv=head.ar_step_over_bound_kv,
        verify_ms={n: v.ms.median for n, v in verify.items()},
        verify_over_ar_step={n: v.over_ar_step for n, v in verify.items()},
        verify_over_bound={n: v.over_bound for n, v in verify.items()},
        draft_ms=head.draft_ms.median if head.draft_ms else None,
        draft_bound_ms=head.draft_bound_ms, draft_over_bound=head.draft_over_bound,
        draft_long_context=long.context if long.draft_ms else None,
        draft_long_ms=long.draft_ms.median if long.draft_ms else None,
        draft_long_over_short=ratio(long.draft_ms.median if long.draft_ms else None,
                                     short.draft_ms.median if short.draft_ms else None),
        round_budget=opts.round_budget,
        round_ms=head.round_ms.median if head.round_ms else None, round_phases_ms=head.round_phases_ms,
        gpu_idle_ms=idle.idle_ms if idle else None, gpu_idle_fraction=idle.idle_fraction if idle else None,
    )


def run_engine_only(opts: EngineOnlyOptions, progress: ProgressFn | None = None) -> EngineOnlyReport:
    from ..engine import load_engine

    say = progress or (lambda msg: None)
    opts.validate()
    results: list[EngineOnlyResult] = []
    env: dict | None = None
    for model_arg in opts.models:
        t0 = time.perf_counter()
        say(f"loading {model_arg}")
        engine = load_engine(model_arg, opts.draft_head, device=opts.device, dtype=opts.dtype, tp=opts.tp)
        if opts.tp is None:  # the first model's choice, for the report and the models after it
            opts.tp = engine.tp
        load_s = time.perf_counter() - t0
        device = engine.torch_device
        env = env or environment(device)
        if engine.tp > 1:  # every rank runs the same measurements in step (their collectives meet); rank 0's count
            copy_bytes, copy_ms, bw, contexts, idle, peak = engine.run_on_ranks(_measure_model, opts, say=say)
        else:
            copy_bytes, copy_ms, bw, contexts, idle, peak = _measure_model(engine, opts, say)
        results.append(EngineOnlyResult(
            model=engine.model_name, draft_head=engine.head_name, device=engine.device, dtype=engine.dtype,
            copy_bytes=copy_bytes, copy_ms=copy_ms, copy_bandwidth_gb_s=bw,
            weight_bytes_per_ar_step=weight_bytes_per_ar_step(engine.target),
            head_weight_bytes=head_weight_bytes(engine) if engine.head is not None else 0,
            contexts=contexts, bars=_bars(opts, bw, contexts, idle), gpu_idle=idle,
            peak_memory_bytes=peak, load_seconds=load_s,
        ))
        engine.reset()
        if engine.tp > 1:
            engine.close()
        del engine
        free_device_memory(device)
    return EngineOnlyReport(mode="engine_only", env=env or {}, options=options_dict(opts), models=results)


def _measure_model(engine, opts: EngineOnlyOptions, say=None):
    """Everything measured on a loaded engine (under TP: on each rank's own engine, the same
    calls in the same order). Returns (copy_bytes, copy_ms, bandwidth, contexts, idle, peak)."""
    say = say or (lambda msg: None)
    device = engine.torch_device
    scratch = max(max(opts.tree_sizes), opts.round_budget) + 16
    need = max(opts.contexts) + scratch
    limit = engine.target.cfg.max_position_embeddings
    if need > limit:
        raise ConfigError(f"context {max(opts.contexts)} plus a {scratch - 16}-node tree exceeds the model's "
                          f"{limit} positions; use smaller --contexts")
    if engine.head is not None and opts.round_budget > 1:
        SpecParams(budget=opts.round_budget, width=opts.width).validate(engine.max_depth)
    # The cache the app would use (its default context, or more where the contexts need it):
    # the attention's split length follows the cache's size, so a smaller cache would time
    # another split structure than the app runs.
    capacity = max(need, min(default_max_context(device), limit))
    say("filling the caches")
    _prepare_engine(engine, capacity, opts.seed)
    gen = torch.Generator().manual_seed(opts.seed)
    peak_memory_reset(device)
    copy_bytes = (opts.copy_mib or (1024 if device.type == "cuda" else 256)) << 20
    say(f"copy bandwidth ({copy_bytes >> 20} MiB)")
    copy_ms, bw = measure_copy_bandwidth(device, copy_bytes, opts.warmup, opts.reps)
    contexts = []
    with torch.inference_mode():
        for c in sorted(opts.contexts):
            say(f"context {c}: AR step, verify at {list(opts.tree_sizes)}, draft, round@{opts.round_budget}")
            contexts.append(_measure_context(engine, opts, c, bw, gen))
        head_ctx = next(c for c in contexts if c.context == opts.headline_context)
        idle = None
        if head_ctx.round_ms is not None:
            say("profiling rounds for GPU idle time")
            state = _State(engine, opts.headline_context, gen)
            params = GenerationParams(spec=SpecParams(budget=opts.round_budget, width=opts.width))
            idle = measure_gpu_idle(engine, state.restore, params, opts.profile_rounds, head_ctx.round_ms)
    return copy_bytes, copy_ms, bw, contexts, idle, peak_memory(device)

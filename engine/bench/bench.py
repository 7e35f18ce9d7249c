"""Benchmarks (measurement only; the command line is jetspec_chat/bench_cli.py, the method is
described in engine/BENCH.md).

Two modes:
- end to end: answer prompt sets with plain AR decoding, speculative decoding at several
  budgets and transformers' own `generate` on the same weights; tokens/s, tau, per-round phase
  times, verify time per tree size, peak GPU memory, speedup vs AR measured in the same run.
- engine only: copy bandwidth, one AR step, one verify per tree size, one draft forward and one
  whole round per context length, GPU idle inside a round; with the ratios to report.

Everything is timed through the engine's own entry points (`engine.verify.forward`, `engine.drafter.logp`,
`engine._round`),
so whatever the engine does (CUDA graphs, Triton kernels) is what gets timed. GPU timings use
CUDA events after a device sync, so each sample is the latency of one call including its host
launch overhead; CPU timings use the wall clock.
"""
from __future__ import annotations

import json
import math
import os
import platform
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..errors import ConfigError
from ..events import FinishEvent, RoundEvent
from ..params import MAX_BUDGET, GenerationParams, SamplingParams, SpecParams
from ..tree import build_accum_logp, root_only

ProgressFn = Callable[[str], None]

MODES = ("ar", "spec", "hf")
ROUND_LABEL = "jetspec_bench_round"  # profiler range around one round (GPU idle analysis)
GPU_TRACE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")  # device activity in kineto chrome traces
GAP_US = 5.0  # kernel gaps shorter than this are launch jitter, not listed individually


# -- timing ----------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(
    fn: Callable[[], object],
    warmup: int,
    reps: int,
    device: torch.device,
    setup: Callable[[], object] | None = None,
) -> list[float]:
    """Milliseconds of `reps` calls of fn (after `warmup` untimed ones). `setup` runs before each
    call, untimed (e.g. to restore state). On CUDA: a sync, then CUDA events around the call, so a
    sample includes host launch time and any GPU idle inside the call."""
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    sync(device)
    samples: list[float] = []
    for _ in range(reps):
        if setup is not None:
            setup()
        sync(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return samples


@dataclass
class Stat:
    """Summary of repeated measurements (milliseconds unless the field name says otherwise)."""

    median: float
    min: float
    max: float
    raw: list[float]

    @classmethod
    def of(cls, samples: list[float]) -> Stat:
        return cls(statistics.median(samples), min(samples), max(samples), [round(s, 6) for s in samples])


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def peak_memory_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def environment(device: torch.device) -> dict:
    """What the numbers were measured on."""
    import transformers

    env = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return env


# -- prompt sets -----------------------------------------------------------------------------
# `coding` and `chat` come from engine/prompts.py (eval_prompts, held out from head training);
# the math-style reasoning set is written here (not taken from public benchmarks).
MATH_PROMPTS: tuple[str, ...] = (
    "A train leaves at 9:40 and arrives at 13:05. How long is the journey in minutes? Show your steps.",
    "Solve for x: 3(x - 4) + 2 = 5x - 14. Explain each step.",
    "A shop sells pens at 3 for 2 euros. How much do 27 pens cost, and how many pens can you buy with 15 euros?",
    "What is the sum of all integers from 1 to 200 that are divisible by 3 or by 5? Reason step by step.",
    "A rectangle has a perimeter of 46 cm and its length is 5 cm more than its width. Find its area.",
    "Prove that the sum of two odd integers is always even.",
    "Two dice are rolled. What is the probability that the sum is at least 10? Show the counting.",
    "A recipe needs 250 g of flour for 4 people. How much flour is needed for 10 people, and for 3?",
    "A car uses 6.5 litres of fuel per 100 km. How far can it go on 42 litres? Explain.",
    "Find the greatest common divisor of 84 and 126 with Euclid's algorithm, showing each step.",
    "A price rises by 20% and then falls by 20%. Is it back where it started? Show why.",
    "How many different ways can 5 books be arranged on a shelf if two of them must stay side by side?",
)
PROMPT_SETS = ("coding", "chat", "math")


def prompt_set(kind: str) -> list[str]:
    """The built-in prompts of one task type."""
    if kind not in PROMPT_SETS:
        raise ConfigError(f"unknown prompt set {kind!r}; choose from {', '.join(PROMPT_SETS)}")
    if kind == "math":
        return list(MATH_PROMPTS)
    from ..training.prompts import eval_prompts

    return eval_prompts(kind)


def load_prompts_jsonl(path: str | Path) -> list[str]:
    """Prompts from a JSONL file: one object per line with a "prompt" string."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompt file {path} does not exist")
    prompts = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
            raise ConfigError(f'{path}:{n}: expected an object with a non-empty "prompt" string')
        prompts.append(obj["prompt"])
    if not prompts:
        raise ConfigError(f"prompt file {path} has no prompts")
    return prompts


def _prompt_ids(engine, text: str, thinking: bool) -> list[int]:
    """Chat-templated prompt ids, as the app sends them (raw text if there is no template)."""
    if getattr(engine.tokenizer, "chat_template", None):
        from ..session import ChatSession

        session = ChatSession(engine, thinking=thinking)
        session.messages.append({"role": "user", "content": text})
        return session.prompt_ids()
    return list(engine.tokenizer(text, add_special_tokens=False)["input_ids"])


# -- end to end ------------------------------------------------------------------------------
@dataclass
class EndToEndOptions:
    models: list[str | None]
    prompt_sets: dict[str, list[str]]  # name -> prompts
    modes: tuple[str, ...] = MODES
    budgets: tuple[int, ...] = (16, 32, 64, 128, 256)
    draft_head: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    max_context: int | None = None
    width: int = 8
    depth: int | None = None
    tree_algo: str = "accum_logp"
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_new_tokens: int = 256
    warmup: int = 1  # untimed generations per config (on the set's first prompt)
    reps: int = 1  # timed generations per prompt and config
    thinking: bool = False

    def validate(self) -> None:
        if not self.models:
            raise ConfigError("give at least one model")
        if not self.modes:
            raise ConfigError(f"give at least one mode ({', '.join(MODES)})")
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ConfigError(f"unknown mode {bad[0]!r}; choose from {', '.join(MODES)}")
        if "spec" in self.modes and not self.budgets:
            raise ConfigError("spec mode needs at least one budget (--budgets)")
        if not self.prompt_sets or not any(self.prompt_sets.values()):
            raise ConfigError("no prompts to run")
        if self.warmup < 0:
            raise ConfigError(f"warmup must be >= 0, got {self.warmup}")
        if self.reps < 1:
            raise ConfigError(f"reps must be >= 1, got {self.reps}")
        for params in self.params_list():
            params.validate(max_depth=None)

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=self.seed)

    def params(self, budget: int | None) -> GenerationParams:
        """budget None: plain AR on the same engine."""
        spec = SpecParams(budget=1 if budget is None else budget, depth=self.depth, width=self.width, tree_algo=self.tree_algo,
                          enabled=budget is not None)
        return GenerationParams(max_new_tokens=self.max_new_tokens, spec=spec, sampling=self.sampling())

    def params_list(self) -> list[GenerationParams]:
        return [self.params(None)] + [self.params(b) for b in self.budgets]

    def configs(self) -> list[tuple[str, str, int | None]]:
        """(name, mode, budget) in run order: AR first, so the others can be compared with it."""
        out: list[tuple[str, str, int | None]] = []
        if "ar" in self.modes:
            out.append(("ar", "ar", None))
        if "spec" in self.modes:
            out += [(f"spec@{b}", "spec", b) for b in self.budgets]
        if "hf" in self.modes:
            out.append(("hf", "hf", None))
        return out


@dataclass
class PhaseMs:
    """Per-round milliseconds (means over one answer's rounds, or medians of those means)."""

    draft: float = 0.0
    tree: float = 0.0
    verify: float = 0.0
    accept: float = 0.0
    host: float = 0.0
    total: float = 0.0

    @classmethod
    def mean_of(cls, rounds: list[RoundEvent]) -> PhaseMs:
        n = len(rounds)
        t = [r.timings for r in rounds]
        return cls(
            draft=sum(x.draft_ms for x in t) / n, tree=sum(x.tree_ms for x in t) / n,
            verify=sum(x.verify_ms for x in t) / n, accept=sum(x.accept_ms for x in t) / n,
            host=sum(x.host_ms for x in t) / n, total=sum(x.total_ms for x in t) / n,
        )

    @classmethod
    def median_of(cls, phases: list[PhaseMs]) -> PhaseMs:
        return cls(**{k: statistics.median(getattr(p, k) for p in phases) for k in asdict(cls())})


@dataclass
class RunRecord:
    """One timed answer."""

    prompt_index: int
    rep: int
    prompt_tokens: int
    answer_tokens: int  # tokens produced, stop token included (the first one comes from prefill)
    answer_ids: list[int]
    finish_reason: str
    decode_tokens_per_s: float  # tokens after the first / time after the first (prefill excluded)
    e2e_tokens_per_s: float  # answer_tokens / total time (prefill included)
    prefill_ms: float  # until the first answer token
    seconds: float
    rounds: int | None = None  # engine modes only
    tau: float | None = None  # tokens per round, bonus included (engine modes only)
    round_ms: PhaseMs | None = None  # mean per round (engine modes only)
    verify_ms_by_size: dict[int, float] = field(default_factory=dict)  # tree nodes -> mean verify ms
    same_as_ar: bool | None = None  # greedy: token-identical to the AR answer of the same prompt


@dataclass
class ConfigResult:
    name: str  # "ar", "spec@64", "hf"
    mode: str
    budget: int | None
    runs: list[RunRecord]
    decode_tokens_per_s: float  # median over runs
    e2e_tokens_per_s: float  # median over runs
    tau: float | None  # pooled: all tokens produced by rounds / all rounds
    tau_median: float | None  # median of per-run tau
    round_ms: PhaseMs | None  # medians over runs of the per-run means
    verify_ms_by_size: dict[int, dict]  # tree nodes -> {"median": ms over all rounds, "rounds": n}
    speedup_vs_ar: float | None  # decode tokens/s over AR's, same model and prompts, same run
    same_as_ar: str | None  # "k/n" answers token-identical to AR (greedy only)
    peak_memory_bytes: int | None
    extra: dict = field(default_factory=dict)


@dataclass
class SetResult:
    name: str
    prompts: int
    configs: list[ConfigResult]


@dataclass
class ModelResult:
    model: str
    draft_head: str | None
    device: str
    dtype: str
    weight_bytes: int
    sets: list[SetResult]
    load_seconds: float


@dataclass
class EndToEndReport:
    mode: str
    env: dict
    options: dict
    models: list[ModelResult]


def _engine_run(engine, prompt_ids: list[int], params: GenerationParams) -> tuple[RunRecord, list[RoundEvent]]:
    engine.reset()  # fresh prefill every time: no prefix reuse between timed runs
    rounds: list[RoundEvent] = []
    result = None
    for event in engine.generate(prompt_ids, params):
        if isinstance(event, RoundEvent):
            rounds.append(event)
        elif isinstance(event, FinishEvent):
            result = event.result
    answer = list(result.token_ids) + ([result.stop_token] if result.stop_token is not None else [])
    by_size: dict[int, list[float]] = {}
    for r in rounds:
        by_size.setdefault(len(r.tree_tokens), []).append(r.timings.verify_ms)
    record = RunRecord(
        prompt_index=-1, rep=-1, prompt_tokens=len(prompt_ids), answer_tokens=len(answer), answer_ids=answer,
        finish_reason=result.finish_reason,
        decode_tokens_per_s=result.tokens_per_second,
        e2e_tokens_per_s=len(answer) / result.seconds if result.seconds > 0 else 0.0,
        prefill_ms=result.prefill_seconds * 1e3, seconds=result.seconds,
        rounds=result.rounds, tau=result.mean_accept_length if result.rounds else None,
        round_ms=PhaseMs.mean_of(rounds) if rounds else None,
        verify_ms_by_size={n: sum(v) / len(v) for n, v in sorted(by_size.items())},
    )
    return record, rounds


def _hf_generate_kwargs(engine, opts: EndToEndOptions, max_new_tokens: int) -> dict:
    eos = sorted(engine.stop_token_ids)
    kw = dict(max_new_tokens=max_new_tokens, eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0)
    if opts.temperature > 0:
        kw.update(do_sample=True, temperature=opts.temperature, top_p=opts.top_p, top_k=opts.top_k or None)
    else:
        kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    return kw


def _hf_run(model, engine, prompt_ids: list[int], opts: EndToEndOptions) -> RunRecord:
    """transformers generate, timed with the same clock (wall, device synced). The time to the
    first token comes from a separate max_new_tokens=1 call, so the timed run is not perturbed
    (a streamer would add a device sync per token)."""
    device = engine.torch_device
    ids = torch.tensor([prompt_ids], device=device)
    mask = torch.ones_like(ids)

    def generate(n: int) -> tuple[torch.Tensor, float]:
        if opts.seed is not None:
            torch.manual_seed(opts.seed)
        sync(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, **_hf_generate_kwargs(engine, opts, n))
        sync(device)
        return out, time.perf_counter() - t0

    _, first_s = generate(1)
    out, seconds = generate(opts.max_new_tokens)
    answer = out[0, len(prompt_ids):].tolist()
    decode_s = seconds - first_s
    eos = engine.stop_token_ids
    finish = "eos" if answer and answer[-1] in eos else "length"
    return RunRecord(
        prompt_index=-1, rep=-1, prompt_tokens=len(prompt_ids), answer_tokens=len(answer), answer_ids=answer,
        finish_reason=finish,
        decode_tokens_per_s=(len(answer) - 1) / decode_s if decode_s > 0 and len(answer) > 1 else 0.0,
        e2e_tokens_per_s=len(answer) / seconds if seconds > 0 else 0.0,
        prefill_ms=first_s * 1e3, seconds=seconds,
    )


def _run_once(engine, hf_model, mode: str, ids: list[int], params: GenerationParams,
              opts: EndToEndOptions) -> tuple[RunRecord, list[RoundEvent]]:
    if mode == "hf":
        return _hf_run(hf_model, engine, ids, opts), []
    return _engine_run(engine, ids, params)


def _summarize(name: str, mode: str, budget: int | None, runs: list[RunRecord], rounds: list[RoundEvent],
               ar: ConfigResult | None, peak: int | None) -> ConfigResult:
    engine_mode = mode != "hf"
    by_size: dict[int, list[float]] = {}
    for r in rounds:
        by_size.setdefault(len(r.tree_tokens), []).append(r.timings.verify_ms)
    produced = sum(r.accept_length for r in rounds)
    compared = [r.same_as_ar for r in runs if r.same_as_ar is not None]
    decode = statistics.median(r.decode_tokens_per_s for r in runs)
    return ConfigResult(
        name=name, mode=mode, budget=budget, runs=runs,
        decode_tokens_per_s=decode,
        e2e_tokens_per_s=statistics.median(r.e2e_tokens_per_s for r in runs),
        tau=produced / len(rounds) if engine_mode and rounds else None,
        tau_median=_median([r.tau for r in runs]) if engine_mode else None,
        round_ms=PhaseMs.median_of([r.round_ms for r in runs if r.round_ms]) if engine_mode and rounds else None,
        verify_ms_by_size={n: {"median": statistics.median(v), "rounds": len(v)} for n, v in sorted(by_size.items())},
        speedup_vs_ar=_ratio(decode, ar.decode_tokens_per_s) if ar is not None and mode != "ar" else None,
        same_as_ar=f"{sum(compared)}/{len(compared)}" if compared else None,
        peak_memory_bytes=peak,
    )


def _weight_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def run_end_to_end(opts: EndToEndOptions, progress: ProgressFn | None = None) -> EndToEndReport:
    from ..models.loader import load_engine

    say = progress or (lambda msg: None)
    opts.validate()
    results: list[ModelResult] = []
    env: dict | None = None
    for model_spec in opts.models:
        t0 = time.perf_counter()
        say(f"loading {model_spec or 'the default model'}")
        engine = load_engine(model_spec, opts.draft_head, device=opts.device, dtype=opts.dtype,
                             max_context=opts.max_context)
        load_s = time.perf_counter() - t0
        device = engine.torch_device
        env = env or environment(device)
        if "spec" in opts.modes and engine.head is None:
            raise ConfigError(f"spec mode needs a draft head, and {engine.model_name} has none; pass --draft-head "
                              "(a head directory, a hub id or random:LAYERS) or drop spec from --modes")
        for p in opts.params_list():
            p.validate(engine.max_depth)
        sets = {name: [_prompt_ids(engine, t, opts.thinking) for t in texts] for name, texts in opts.prompt_sets.items()}
        if opts.max_context is None:  # size the cache to this job, as `generate` does
            longest = max(len(ids) for prompts in sets.values() for ids in prompts)
            engine.set_max_context(longest + opts.max_new_tokens + max(opts.budgets or (1,)) + 1)
        hf_model = None  # transformers' copy of the weights, built for the hf config of each set
        set_results = []
        for set_name, prompts in sets.items():
            configs: list[ConfigResult] = []
            ar: ConfigResult | None = None
            for name, mode, budget in opts.configs():
                if mode == "hf" and hf_model is None:
                    from ..models.oracle import transformers_model

                    say("building the transformers model on the same weights")
                    hf_model = transformers_model(engine)
                params = opts.params(budget)
                for _ in range(opts.warmup):
                    _run_once(engine, hf_model, mode, prompts[0], params, opts)
                peak_memory_reset(device)
                runs, all_rounds = [], []
                for i, ids in enumerate(prompts):
                    for rep in range(opts.reps):
                        say(f"{engine.model_name} {set_name} {name}: prompt {i + 1}/{len(prompts)} rep {rep + 1}")
                        record, rounds = _run_once(engine, hf_model, mode, ids, params, opts)
                        record.prompt_index, record.rep = i, rep
                        if ar is not None and opts.temperature <= 0:
                            record.same_as_ar = record.answer_ids == ar.runs[i * opts.reps].answer_ids
                        runs.append(record)
                        all_rounds += rounds
                result = _summarize(name, mode, budget, runs, all_rounds, ar, peak_memory(device))
                if mode == "hf":
                    result.extra["attn_implementation"] = getattr(hf_model.config, "_attn_implementation", None)
                    hf_model = None  # freed, so the next set's engine configs do not count its memory
                    _free(device)
                if mode == "ar":
                    ar = result
                configs.append(result)
            set_results.append(SetResult(name=set_name, prompts=len(prompts), configs=configs))
        results.append(ModelResult(
            model=engine.model_name, draft_head=engine.head_name, device=engine.device, dtype=engine.dtype,
            weight_bytes=_weight_bytes(engine.target), sets=set_results, load_seconds=load_s,
        ))
        del hf_model, engine
        _free(device)
    return EndToEndReport(mode="end_to_end", env=env or {}, options=_options_dict(opts), models=results)


def _free(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _options_dict(opts) -> dict:
    d = asdict(opts)
    if "prompt_sets" in d:  # the prompts themselves, by set
        d["prompt_sets"] = {k: list(v) for k, v in d["prompt_sets"].items()}
    return d


# -- engine only -----------------------------------------------------------------------------
@dataclass
class EngineOnlyOptions:
    models: list[str | None] = field(default_factory=lambda: ["random:Qwen/Qwen3-8B"])
    draft_head: str | None = None  # None: the model's own (random:Qwen/Qwen3-8B: 5 layers, block 16)
    device: str = "auto"
    dtype: str = "auto"
    contexts: tuple[int, ...] = (512, 2048, 8192)
    tree_sizes: tuple[int, ...] = (1, 16, 32, 64, 128, 256)
    round_budget: int = 128
    width: int = 8
    warmup: int = 5
    reps: int = 20
    copy_mib: int | None = None  # copy-bandwidth buffer; None: 1024 MiB on CUDA, 256 MiB on CPU
    profile_rounds: int = 5  # rounds under the torch profiler for the GPU idle analysis (CUDA only)
    bar_context: int | None = None  # context of the headline numbers; None: the smallest context
    seed: int = 0

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


@dataclass
class ContextResult:
    context: int
    kv_bytes: int  # target K/V bytes an AR step reads at this context
    draft_kv_bytes: int | None  # draft-head context K/V bytes a draft forward reads
    ar_step_ms: Stat  # target forward of 1 token + logits + argmax
    ar_bound_ms: float  # weights read per step / copy bandwidth
    ar_bound_kv_ms: float  # (weights + K/V) / copy bandwidth
    ar_step_over_bound: float
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
class GpuIdle:
    """Where a round leaves the GPU idle (torch profiler kernel timeline; see BENCH.md)."""

    method: str
    rounds: int
    round_ms: float  # median unprofiled round (CUDA events)
    busy_ms: float  # median union of kernel/memcpy/memset intervals inside one profiled round
    idle_ms: float  # round_ms - busy_ms: the headline (profiler overhead excluded)
    idle_fraction: float
    profiled_round_ms: float  # median round under the profiler (its host overhead inflates gaps)
    profiled_idle_ms: float
    leading_ms: float  # profiled: round start -> first kernel (host work before the draft)
    between_ms: float  # profiled: gaps between kernels (launch gaps, phase boundaries)
    trailing_ms: float  # profiled: last kernel -> round end (host work after the last copy)
    gaps_over_threshold: int  # profiled gaps >= GAP_US per round (median)
    largest_gaps: list[dict]  # the median round's largest gaps: {"us", "before": the activity after the gap}
    top_kernels: list[dict] = field(default_factory=list)  # where a round's device time goes (kernel_table)


@dataclass
class Bars:
    """The headline numbers and ratios (one run, one device)."""

    context: int
    copy_bandwidth_gb_s: float
    ar_step_ms: float
    ar_bound_ms: float
    ar_step_over_bound: float
    verify_ms: dict[int, float]  # at 128 and 256 nodes (those measured)
    verify_over_ar_step: dict[int, float]
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
    weight_bytes_per_ar_step: int  # all target weights, lm_head included, one embedding row
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
    one row of the input embedding (a tied lm_head still reads the full matrix)."""
    embed = target.model.embed_tokens.weight
    total = 0
    for name, p in target.named_parameters():
        if p is embed or name.endswith("embed_tokens.weight"):
            continue
        total += p.numel() * p.element_size()
    row = embed.shape[1] * embed.element_size()
    tied = target.lm_head_weight() is embed
    return total + (embed.numel() * embed.element_size() if tied else row)


def head_weight_bytes(engine) -> int:
    lm = engine.target.lm_head_weight()
    return _weight_bytes(engine.head) + lm.numel() * lm.element_size()


def kv_bytes(num_layers: int, tokens: int, num_kv_heads: int, head_dim: int, element_size: int) -> int:
    return 2 * num_layers * tokens * num_kv_heads * head_dim * element_size


def bound_ms(nbytes: int, gb_s: float) -> float:
    """Milliseconds to stream `nbytes` at `gb_s` (1e9 bytes per second)."""
    return nbytes / (gb_s * 1e9) * 1e3


def measure_copy_bandwidth(device: torch.device, nbytes: int, warmup: int, reps: int) -> tuple[Stat, float]:
    """Large device-to-device copy; bandwidth counts bytes read plus bytes written (GB/s)."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    stat = Stat.of(time_fn(lambda: dst.copy_(src), warmup, reps, device))
    return stat, 2 * nbytes / (stat.median * 1e-3) / 1e9


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
        e._truncate(min(e.kv.length, c))
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
    engine._allocate()
    gen = torch.Generator(device=engine.torch_device).manual_seed(seed)
    engine.kv.pool.normal_(0.0, 1.0, generator=gen)
    if engine.draft_kv is not None:
        engine.draft_kv.k.normal_(0.0, 1.0, generator=gen)
        engine.draft_kv.v.normal_(0.0, 1.0, generator=gen)


def _round_tree_size(out) -> int:
    tokens = getattr(out, "tree_tokens", None)
    return len(tokens) if tokens is not None else out.tree.size


def _measure_context(engine, opts: EngineOnlyOptions, context: int, bw: float, gen: torch.Generator) -> ContextResult:
    device = engine.torch_device
    cfg = engine.target.cfg
    el = engine.kv.pool.element_size()
    state = _State(engine, context, gen)
    state.restore()
    timed = lambda fn, setup=None: time_fn(fn, opts.warmup, opts.reps, device, setup)

    # (a) AR step: forward of 1 token at position `context`, logits, argmax.
    one = root_only(torch.tensor(state.tokens[-1], device=device))

    def ar_step():
        hidden, _ = _verify_forward(engine, one, context)
        return engine.target.logits(hidden).argmax(-1)

    ar = Stat.of(timed(ar_step))
    w_bytes = weight_bytes_per_ar_step(engine.target)
    kvb = kv_bytes(cfg.num_layers, context, cfg.num_kv_heads, cfg.head_dim, el)
    ar_bound = bound_ms(w_bytes, bw)
    ar_round = Stat.of(timed(lambda: engine._round(GenerationParams(spec=SpecParams(enabled=False)), None),
                             state.restore))
    state.restore()

    # (b) verify: forward over a random tree of N nodes + logits.
    verify = []
    for n in opts.tree_sizes:
        tree = _random_tree(engine, n, opts.width, gen)

        def verify_fn(tree=tree):
            hidden, _ = _verify_forward(engine, tree, context)
            return engine.target.logits(hidden)

        ms = Stat.of(timed(verify_fn))
        verify.append(VerifyResult(nodes=n, ms=ms, over_ar_step=ms.median / ar.median))

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
        round_ms = Stat.of(timed(lambda: outs.append(engine._round(params, None)), state.restore))
        outs = outs[opts.warmup:]
        phases = {k: statistics.median(o.timings[k] for o in outs) for k in outs[0].timings}
        nodes = _round_tree_size(outs[0])
        state.restore()

    return ContextResult(
        context=context, kv_bytes=kvb, draft_kv_bytes=dkv,
        ar_step_ms=ar, ar_bound_ms=ar_bound, ar_bound_kv_ms=bound_ms(w_bytes + kvb, bw),
        ar_step_over_bound=ar.median / ar_bound, ar_round_ms=ar_round, verify=verify,
        draft_ms=draft, draft_bound_ms=draft_bound, draft_bound_kv_ms=draft_bound_kv,
        draft_over_bound=_ratio(draft.median if draft else None, draft_bound),
        round_ms=round_ms, round_phases_ms=phases, round_tree_nodes=nodes,
    )


def idle_from_trace(events: list[dict], label: str = ROUND_LABEL, min_gap_us: float = GAP_US) -> list[dict]:
    """Per profiled round (a `label` range in a chrome trace): GPU busy time (union of device
    activity clipped to the range), idle split into leading / between / trailing, and the gaps
    >= min_gap_us, largest first, each with the device activity that ends it (to locate it)."""
    rounds = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                    if e.get("ph") == "X" and e.get("name") == label and e.get("cat") == "user_annotation")
    device = sorted((e["ts"], e["ts"] + e["dur"], str(e.get("name", ""))[:80]) for e in events
                    if e.get("ph") == "X" and e.get("cat") in GPU_TRACE_CATS)
    out = []
    for w0, w1 in rounds:
        merged: list[list] = []  # [start, end, name of the first activity]
        for s, e, name in device:
            s, e = max(s, w0), min(e, w1)
            if e <= s:
                continue
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e, name])
        span = w1 - w0
        if not merged:
            out.append({"span_us": span, "busy_us": 0.0, "leading_us": span, "between_us": 0.0, "trailing_us": 0.0,
                        "gaps": []})
            continue
        gaps = [(b[0] - a[1], b[2]) for a, b in zip(merged, merged[1:])]
        out.append({
            "span_us": span, "busy_us": sum(e - s for s, e, _ in merged), "leading_us": merged[0][0] - w0,
            "between_us": sum(g for g, _ in gaps), "trailing_us": w1 - merged[-1][1],
            "gaps": [{"us": g, "before": name} for g, name in sorted(gaps, key=lambda x: -x[0]) if g >= min_gap_us],
        })
    return out


def kernel_table(events: list[dict], label: str = ROUND_LABEL, top: int = 25) -> list[dict]:
    """Device activity inside the profiled rounds grouped by name, largest total first: per round
    the time (us) and the count of each kernel, so a phase's cost can be traced to its kernels."""
    rounds = [(e["ts"], e["ts"] + e["dur"]) for e in events
              if e.get("ph") == "X" and e.get("name") == label and e.get("cat") == "user_annotation"]
    if not rounds:
        return []
    total: dict[str, list[float]] = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in GPU_TRACE_CATS:
            continue
        if any(w0 <= e["ts"] < w1 for w0, w1 in rounds):
            t = total.setdefault(str(e.get("name", ""))[:120], [0.0, 0])
            t[0] += e["dur"]
            t[1] += 1
    n = len(rounds)
    rows = sorted(total.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"name": name, "us_per_round": round(us / n, 2), "count_per_round": round(c / n, 2)}
            for name, (us, c) in rows]


def measure_gpu_idle(engine, opts: EngineOnlyOptions, round_ms: Stat, gen: torch.Generator) -> GpuIdle | None:
    """Profile a few rounds at the headline context and compare kernel busy time with the
    unprofiled round time. CUDA only (on the CPU there is no separate device to idle)."""
    if engine.torch_device.type != "cuda" or engine.head is None or opts.profile_rounds < 1:
        return None
    from torch.profiler import ProfilerActivity, profile, record_function

    state = _State(engine, opts.headline_context, gen)
    params = GenerationParams(spec=SpecParams(budget=opts.round_budget, width=opts.width))
    for _ in range(2):  # warm, outside the profiler
        state.restore()
        engine._round(params, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note about profiler cycles is noise here
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(opts.profile_rounds):
                state.restore()
                sync(engine.torch_device)
                with record_function(ROUND_LABEL):
                    engine._round(params, None)
                    sync(engine.torch_device)  # the range ends when the round's GPU work has ended
    state.restore()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        events = json.loads(Path(path).read_text()).get("traceEvents", [])
    finally:
        os.unlink(path)
    samples = [s for s in idle_from_trace(events) if s["busy_us"] > 0]
    if not samples:
        return None  # the profiler saw no device activity (e.g. CUPTI unavailable)
    mid = sorted(samples, key=lambda s: s["span_us"])[len(samples) // 2]
    busy = statistics.median(s["busy_us"] for s in samples) / 1e3
    profiled = statistics.median(s["span_us"] for s in samples) / 1e3
    idle = max(0.0, round_ms.median - busy)
    return GpuIdle(
        method="torch.profiler CUDA timeline: busy = union of kernel/memcpy/memset intervals in a round; "
               "idle = unprofiled round time (CUDA events) - busy",
        rounds=len(samples), round_ms=round_ms.median, busy_ms=busy, idle_ms=idle,
        idle_fraction=idle / round_ms.median, profiled_round_ms=profiled, profiled_idle_ms=profiled - busy,
        leading_ms=statistics.median(s["leading_us"] for s in samples) / 1e3,
        between_ms=statistics.median(s["between_us"] for s in samples) / 1e3,
        trailing_ms=statistics.median(s["trailing_us"] for s in samples) / 1e3,
        gaps_over_threshold=int(statistics.median(len(s["gaps"]) for s in samples)),
        largest_gaps=[{"us": round(g["us"], 1), "before": g["before"]} for g in mid["gaps"][:8]],
        top_kernels=kernel_table(events),
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
        verify_ms={n: v.ms.median for n, v in verify.items()},
        verify_over_ar_step={n: v.over_ar_step for n, v in verify.items()},
        draft_ms=head.draft_ms.median if head.draft_ms else None,
        draft_bound_ms=head.draft_bound_ms, draft_over_bound=head.draft_over_bound,
        draft_long_context=long.context if long.draft_ms else None,
        draft_long_ms=long.draft_ms.median if long.draft_ms else None,
        draft_long_over_short=_ratio(long.draft_ms.median if long.draft_ms else None,
                                     short.draft_ms.median if short.draft_ms else None),
        round_budget=opts.round_budget,
        round_ms=head.round_ms.median if head.round_ms else None, round_phases_ms=head.round_phases_ms,
        gpu_idle_ms=idle.idle_ms if idle else None, gpu_idle_fraction=idle.idle_fraction if idle else None,
    )


def run_engine_only(opts: EngineOnlyOptions, progress: ProgressFn | None = None) -> EngineOnlyReport:
    from ..models.loader import load_engine

    say = progress or (lambda msg: None)
    opts.validate()
    results: list[EngineOnlyResult] = []
    env: dict | None = None
    for model_spec in opts.models:
        t0 = time.perf_counter()
        say(f"loading {model_spec}")
        engine = load_engine(model_spec, opts.draft_head, device=opts.device, dtype=opts.dtype)
        load_s = time.perf_counter() - t0
        device = engine.torch_device
        env = env or environment(device)
        scratch = max(max(opts.tree_sizes), opts.round_budget) + 16
        need = max(opts.contexts) + scratch
        limit = engine.target.cfg.max_position_embeddings
        if need > limit:
            raise ConfigError(f"context {max(opts.contexts)} plus a {scratch - 16}-node tree exceeds the model's "
                              f"{limit} positions; use smaller --contexts")
        if engine.head is not None and opts.round_budget > 1:
            SpecParams(budget=opts.round_budget, width=opts.width).validate(engine.max_depth)
        say("filling the caches")
        _prepare_engine(engine, need, opts.seed)
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
                idle = measure_gpu_idle(engine, opts, head_ctx.round_ms, gen)
        results.append(EngineOnlyResult(
            model=engine.model_name, draft_head=engine.head_name, device=engine.device, dtype=engine.dtype,
            copy_bytes=copy_bytes, copy_ms=copy_ms, copy_bandwidth_gb_s=bw,
            weight_bytes_per_ar_step=weight_bytes_per_ar_step(engine.target),
            head_weight_bytes=head_weight_bytes(engine) if engine.head is not None else 0,
            contexts=contexts, bars=_bars(opts, bw, contexts, idle), gpu_idle=idle,
            peak_memory_bytes=peak_memory(device), load_seconds=load_s,
        ))
        engine.reset()
        del engine
        _free(device)
    return EngineOnlyReport(mode="engine_only", env=env or {}, options=_options_dict(opts), models=results)


# -- output ----------------------------------------------------------------------------------
def to_json(report: EndToEndReport | EngineOnlyReport) -> dict:
    """Plain JSON-ready dict (dict keys become strings; non-finite floats become None)."""

    def clean(x):
        if isinstance(x, float):
            return x if math.isfinite(x) else None
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return clean({"tool": "jetspec-chat bench", **asdict(report)})


def write_json(report: EndToEndReport | EngineOnlyReport, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_json(report), indent=1) + "\n")

"""End-to-end benchmark: answer prompt sets with plain AR decoding, speculative decoding at several
budgets and transformers' own `generate` on the same weights; tokens/s, tau, per-round phase
times, verify time per tree size, peak GPU memory, speedup vs AR measured in the same run.
Everything runs through the engine's own `generate`, so what the app gets is what is timed."""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..engine.errors import ConfigError
from ..engine.eval_sets import EVAL_SETS, eval_prompts
from ..engine.events import FinishEvent, RoundEvent
from ..engine.params import DEFAULT_WIDTH, GenerationParams, SamplingParams, SpecParams
from .report import options_dict
from .timing import (
    ProgressFn,
    environment,
    free_device_memory,
    median_or_none,
    peak_memory,
    peak_memory_reset,
    ratio,
    sync,
    weight_bytes,
)

MODES = ("ar", "spec", "hf")
PROMPT_SETS = tuple(EVAL_SETS)  # coding, chat, math


def prompt_set(kind: str) -> list[str]:
    """The built-in prompts of one task type (engine/eval_sets.py)."""
    if kind not in PROMPT_SETS:
        raise ConfigError(f"unknown prompt set {kind!r}; choose from {', '.join(PROMPT_SETS)}")
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
        from ..engine.session import ChatSession

        session = ChatSession(engine, thinking=thinking)
        session.messages.append({"role": "user", "content": text})
        return session.prompt_ids()
    return list(engine.tokenizer(text, add_special_tokens=False)["input_ids"])


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
    tp: int | None = None  # tensor-parallel ranks (one GPU each); None: load_engine's choice
    width: int = DEFAULT_WIDTH
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
    answer = result.decoded_ids
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
        tau_median=median_or_none([r.tau for r in runs]) if engine_mode else None,
        round_ms=PhaseMs.median_of([r.round_ms for r in runs if r.round_ms]) if engine_mode and rounds else None,
        verify_ms_by_size={n: {"median": statistics.median(v), "rounds": len(v)} for n, v in sorted(by_size.items())},
        speedup_vs_ar=ratio(decode, ar.decode_tokens_per_s) if ar is not None and mode != "ar" else None,
        same_as_ar=f"{sum(compared)}/{len(compared)}" if compared else None,
        peak_memory_bytes=peak,
    )


def load_bench_engine(model_arg: str | None, opts: EndToEndOptions, say: ProgressFn) -> tuple[Any, float]:
    """The engine for one model of the bench, and its load time in seconds."""
    from ..engine import load_engine

    t0 = time.perf_counter()
    say(f"loading {model_arg or 'the default model'}")
    engine = load_engine(model_arg, opts.draft_head, device=opts.device, dtype=opts.dtype,
                         max_context=opts.max_context, tp=opts.tp)
    if opts.tp is None:  # the first model's choice, for the report and the models after it
        opts.tp = engine.tp
    return engine, time.perf_counter() - t0


def run_end_to_end(opts: EndToEndOptions, progress: ProgressFn | None = None,
                   loaded: tuple[Any, float] | None = None) -> EndToEndReport:
    """`loaded`: (engine, load seconds) of load_bench_engine for the one model, kept loaded
    afterwards (bench --app runs it beside the app next); otherwise each model is loaded here
    and freed after its configs."""
    say = progress or (lambda msg: None)
    opts.validate()
    if loaded is not None and len(opts.models) != 1:
        raise ConfigError("a loaded engine serves a bench of one model")
    results: list[ModelResult] = []
    env: dict | None = None
    for model_arg in opts.models:
        engine, load_s = loaded if loaded is not None else load_bench_engine(model_arg, opts, say)
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
                    from ..engine.models.oracle import transformers_model

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
                    free_device_memory(device)
                if mode == "ar":
                    ar = result
                configs.append(result)
            set_results.append(SetResult(name=set_name, prompts=len(prompts), configs=configs))
        results.append(ModelResult(
            model=engine.model_name, draft_head=engine.head_name, device=engine.device, dtype=engine.dtype,
            weight_bytes=weight_bytes(engine.target), sets=set_results, load_seconds=load_s,
        ))
        if loaded is None:  # a loaded engine stays with its caller
            if engine.tp > 1:
                engine.close()
            del hf_model, engine
            free_device_memory(device)
    return EndToEndReport(mode="end_to_end", env=env or {}, options=options_dict(opts), models=results)

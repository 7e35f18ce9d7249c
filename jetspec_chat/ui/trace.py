"""Per-answer traces (the rounds the engine reported) and the statistics derived from them.

Pure data and arithmetic, no Textual: the widgets only render what is computed here. Every
number comes from the events themselves (engine-measured milliseconds, `elapsed_s`), never
from the UI's own clock, so what the screen shows does not depend on how often it redraws.
"""
from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from jetspec_chat.engine.events import (
    FinishEvent,
    GenerationResult,
    PrefillEvent,
    RoundEvent,
)
from jetspec_chat.engine.params import GenerationParams, SamplingParams, SpecParams

CURRENT_WINDOW = 8  # rounds averaged for "current" tokens/s


def params_label(params: GenerationParams) -> str:
    spec = params.spec
    if not spec.enabled:
        return "AR"
    depth = "full" if spec.depth is None else str(spec.depth)
    return f"budget {spec.budget} · depth {depth} · width {spec.width} · {spec.tree_algo}"


def split_provenance(event: RoundEvent) -> tuple[str, str]:
    """(text from accepted draft tokens, text from the target's bonus token) of one round."""
    drafted = "".join(event.tree_texts[i] for i in event.accepted_nodes[1:] if 0 <= i < len(event.tree_texts))
    text = event.new_text
    if not drafted:
        return "", text
    if text.startswith(drafted):
        return drafted, text[len(drafted) :]
    n = 0
    for a, b in zip(text, drafted):
        if a != b:
            break
        n += 1
    return text[:n], text[n:]


@dataclass
class AnswerTrace:
    """Everything reported about one answer, in order."""

    job_id: int
    kind: str  # "chat" | "rerun" | "compare"
    params: GenerationParams
    user_text: str = ""
    prefill: PrefillEvent | None = None
    rounds: list[RoundEvent] = field(default_factory=list)
    result: GenerationResult | None = None
    error: str = ""
    text: str = ""
    segments: list[tuple[str, str]] = field(default_factory=list)  # (text, "target" | "draft")
    round_offsets: list[int] = field(default_factory=list)  # len(text) before each round
    # live tree-shape changes the engine took during the answer: (first round, new spec)
    spec_changes: list[tuple[int, SpecParams]] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.result is not None or bool(self.error)

    def add_spec_change(self, from_round: int, spec: SpecParams) -> None:
        self.spec_changes.append((from_round, spec))

    def params_at(self, round_index: int) -> GenerationParams:
        """The parameters round `round_index` ran with (live changes included)."""
        spec = self.params.spec
        for start, new in self.spec_changes:
            if start <= round_index:
                spec = new
        return self.params if spec is self.params.spec else dataclasses.replace(self.params, spec=spec)

    @property
    def current_params(self) -> GenerationParams:
        """The parameters of the next round (while streaming) or of the last one."""
        n = len(self.rounds)
        return self.params_at(n - 1 if self.finished and n else n)

    def effective_changes(self) -> list[tuple[int, SpecParams]]:
        """The live changes that some round actually ran with (a change requested during the
        last round of an answer never takes effect)."""
        if not self.finished:
            return list(self.spec_changes)
        return [(start, spec) for start, spec in self.spec_changes if start < len(self.rounds)]

    @property
    def speculated(self) -> bool:
        """Whether any round ran with speculation on."""
        if not self.rounds:
            return self.current_params.spec.enabled
        return any(self.params_at(i).spec.enabled for i in range(len(self.rounds)))

    @property
    def label(self) -> str:
        """'budget 64 · …', or with live changes 'budget 64 · … → budget 16 · … (from round 6)'."""
        text = params_label(self.params)
        for start, spec in self.effective_changes():
            text += f" → {params_label(dataclasses.replace(self.params, spec=spec))} (from round {start + 1})"
        return text

    def add(self, event: Any) -> str:
        """Record an event; returns the text it appended to the answer."""
        if isinstance(event, PrefillEvent):
            self.prefill = event
            self._append(event.first_text, "target")
            return event.first_text
        if isinstance(event, RoundEvent):
            self.round_offsets.append(len(self.text))
            self.rounds.append(event)
            drafted, bonus = split_provenance(event)
            self._append(drafted, "draft")
            self._append(bonus, "target")
            return event.new_text
        if isinstance(event, FinishEvent):
            self.result = event.result
            # The result's text is authoritative: after a cancel (or a full context) it ends
            # with a short tail the engine held back while streaming.
            final = event.result.text
            if final.startswith(self.text) and len(final) > len(self.text):
                tail = final[len(self.text) :]
                self._append(tail, "target")
                return tail
        return ""

    def _append(self, text: str, kind: str) -> None:
        if not text:
            return
        self.text += text
        if self.segments and self.segments[-1][1] == kind:
            self.segments[-1] = (self.segments[-1][0] + text, kind)
        else:
            self.segments.append((text, kind))

    def to_jsonl_lines(self, answer_index: int) -> Iterable[str]:
        head = {
            "type": "answer",
            "answer": answer_index,
            "kind": self.kind,
            "params": _params_dict(self.params),
            "user_text": self.user_text,
        }
        if self.spec_changes:
            head["spec_changes"] = [
                {"from_round": start, "spec": dataclasses.asdict(spec)} for start, spec in self.spec_changes
            ]
        yield json.dumps(head, ensure_ascii=False)
        if self.prefill is not None:
            yield json.dumps({"type": "prefill", "answer": answer_index, **dataclasses.asdict(self.prefill)}, ensure_ascii=False)
        for r in self.rounds:
            d = dataclasses.asdict(r)
            d["accept_length"] = r.accept_length
            yield json.dumps({"type": "round", "answer": answer_index, **d}, ensure_ascii=False)
        if self.result is not None:
            d = dataclasses.asdict(self.result)
            d["tokens_per_second"] = self.result.tokens_per_second
            d["mean_accept_length"] = self.result.mean_accept_length
            yield json.dumps({"type": "finish", "answer": answer_index, **d}, ensure_ascii=False)
        if self.error:
            yield json.dumps({"type": "error", "answer": answer_index, "message": self.error}, ensure_ascii=False)


def _params_dict(params: GenerationParams) -> dict:
    return dataclasses.asdict(params)


# ----------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class PromptKey:
    """What makes an AR measurement a fair baseline for an answer: the same prompt (the user's
    text at the same prompt length in tokens) answered with the same length limit and sampling."""

    user_text: str
    prompt_tokens: int
    max_new_tokens: int
    sampling: SamplingParams


def prompt_key(trace: "AnswerTrace") -> PromptKey | None:
    """The trace's key, once its prefill has told the prompt's length."""
    if trace.prefill is None:
        return None
    p = trace.prefill
    return PromptKey(trace.user_text, p.new_tokens + p.reused_tokens, trace.params.max_new_tokens,
                     trace.params.sampling)


def mean_round_ms(rounds: Iterable[RoundEvent]) -> float | None:
    """The engine-measured milliseconds of a round, averaged: the one clock both sides of a
    speedup are read from."""
    totals = [_round_ms(r).total for r in rounds]
    return sum(totals) / len(totals) if totals and sum(totals) > 0 else None


@dataclass(frozen=True)
class ArBaseline:
    """Plain AR measured on one prompt: an AR round commits one token, so its mean round time
    is its time per token."""

    round_ms: float
    source: str  # shown next to the speedup, e.g. "AR rerun of turn 2"
    key: PromptKey

    @property
    def tokens_per_second(self) -> float:
        return 1000.0 / self.round_ms

    @classmethod
    def from_trace(cls, trace: "AnswerTrace", source: str) -> "ArBaseline | None":
        key, ms = prompt_key(trace), mean_round_ms(trace.rounds)
        if key is None or ms is None or any(r.accept_length != 1 for r in trace.rounds):
            return None  # not a finished plain AR answer
        return cls(ms, source, key)


class ArBaselines:
    """The AR measurements of this chat, one per prompt key: an answer's speedup is read only
    against an AR run of its own prompt and settings, never one measured on another prompt."""

    def __init__(self) -> None:
        self._by_key: dict[PromptKey, ArBaseline] = {}

    def record(self, trace: "AnswerTrace", source: str) -> ArBaseline | None:
        baseline = ArBaseline.from_trace(trace, source)
        if baseline is not None:
            self._by_key[baseline.key] = baseline
        return baseline

    def for_trace(self, trace: "AnswerTrace | None") -> ArBaseline | None:
        key = prompt_key(trace) if trace is not None else None
        return self._by_key.get(key) if key is not None else None

    def clear(self) -> None:
        self._by_key.clear()


def speedup(tau: float | None, spec_round_ms: float | None, baseline: ArBaseline | None) -> float | None:
    """Speculative over AR tokens/s on the same prompt: tau x (AR round ms / speculative round ms).
    A speculative round verifies at least what an AR round computes, so an AR round that took
    longer was measured under other load: no speedup is shown then (it would exceed tau)."""
    if baseline is None or not tau or not spec_round_ms or baseline.round_ms > spec_round_ms:
        return None
    return tau * baseline.round_ms / spec_round_ms


@dataclass(frozen=True)
class RoundMs:
    draft: float = 0.0  # draft head + tree build
    verify: float = 0.0
    host: float = 0.0  # accept/commit + host bookkeeping
    total: float = 0.0


@dataclass(frozen=True)
class Stats:
    label: str = ""
    rounds: int = 0
    answer_tokens: int = 0
    tps_current: float | None = None
    tps_answer: float | None = None
    tau_mean: float | None = None
    tau_last: int | None = None
    ms_mean: RoundMs = RoundMs()
    ms_last: RoundMs = RoundMs()
    speedup: float | None = None
    baseline: ArBaseline | None = None
    tps_series: tuple[float, ...] = ()
    tau_series: tuple[float, ...] = ()
    histogram: tuple[tuple[int, int], ...] = ()  # (accept length, count), ascending
    prefill_new: int | None = None
    prefill_reused: int | None = None
    prefill_ms: float | None = None
    finish_reason: str = ""
    spec_enabled: bool = True


def _round_ms(r: RoundEvent) -> RoundMs:
    t = r.timings
    return RoundMs(
        draft=t.draft_ms + t.tree_ms,
        verify=t.verify_ms,
        host=t.accept_ms + t.host_ms,
        total=t.total_ms or (t.draft_ms + t.tree_ms + t.verify_ms + t.accept_ms + t.host_ms),
    )


def round_tps(r: RoundEvent) -> float:
    ms = _round_ms(r).total
    return r.accept_length * 1000.0 / ms if ms > 0 else 0.0


def compute_stats(trace: AnswerTrace | None, baseline: ArBaseline | None = None, upto: int | None = None) -> Stats:
    """Statistics of `trace` (its first `upto` rounds when given: for stepping and replay)."""
    if trace is None:
        return Stats(baseline=baseline)
    rounds = trace.rounds if upto is None else trace.rounds[:upto]
    finished = trace.result is not None and (upto is None or upto >= len(trace.rounds))
    ms_list = [_round_ms(r) for r in rounds]
    n = len(rounds)
    tps_current = None
    if n:
        window = rounds[-CURRENT_WINDOW:]
        wms = sum(_round_ms(r).total for r in window)
        tps_current = sum(r.accept_length for r in window) * 1000.0 / wms if wms > 0 else None
    tps_answer = None
    if finished and trace.result is not None and trace.result.decode_seconds > 0:
        tps_answer = trace.result.tokens_per_second
    elif n:
        prefill_s = (trace.prefill.ms / 1000.0) if trace.prefill else 0.0
        decode_s = rounds[-1].elapsed_s - prefill_s
        if decode_s <= 0:
            decode_s = sum(m.total for m in ms_list) / 1000.0
        tps_answer = sum(r.accept_length for r in rounds) / decode_s if decode_s > 0 else None
    tau_series = tuple(float(r.accept_length) for r in rounds)
    mean = RoundMs()
    if n:
        mean = RoundMs(
            draft=sum(m.draft for m in ms_list) / n,
            verify=sum(m.verify for m in ms_list) / n,
            host=sum(m.host for m in ms_list) / n,
            total=sum(m.total for m in ms_list) / n,
        )
    hist = Counter(r.accept_length for r in rounds)
    if baseline is not None and baseline.key != prompt_key(trace):
        baseline = None  # measured on another prompt or with other settings: no fair comparison
    last = (n - 1) if n else 0
    return Stats(
        label=params_label(trace.params_at(last)),
        rounds=n,
        answer_tokens=rounds[-1].answer_tokens if n else (1 if trace.prefill else 0),
        tps_current=tps_current,
        tps_answer=tps_answer,
        tau_mean=(sum(tau_series) / n) if n else None,
        tau_last=rounds[-1].accept_length if n else None,
        ms_mean=mean,
        ms_last=ms_list[-1] if n else RoundMs(),
        speedup=speedup(sum(tau_series) / n if n else None, mean.total or None, baseline),
        baseline=baseline,
        tps_series=tuple(round_tps(r) for r in rounds),
        tau_series=tau_series,
        histogram=tuple(sorted(hist.items())),
        prefill_new=trace.prefill.new_tokens if trace.prefill else None,
        prefill_reused=trace.prefill.reused_tokens if trace.prefill else None,
        prefill_ms=trace.prefill.ms if trace.prefill else None,
        finish_reason=trace.result.finish_reason if finished and trace.result else "",
        spec_enabled=any(trace.params_at(i).spec.enabled for i in range(n)) if n else trace.params.spec.enabled,
    )


def result_round_ms(result: GenerationResult) -> float | None:
    return result.decode_seconds * 1000.0 / result.rounds if result.rounds else None


def prefill_line(prefill: PrefillEvent) -> str:
    """'prefill 12 new tokens, 840 reused (KV cache) · 18 ms'"""
    reused = f", {prefill.reused_tokens:,} reused from the KV cache" if prefill.reused_tokens else ""
    return f"prefill {prefill.new_tokens:,} new token{'s' if prefill.new_tokens != 1 else ''}{reused} · {prefill.ms:.0f} ms"

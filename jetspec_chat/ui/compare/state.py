"""What a budget comparison holds and how the engine's reports change it (no Textual here).

`CompareState` is the model behind `CompareScreen`; `CompareRuns` (runs.py) feeds it the
worker's `CompareRunStarted` / `GenerationEvent` / `CompareRunFinished` / `JobFinished` items.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from jetspec_chat.engine.events import Event, GenerationResult, RoundEvent
from jetspec_chat.engine.params import MAX_BUDGET, GenerationParams

from ..trace import AnswerTrace, ArBaseline

AR_LABEL = "AR"
_AR_WORDS = {"ar", "off", "none", "0", "plain"}


class BudgetListError(ValueError):
    pass


def parse_budget_list(text: str) -> list[str]:
    """'AR, 16 32,64' -> ['AR', '16', '32', '64']; duplicates dropped, order kept."""
    items = [t for t in re.split(r"[,\s;]+", text.strip()) if t]
    if not items:
        raise BudgetListError("enter at least one budget, e.g. AR, 16, 32, 64")
    out: list[str] = []
    for item in items:
        if item.lower() in _AR_WORDS:
            label = AR_LABEL
        else:
            try:
                value = int(item)
            except ValueError:
                raise BudgetListError(f"{item!r} is not a budget (a number of tree nodes, or AR)") from None
            if not 1 <= value <= MAX_BUDGET:
                raise BudgetListError(f"budget {value} is out of range (1 to {MAX_BUDGET})")
            label = str(value)
        if label not in out:
            out.append(label)
    return out


@dataclass
class CompareRow:
    label: str
    status: str = "queued"  # queued | running | done | error | cancelled
    result: GenerationResult | None = None
    error: str = ""
    live_rounds: int = 0
    live_tokens: int = 0
    live_tps: float | None = None
    prefill_ms: float = 0.0  # this run's prefill, for its live tokens/s
    trace: AnswerTrace | None = None  # every round this run reported, for the race (race.py)

    @property
    def tps(self) -> float | None:
        return self.result.tokens_per_second if self.result and self.result.rounds else None

    @property
    def tau(self) -> float | None:
        return self.result.mean_accept_length if self.result and self.result.rounds else None


@dataclass
class CompareState:
    labels: list[str]
    prompt: str = ""
    job_id: int | None = None
    rows: list[CompareRow] = field(default_factory=list)
    running: bool = False
    cancelled: bool = False
    baseline: ArBaseline | None = None  # used when the list has no AR entry
    # The answer's expected length in tokens, for the bar inside a run (0: unknown). Every run
    # reruns the same prompt, so once one finished its length is the estimate.
    expected_tokens: int = 0
    params: dict[str, GenerationParams] = field(default_factory=dict)  # label -> the run's parameters
    run_trace: AnswerTrace | None = None  # the run in progress

    def __post_init__(self) -> None:
        if not self.rows:
            self.rows = [CompareRow(label) for label in self.labels]

    @property
    def done_count(self) -> int:
        return sum(1 for r in self.rows if r.status in ("done", "error", "cancelled"))

    def same_as_ar(self, row: CompareRow) -> bool | None:
        """Whether `row`'s answer is token-identical to the AR row's (None: nothing to compare)."""
        ar = next((r for r in self.rows if r.label == AR_LABEL and r.result is not None), None)
        if ar is None or row.result is None or row is ar:
            return None
        return row.result.token_ids == ar.result.token_ids

    def scaling_points(self) -> tuple[list[int], list[float], list[float]]:
        """(budgets, tokens/s, tau) of the finished budget runs, by budget: the scaling plot."""
        rows = sorted((r for r in self.rows if r.label != AR_LABEL and r.tps is not None), key=lambda r: int(r.label))
        return [int(r.label) for r in rows], [r.tps or 0.0 for r in rows], [r.tau or 0.0 for r in rows]

    @property
    def progress(self) -> float:
        """Runs done, plus the running one's share (its tokens so far over the expected length)."""
        running = next((r for r in self.rows if r.status == "running"), None)
        if running is None:
            return float(self.done_count)
        finished = next((r.result.new_tokens for r in self.rows if r.status == "done" and r.result), 0)
        expected = finished or self.expected_tokens
        share = min(running.live_tokens / expected, 0.99) if expected else 0.0
        return self.done_count + share

    def ar_tps(self) -> tuple[float | None, str]:
        for r in self.rows:
            if r.label == AR_LABEL and r.tps:
                return r.tps, "AR row"
        if self.baseline is not None:
            return self.baseline.tokens_per_second, self.baseline.source
        return None, ""

    # -- the engine's reports

    def run_started(self, index: int) -> CompareRow:
        row = self.rows[index]
        row.status = "running"
        return row

    def run_event(self, index: int, event: Event, prefill_ms: float) -> None:
        row = self.rows[index]
        if isinstance(event, RoundEvent):
            row.live_rounds = event.index + 1
            row.live_tokens = event.answer_tokens
            decode_s = event.elapsed_s - prefill_ms / 1000.0
            row.live_tps = (event.answer_tokens - 1) / decode_s if decode_s > 0 else None

    def run_finished(self, index: int, result: GenerationResult | None, error: str) -> CompareRow:
        row = self.rows[index]
        row.result = result
        row.error = error
        if error:
            row.status = "error"
        elif result is not None and result.finish_reason == "cancelled":
            row.status = "cancelled"
        else:
            row.status = "done"
        return row

    def finished(self, cancelled: bool) -> None:
        self.running = False
        self.cancelled = cancelled
        for row in self.rows:
            if row.status in ("queued", "running"):
                row.status = "cancelled"

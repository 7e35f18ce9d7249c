"""The app's budget comparison: open the screen, start and cancel runs, feed their reports
to `CompareState` (the screen draws it)."""
from __future__ import annotations

import copy
from dataclasses import replace

from jetspec_chat.engine.params import GenerationParams, auto_compare_budgets
from jetspec_chat.settings import compare_labels

from . import engine_worker as ew
from .compare import CompareScreen
from .compare_state import AR_LABEL, CompareState
from .jobs import Job
from .liveness import can_update, dismiss_if_current
from .trace import AnswerTrace


class CompareMixin:
    """Part of `JetspecApp`: the compare screen's runs."""

    compare: CompareState | None
    compare_screen: CompareScreen | None
    _compare_params: dict[str, GenerationParams]  # label -> the run's parameters
    _compare_trace: AnswerTrace | None  # the run in progress
    race_after_compare: bool  # --race

    def action_compare(self) -> None:
        if can_update(self.compare_screen):  # open: F6 closes it
            dismiss_if_current(self.compare_screen)
            return
        if self.compare is None or not self.compare.running:
            if not self._ready_for_rerun("compare budgets"):
                return
            self.compare = CompareState(self.compare_list(), prompt=self.last_user_text() or "")
        self.compare_screen = CompareScreen(self.compare, ", ".join(self.compare_list()))
        self.push_screen(self.compare_screen)

    def compare_list(self) -> list[str]:
        """The budgets F6 runs: the user's list, or the default for the engine's device."""
        if self.settings.compare_budgets is not None:
            return list(self.settings.compare_budgets)
        device = self.engine_info.device if self.engine_info is not None else self.spec.device
        return compare_labels(auto_compare_budgets(device))

    def estimate_compare_seconds(self, labels: list[str]) -> float | None:
        """How long a comparison of `labels` should take, from the tokens/s measured so far on
        this engine (earlier comparison rows, the last answer); a budget not measured yet is
        counted at the slowest measured speed. None before anything was measured."""
        measured: dict[str, float] = {}
        last = self.last_answer_trace()
        if last is not None and last.result is not None and last.result.tokens_per_second > 0:
            spec = last.params.spec
            measured[str(spec.budget) if spec.enabled else AR_LABEL] = last.result.tokens_per_second
        for row in self.compare.rows if self.compare is not None else ():
            if row.tps:
                measured[row.label] = row.tps
        if not measured:
            return None
        tokens = self._expected_rerun_tokens(self.settings.max_new_tokens)
        slowest = min(measured.values())
        return sum(tokens / measured.get(label, slowest) for label in labels)

    def start_compare(self, labels: list[str]) -> None:
        if self.busy:
            self.notify("Wait for the current run to finish, or press Esc to stop it.", severity="warning")
            return
        if list(labels) != self.compare_list():  # an edited list is kept; the default follows the device
            self.settings.compare_budgets = list(labels)
        self.save_settings()
        base = self.generation_params()
        entries = []
        for label in labels:
            if label == AR_LABEL:
                params = replace(base, spec=replace(base.spec, enabled=False))
            else:
                params = replace(base, spec=replace(base.spec, enabled=True, budget=int(label)))
            entries.append(ew.CompareEntry(label, params))
        state = CompareState(list(labels), prompt=self.last_user_text() or "", baseline=self.baselines.for_trace(self.current_trace),
                             expected_tokens=self._expected_rerun_tokens(base.max_new_tokens))
        state.running = True
        state.job_id = self.worker.submit(ew.CompareCommand(tuple(entries)))
        self.jobs[state.job_id] = Job("compare", None, None, turn=self.turn, pre_session=copy.deepcopy(self.session_data))
        self.compare = state
        self._compare_params = {e.label: e.params for e in entries}
        if self.compare_screen is not None:
            self.compare_screen.set_state(state)
        self.refresh_chrome()

    def _expected_rerun_tokens(self, max_new_tokens: int) -> int:
        """How long a rerun of the last answer should be: that answer's length, unless it was
        cut short (Esc), when the rerun may run up to the limit."""
        last = self.last_answer_trace()
        if last is None or last.result is None or last.result.finish_reason == "cancelled":
            return max_new_tokens
        return last.result.new_tokens

    def cancel_compare(self) -> None:
        if self.compare and self.compare.running and self.compare.job_id is not None:
            self.worker.cancel(self.compare.job_id)
            self.stopping = True

    def _on_compare_started(self, item: ew.CompareRunStarted) -> None:
        state = self.compare
        if state is None or state.job_id != item.job_id:
            return
        row = state.run_started(item.index)
        params = self._compare_params.get(item.label, self.generation_params())
        trace = AnswerTrace(job_id=item.job_id, kind="compare", params=params, user_text=state.prompt)
        self.traces.append(trace)
        self._compare_trace = trace
        row.trace = trace  # the race replays it
        self._dirty.add("compare")

    def _on_compare_event(self, item: ew.GenerationEvent) -> None:
        state = self.compare
        if state is None or state.job_id != item.job_id:
            return
        trace = self._compare_trace
        if trace is not None:
            trace.add(item.event)
        prefill_ms = trace.prefill.ms if trace is not None and trace.prefill else 0.0
        state.run_event(item.run_index, item.event, prefill_ms)
        self._dirty.add("compare")

    def _on_compare_finished(self, item: ew.CompareRunFinished) -> None:
        state = self.compare
        if state is None or state.job_id != item.job_id:
            return
        row = state.run_finished(item.index, item.result, item.error)
        if row.label == AR_LABEL and row.status == "done" and self._compare_trace is not None:
            turn = self.jobs[item.job_id].turn if item.job_id in self.jobs else self.turn
            self.baselines.record(self._compare_trace, f"the budget comparison's AR run, turn {turn}")
            self._dirty.add("stats")
        self._dirty.add("compare")

    def _on_compare_done(self, item: ew.JobFinished) -> None:
        state = self.compare
        if state is None or state.job_id != item.job_id:
            return
        state.finished(item.cancelled)
        self._dirty.update({"compare", "stats"})
        if self.race_after_compare and not item.cancelled and can_update(self.compare_screen):
            self.compare_screen.action_race()  # --race

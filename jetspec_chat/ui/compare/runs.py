"""The budget comparison's runs: which budgets, how long they should take, starting and
cancelling them, and what the engine's reports change in `CompareState` (no Textual here)."""
from __future__ import annotations

import copy
from dataclasses import replace
from typing import TYPE_CHECKING

from jetspec_chat.engine.params import auto_compare_budgets
from jetspec_chat.settings import compare_labels

from .. import engine_worker as ew
from ..jobs import Job
from ..trace import AnswerTrace
from .state import AR_LABEL, CompareState

if TYPE_CHECKING:  # the controller imports this package's state
    from ..controller import ChatController


class CompareRuns:
    """Runs comparisons on the chat's engine; the state is `chat.compare`."""

    def __init__(self, chat: ChatController) -> None:
        self.chat = chat

    def budget_labels(self) -> list[str]:
        """The budgets F6 runs: the user's list, or the default for the engine's device."""
        chat = self.chat
        if chat.settings.compare_budgets is not None:
            return list(chat.settings.compare_budgets)
        device = chat.engine_info.device if chat.engine_info is not None else chat.engine_setup.device
        return compare_labels(auto_compare_budgets(device))

    def new_state(self) -> CompareState:
        """A comparison of the default budgets on the last prompt, not started."""
        return CompareState(self.budget_labels(), prompt=self.chat.last_user_text() or "")

    def estimate_seconds(self, labels: list[str]) -> float | None:
        """How long a comparison of `labels` should take, from the tokens/s measured so far on
        this engine (earlier comparison rows, the last answer); a budget not measured yet is
        counted at the slowest measured speed. None before anything was measured."""
        chat = self.chat
        measured: dict[str, float] = {}
        last = chat.last_answer_trace()
        if last is not None and last.result is not None and last.result.tokens_per_second > 0:
            spec = last.params.spec
            measured[str(spec.budget) if spec.enabled else AR_LABEL] = last.result.tokens_per_second
        for row in chat.compare.rows if chat.compare is not None else ():
            if row.tps:
                measured[row.label] = row.tps
        if not measured:
            return None
        tokens = self.expected_rerun_tokens(chat.settings.max_new_tokens)
        slowest = min(measured.values())
        return sum(tokens / measured.get(label, slowest) for label in labels)

    def expected_rerun_tokens(self, max_new_tokens: int) -> int:
        """How long a rerun of the last answer should be: that answer's length, unless it was
        cut short (Esc), when the rerun may run up to the limit."""
        last = self.chat.last_answer_trace()
        if last is None or last.result is None or last.result.finish_reason == "cancelled":
            return max_new_tokens
        return last.result.new_tokens

    def start(self, labels: list[str]) -> CompareState:
        """Submit a comparison of `labels` (the caller checked nothing else runs)."""
        chat = self.chat
        if list(labels) != self.budget_labels():  # an edited list is kept; the default follows the device
            chat.settings.compare_budgets = list(labels)
        base = chat.generation_params()
        entries = []
        for label in labels:
            if label == AR_LABEL:
                params = replace(base, spec=replace(base.spec, enabled=False))
            else:
                params = replace(base, spec=replace(base.spec, enabled=True, budget=int(label)))
            entries.append(ew.CompareEntry(label, params))
        state = CompareState(list(labels), prompt=chat.last_user_text() or "", baseline=chat.baseline,
                             expected_tokens=self.expected_rerun_tokens(base.max_new_tokens),
                             params={e.label: e.params for e in entries})
        state.running = True
        state.job_id = chat.worker.submit(ew.CompareCommand(tuple(entries)))
        chat.jobs[state.job_id] = Job("compare", None, None, turn=chat.turn, pre_session=copy.deepcopy(chat.session_data))
        chat.compare = state
        return state

    def cancel(self) -> None:
        state = self.chat.compare
        if state and state.running and state.job_id is not None:
            self.chat.worker.cancel(state.job_id)
            self.chat.stopping = True

    # -- the engine's reports (each False when it is not about the comparison on screen)

    def _state_for(self, job_id: int) -> CompareState | None:
        state = self.chat.compare
        return state if state is not None and state.job_id == job_id else None

    def run_started(self, item: ew.CompareRunStarted) -> bool:
        state = self._state_for(item.job_id)
        if state is None:
            return False
        row = state.run_started(item.index)
        params = state.params.get(item.label, self.chat.generation_params())
        trace = AnswerTrace(job_id=item.job_id, kind="compare", params=params, user_text=state.prompt)
        self.chat.traces.append(trace)
        state.run_trace = trace
        row.trace = trace  # the race replays it
        return True

    def run_event(self, item: ew.GenerationEvent) -> bool:
        state = self._state_for(item.job_id)
        if state is None:
            return False
        trace = state.run_trace
        if trace is not None:
            trace.add(item.event)
        prefill_ms = trace.prefill.ms if trace is not None and trace.prefill else 0.0
        state.run_event(item.run_index, item.event, prefill_ms)
        return True

    def run_finished(self, item: ew.CompareRunFinished) -> bool:
        """True when the run was the AR one and is now the prompt's baseline (stats change)."""
        state = self._state_for(item.job_id)
        if state is None:
            return False
        row = state.run_finished(item.index, item.result, item.error)
        if row.label == AR_LABEL and row.status == "done" and state.run_trace is not None:
            chat = self.chat
            turn = chat.jobs[item.job_id].turn if item.job_id in chat.jobs else chat.turn
            chat.baselines.record(state.run_trace, f"the budget comparison's AR run, turn {turn}")
            return True
        return False

    def finished(self, item: ew.JobFinished) -> bool:
        state = self._state_for(item.job_id)
        if state is None:
            return False
        state.finished(item.cancelled)
        return True

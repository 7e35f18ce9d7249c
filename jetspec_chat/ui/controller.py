"""The chat's state and its engine connection, without Textual.

`ChatController` owns what the app knows and asks of the engine: the engine worker and its
outbox, what loading reported, the jobs in flight and their traces, the mirror of the engine's
session, the budget comparison and the settings (speculation included). Widgets draw it
(chat_view.py); engine_reports.py applies the engine's reports to it.
"""
from __future__ import annotations

import copy
import queue
from dataclasses import replace
from typing import Any

from jetspec_chat.engine.events import PrefillEvent
from jetspec_chat.engine.params import GenerationParams, SamplingParams, SpecParams
from jetspec_chat.settings import SessionStore, Settings, save_settings

from . import engine_worker as ew
from .compare.state import CompareState
from .engine_process import EngineProcess
from .jobs import Job
from .trace import AnswerTrace, ArBaselines

KEEP_ROUNDS_OF_LAST = 20  # answers whose per-round trees stay in memory (for stepping and export)


class ChatController:
    """The chat's state and what the app asks of the engine."""

    def __init__(self, *, engine_setup: ew.EngineSetup, settings: Settings, backend: ew.Backend | None,
                 engine_process: bool, persist_settings: bool) -> None:
        """`backend`: see `JetspecApp`. `engine_process`: run the engine in a child process
        rather than on a thread of this one."""
        self.engine_setup = engine_setup
        self.settings = settings
        self.persist_settings = persist_settings
        self.backend = backend
        self.engine_process = engine_process
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.worker: ew.EngineWorker | EngineProcess = self.new_worker()
        self.engine_stopped: str | None = None  # why the engine process ended, until restarted
        self.store = SessionStore()
        # engine / load state
        self.engine_info: ew.EngineInfo | None = None
        self.load_state = "loading"  # loading | ready | failed
        self.load_error = ""
        self.load_retryable = True  # whether loading again can help (not for a missing package)
        self.load_progress: ew.LoadProgress | None = None
        # jobs and traces
        self.jobs: dict[int, Job] = {}
        self.chat_job: int | None = None
        self.aux_job: int | None = None
        self.traces: list[AnswerTrace] = []  # this chat's answers (and runs), for the trace export
        self.current_trace: AnswerTrace | None = None  # the answer the tree and stats show
        self.compare: CompareState | None = None  # the budget comparison (compare/runs.py runs it)
        self.baselines = ArBaselines()  # AR measured per prompt key: speedups compare like with like
        self.stopping = False
        # session mirror (copied from the engine's reports)
        self.session_data: dict | None = None
        self.session_messages: tuple[dict, ...] = ()
        self.context_tokens = 0
        self.session_name: str | None = None
        self.last_prefill: PrefillEvent | None = None

    # ------------------------------------------------------------------ the engine

    def new_worker(self) -> ew.EngineWorker | EngineProcess:
        if self.engine_process:
            return EngineProcess(self.backend, self.outbox)
        return ew.EngineWorker(self.backend, self.outbox)

    def load_command(self) -> ew.LoadCommand:
        """Load the model and warm the budgets the first answers and the compare screen use."""
        s = self.settings
        compare = None if s.compare_budgets is None else tuple(int(b) for b in s.compare_budgets if b.isdigit())
        return ew.LoadCommand(self.engine_setup, s.system_prompt, s.thinking, None if s.budget_auto else s.budget, compare)

    def start_loading(self) -> None:
        self.load_state = "loading"
        self.load_progress = None
        self.worker.submit(self.load_command())

    def restart_engine(self) -> None:
        """A new engine (process): load the model again and put the conversation back."""
        self.worker.shutdown(timeout=0.2)
        self.worker = self.new_worker()
        self.worker.start()
        self.engine_stopped = None
        self.engine_info = None
        self.start_loading()
        if self.session_data is not None:
            self.worker.submit(ew.RestoreSessionCommand(self.session_data, self.session_name or ""))

    @property
    def algos(self) -> tuple[str, ...]:
        return self.engine_info.tree_algos if self.engine_info else ew.tree_algos(self.worker.backend)

    @property
    def has_head(self) -> bool:
        return self.engine_info is None or self.engine_info.max_depth is not None

    @property
    def max_depth(self) -> int | None:
        return self.engine_info.max_depth if self.engine_info else None

    # ------------------------------------------------------------------ settings

    def save_settings(self) -> str | None:
        """Write the settings; the error's sentence when that failed."""
        if not self.persist_settings:
            return None
        try:
            save_settings(self.settings)
        except OSError as err:
            return f"could not save settings: {err}"
        return None

    def generation_params(self, **speculation_changes: Any) -> GenerationParams:
        s = self.settings
        depth = s.depth
        if depth is not None and self.max_depth is not None and depth >= self.max_depth:
            depth = None
        spec = SpecParams(
            budget=s.budget,
            depth=depth,
            width=s.width,
            tree_algo=s.tree_algo,
            enabled=s.speculation and self.has_head,
        )
        if speculation_changes:
            spec = replace(spec, **speculation_changes)
        seed = s.seed if s.seed is not None else (0 if s.temperature > 0 else None)
        return GenerationParams(
            max_new_tokens=s.max_new_tokens,
            spec=spec,
            sampling=SamplingParams(temperature=s.temperature, top_p=s.top_p, seed=seed),
        )

    def push_live_speculation(self) -> bool:
        """Send the settings' tree shape to the answer in progress; False if it has none to change."""
        job = self.jobs.get(self.chat_job) if self.chat_job is not None else None
        if job is None or job.trace is None or job.trace.finished:
            return False
        spec = self.generation_params().spec
        current = job.live_spec if job.live_spec is not None else job.trace.params.spec
        if spec == current:
            return False
        job.live_spec = spec
        self.worker.update_spec(self.chat_job, spec)
        return True

    # ------------------------------------------------------------------ the conversation

    @property
    def busy(self) -> bool:
        return self.chat_job is not None or self.aux_job is not None or bool(self.compare and self.compare.running)

    @property
    def turn(self) -> int:
        return sum(1 for m in self.session_messages if m.get("role") == "user")

    @property
    def baseline(self):
        """The AR measurement of the answer on screen's own prompt, if any (None otherwise)."""
        return self.baselines.for_trace(self.current_trace)

    def last_user_text(self) -> str | None:
        for m in reversed(self.session_messages):
            if m.get("role") == "user":
                return str(m.get("content", ""))
        return None

    def last_answer_trace(self) -> AnswerTrace | None:
        """The trace of the answer now last in the chat (a chat turn or a kept rerun)."""
        for trace in reversed(self.traces):
            if trace.kind in ("chat", "rerun") and trace.result is not None:
                return trace
        return None

    def session_thinking(self) -> bool:
        if self.session_data is not None:
            return bool(self.session_data.get("thinking", self.settings.thinking))
        return self.settings.thinking

    def cannot_send(self) -> str | None:
        """Why a message cannot be sent now (None: it can)."""
        if self.engine_stopped is not None:
            return "The engine is not running: press ctrl+e to restart it (your message stays in the box)."
        if self.load_state == "failed":
            retry = " Retry from the command palette (ctrl+p: Retry loading)." if self.load_retryable else ""
            return f"No model is loaded ({self.load_error}).{retry}"
        return None

    def cannot_rerun(self, what: str) -> str | None:
        """Why `what` (a rerun of the last prompt) cannot start now (None: it can)."""
        if self.load_state != "ready":
            return f"Cannot {what}: the model is not loaded."
        if self.busy:
            return f"Cannot {what} while a run is going (Esc stops it)."
        if self.last_user_text() is None:
            return f"Send a message first: {what} reruns the last prompt."
        return None

    def send(self, text: str, params: GenerationParams, message: Any) -> AnswerTrace:
        """Ask the engine for the answer to `text`, streamed into `message` (an AssistantMessage)."""
        trace = AnswerTrace(job_id=0, kind="chat", params=params, user_text=text)
        job_id = self.worker.submit(ew.SendCommand(text, params))
        trace.job_id = job_id
        self.jobs[job_id] = Job("chat", trace, message, turn=self.turn + 1)
        self.chat_job = job_id
        self.traces.append(trace)
        self.prune_traces()
        self.current_trace = trace
        return trace

    def measure_ar(self) -> None:
        """Rerun the last prompt without speculation: the AR speed speedups are measured against."""
        params = self.generation_params(enabled=False)
        job_id = self.worker.submit(ew.RerunCommand(params, "ar"))
        trace = AnswerTrace(job_id=job_id, kind="rerun", params=params, user_text=self.last_user_text() or "")
        self.jobs[job_id] = Job("rerun", trace, None, turn=self.turn, pre_session=copy.deepcopy(self.session_data))
        self.traces.append(trace)
        self.aux_job = job_id

    def stop(self) -> bool:
        """Cancel what runs (at its next round boundary); False when nothing did."""
        cancelled = False
        for job_id in (self.chat_job, self.aux_job):
            if job_id is not None:
                self.worker.cancel(job_id)
                cancelled = True
        if self.compare and self.compare.running and self.compare.job_id is not None:
            self.worker.cancel(self.compare.job_id)
            cancelled = True
        if cancelled:
            self.stopping = True
        return cancelled

    def prune_traces(self) -> None:
        """Drop the per-round trees of old answers (their text and results stay)."""
        for trace in self.traces[:-KEEP_ROUNDS_OF_LAST]:
            if trace.rounds:
                trace.rounds = []
                trace.round_offsets = []

    def clear_chat(self) -> None:
        """Forget this chat's answers and runs (a new or reopened conversation)."""
        self.traces = []
        self.current_trace = None
        self.last_prefill = None
        self.chat_job = None
        self.aux_job = None

    def keep_partial_turn(self, trace: AnswerTrace) -> None:
        """Add the interrupted turn to the session mirror, as a cancel would have kept it: the
        restarted engine continues from the conversation on screen."""
        if self.session_data is None or not trace.user_text:
            return
        data = dict(self.session_data)
        messages = [dict(m) for m in data.get("messages", [])]
        messages.append({"role": "user", "content": trace.user_text})
        messages.append({"role": "assistant", "content": trace.text})
        data["messages"] = messages
        self.session_data = data
        self.session_messages = tuple(messages)

    def put_session_back(self, session: dict) -> None:
        """Make `session` the engine's conversation again (and this mirror's)."""
        self.worker.submit(ew.RestoreSessionCommand(session))
        self.session_data = session
        self.session_messages = tuple(session.get("messages", []))

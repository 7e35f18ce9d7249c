"""The app's side of the engine outbox: drain it on a timer, route each item to its handler
(a table keyed by item type, see `jobs.OutboxRouter`), apply it to the chat's state and show
the batched result once (`ChatView.flush`)."""
from __future__ import annotations

import queue
import traceback
from typing import Any, Callable

from jetspec_chat.engine.events import FinishEvent, PrefillEvent, RoundEvent
from jetspec_chat.engine.params import auto_budget
from jetspec_chat.settings import error_log_path

from . import engine_worker as ew
from .chat_view import ChatView
from .compare import CompareRuns
from .controller import ChatController
from .jobs import OutboxRouter
from .liveness import can_update
from .session_actions import SessionActions
from .speculation_controls import NO_HEAD_NOTE

MAX_ITEMS_PER_DRAIN = 5000


class EngineReports:
    """Engine reports in: the chat's state changes, the view is marked for a redraw."""

    def __init__(self, chat: ChatController, view: ChatView, compare_runs: CompareRuns, sessions: SessionActions,
                 *, log_error: Callable[[str, str], None], race_after_compare: bool) -> None:
        """`log_error(what, details)`: append to the error log. `race_after_compare` (--race):
        each finished comparison opens its race."""
        self.chat = chat
        self.view = view
        self.compare_runs = compare_runs
        self.sessions = sessions
        self.log_error = log_error
        self.race_after_compare = race_after_compare
        self.router = OutboxRouter(
            {
                ew.LoadProgress: self._on_load_progress,
                ew.EngineReady: self._on_engine_ready,
                ew.EngineLoadFailed: self._on_engine_load_failed,
                ew.JobStarted: self._on_job_started,
                ew.GenerationEvent: self._on_generation_event,
                ew.CompareRunStarted: self._on_compare_run_started,
                ew.CompareRunFinished: self._on_compare_run_finished,
                ew.JobFinished: self._on_job_finished,
                ew.JobFailed: self._on_job_failed,
                ew.SpecApplied: self._on_spec_applied,
                ew.SpecRejected: self._on_spec_rejected,
                ew.SessionSnapshot: self._on_session_snapshot,
                ew.EngineDied: self._on_engine_died,
            }
        )
        self._draining = False

    async def drain(self, force: bool = False) -> None:
        """Handle what the engine reported, then draw it in one frame when the frame budget
        allows (or `force`); until then the text and the redraws wait in the view."""
        # Reports wait in the outbox until the main screen is composed: their handlers update it.
        if self._draining or not self.view.ready():
            return
        self._draining = True
        try:
            items = []
            while len(items) < MAX_ITEMS_PER_DRAIN:
                try:
                    items.append(self.chat.outbox.get_nowait())
                except queue.Empty:
                    break
            for item in items:
                try:
                    await self._handle(item)
                except Exception:  # noqa: BLE001 - a UI bug must not take the app down
                    self.log_error("UI error while handling an engine event", traceback.format_exc())
            view = self.view
            if (view.dirty or view.pending) and (force or view.frames.allows()):
                await view.flush()
                view.frames.drew()
        finally:
            self._draining = False

    async def _handle(self, item: Any) -> None:
        if not await self.router.dispatch(item):
            self.log_error("unknown engine report", repr(item))
        self.view.dirty.add("chrome")

    # -- the engine

    def _on_load_progress(self, item: ew.LoadProgress) -> None:
        self.chat.load_progress = item
        self.view.dirty.add("loading")

    async def _on_engine_ready(self, item: ew.EngineReady) -> None:
        chat, info = self.chat, item.info
        chat.engine_info = info
        chat.load_state = "ready"
        self.view.dirty.add("loading")
        settings = chat.settings
        if settings.tree_algo not in info.tree_algos:
            settings.tree_algo = info.tree_algos[0]
        head = f" with draft head {info.head_name}" if info.head_name else ""
        budget = ""
        if settings.budget_auto:
            settings.budget = auto_budget(info.device)
            where = "a GPU" if info.device.startswith("cuda") else "a CPU"
            budget = f" Budget {settings.budget}: the default on {where} (F2/F3 or --budget change it)."
        warmed = ""
        if info.warmed:
            labels = ", ".join("AR" if b == 0 else str(b) for b in info.warmed)
            warmed = f" Warmed up {labels} (kernels and graphs) in {info.warm_seconds:.1f} s."
        await self.view.add_note_async(
            f"Loaded {info.model_name}{head} on {info.device} ({info.dtype}), context {info.max_context:,} tokens."
            + budget
            + warmed,
            "info",
        )
        if info.max_depth is None:
            await self.view.add_note_async(NO_HEAD_NOTE, "warning")

    async def _on_engine_load_failed(self, item: ew.EngineLoadFailed) -> None:
        chat = self.chat
        chat.load_state = "failed"
        chat.load_error = item.message
        chat.load_retryable = item.retryable
        self.view.dirty.add("loading")
        if item.details:
            self.log_error("model load failed", item.details)
        hint = " Details are in " + str(error_log_path()) + "." if item.details else ""
        await self.view.add_note_async(f"Could not load the model: {item.message.rstrip('.')}.{hint}", "error")

    async def _on_engine_died(self, item: ew.EngineDied) -> None:
        """The engine process is gone: end what it was doing (answers keep their text), keep
        the conversation, and say how to get the engine back."""
        chat, view = self.chat, self.view
        chat.engine_stopped = item.message
        chat.load_state = "failed"
        chat.load_error = "the engine process stopped"
        chat.load_retryable = True
        view.dirty.add("loading")
        for job_id, job in list(chat.jobs.items()):
            if job.kind == "chat" and job.message is not None and job.trace is not None:
                await view.finish_message(job)
                job.trace.error = "the engine process stopped"
                job.message.set_meta("⚠ stopped: the engine process ended", "error")
                chat.keep_partial_turn(job.trace)
            chat.jobs.pop(job_id, None)
        chat.chat_job = chat.aux_job = None
        if chat.compare is not None and chat.compare.running:
            chat.compare.finished(cancelled=True)
            view.dirty.add("compare")
        chat.stopping = False
        view.dirty.update({"tree", "stats"})
        await view.add_note_async(
            f"{item.message} The conversation is kept: press ctrl+e to restart the engine.", "error"
        )

    # -- jobs

    def _on_job_started(self, item: ew.JobStarted) -> None:
        """Nothing to show: the app set the job up when it submitted it."""

    def _on_generation_event(self, item: ew.GenerationEvent) -> None:
        if item.kind == "compare":
            if self.compare_runs.run_event(item):
                self.view.dirty.add("compare")
            return
        job = self.chat.jobs.get(item.job_id)
        if job is None or job.trace is None:
            return
        text = job.trace.add(item.event)
        if isinstance(item.event, PrefillEvent):
            self.chat.last_prefill = item.event
        if job.kind == "chat":
            pending = self.view.pending
            if text and job.message is not None:
                pending[job.message] = pending.get(job.message, "") + text
            if isinstance(item.event, (RoundEvent, FinishEvent)):
                self.view.dirty.add("tree")

    async def _on_job_finished(self, item: ew.JobFinished) -> None:
        chat, view = self.chat, self.view
        job = chat.jobs.get(item.job_id)
        if job is None:
            return
        if job.kind == "chat":
            await view.finish_message(job)
            trace = job.trace
            if trace is not None and trace.result is not None and job.message is not None:
                if job.message.raw != trace.result.text:  # the result's text is authoritative
                    await job.message.set_text(trace.result.text)
                job.message.set_label("jetspec · " + trace.label)
                job.message.set_meta(*view.meta_for(trace))
                if not trace.speculated and trace.result.rounds:
                    chat.baselines.record(trace, f"plain AR answer, turn {job.turn}")
            if chat.chat_job == item.job_id:
                chat.chat_job = None
            view.dirty.update({"tree", "stats"})
        elif job.kind == "rerun":
            trace = job.trace
            if chat.aux_job == item.job_id:
                chat.aux_job = None
            if trace is not None and trace.result is not None and trace.result.rounds and not item.cancelled:
                r = trace.result
                chat.baselines.record(trace, f"AR rerun of turn {job.turn}, {r.new_tokens} tokens")
                await view.add_note_async(
                    f"Plain AR on the last prompt: {r.tokens_per_second:.1f} tokens/s "
                    f"({r.new_tokens} tokens, {r.decode_seconds * 1000 / max(1, r.rounds):.1f} ms/token). "
                    "Speedups are now measured against it.",
                    "info",
                )
            elif item.cancelled:
                await view.add_note_async("AR measurement stopped.", "warning")
            view.dirty.add("stats")
        elif job.kind == "compare" and self.compare_runs.finished(item):
            view.dirty.update({"compare", "stats"})
            if self.race_after_compare and not item.cancelled and can_update(view.compare_screen):
                view.compare_screen.action_race()  # --race
        if not chat.busy:
            chat.stopping = False

    async def _on_job_failed(self, item: ew.JobFailed) -> None:
        chat, view = self.chat, self.view
        job = chat.jobs.get(item.job_id)
        if item.details:
            self.log_error(f"{item.kind} failed", item.details)
        hint = f" (details in {error_log_path()})" if item.details else ""
        message = f"{item.message}{hint}"
        if job is not None and job.kind == "chat":
            await view.finish_message(job)
            if job.trace is not None:
                job.trace.error = item.message
            msg = job.message
            if msg is not None and not msg.raw.strip():
                await msg.remove()
                await view.add_note_async(f"Engine error: {message}", "error")
            elif msg is not None:
                msg.set_meta(f"⚠ stopped by an engine error: {message}", "error")
            if chat.chat_job == item.job_id:
                chat.chat_job = None
        elif job is not None and job.kind == "rerun":
            if chat.aux_job == item.job_id:
                chat.aux_job = None
            await view.add_note_async(f"AR measurement failed: {message}", "error")
        elif job is not None and job.kind == "compare":
            if chat.compare is not None:
                chat.compare.running = False
            view.dirty.add("compare")
            await view.add_note_async(f"Comparison failed: {message}", "error")
        else:
            await view.add_note_async(f"Engine error: {message}", "error")
        if not chat.busy:
            chat.stopping = False
        view.dirty.update({"tree", "stats"})

    # -- the comparison's runs

    def _on_compare_run_started(self, item: ew.CompareRunStarted) -> None:
        if self.compare_runs.run_started(item):
            self.view.dirty.add("compare")

    def _on_compare_run_finished(self, item: ew.CompareRunFinished) -> None:
        state = self.chat.compare
        if state is None or state.job_id != item.job_id:
            return
        if self.compare_runs.run_finished(item):
            self.view.dirty.add("stats")
        self.view.dirty.add("compare")

    # -- live tree changes

    def _on_spec_applied(self, item: ew.SpecApplied) -> None:
        job = self.chat.jobs.get(item.job_id)
        if job is None or job.trace is None:
            return
        job.trace.add_spec_change(item.from_round, item.spec)
        if job.message is not None:
            job.message.set_label("jetspec · " + job.trace.label)
        self.view.dirty.update({"tree", "stats"})

    async def _on_spec_rejected(self, item: ew.SpecRejected) -> None:
        job = self.chat.jobs.get(item.job_id)
        if job is not None and job.live_spec == item.spec:
            job.live_spec = None
        await self.view.add_note_async(f"Could not change the tree during the answer: {item.message}", "warning")

    # -- the engine's session

    async def _on_session_snapshot(self, item: ew.SessionSnapshot) -> None:
        chat = self.chat
        chat.session_data = item.data
        chat.session_messages = item.messages
        chat.context_tokens = item.context_tokens
        job = chat.jobs.get(item.job_id)
        if job is None:
            return
        if job.kind in ("rerun", "compare"):
            self.sessions.keep_original_answer(job, item)
        if job.kind in ("chat", "rerun", "compare") and chat.session_name:
            self.sessions.autosave()
        if job.kind != "chat" or (chat.chat_job != item.job_id):
            chat.jobs.pop(item.job_id, None)

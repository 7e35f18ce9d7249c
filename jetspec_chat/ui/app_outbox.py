"""The app's side of the engine outbox: drain it on a timer, route each item to its handler
(a table keyed by item type, see `jobs.OutboxRouter`), and show the batched result once."""
from __future__ import annotations

import queue
import traceback
from typing import Any

from rich.text import Text

from jetspec_chat.engine.events import FinishEvent, PrefillEvent, RoundEvent
from jetspec_chat.engine.params import auto_budget
from jetspec_chat.settings import error_log_path

from . import engine_worker as ew
from .app_spec import NO_HEAD_NOTE
from .jobs import Job, OutboxRouter
from .liveness import can_update
from .themes import SpecColors
from .trace import AnswerTrace, mean_round_ms, speedup

MAX_ITEMS_PER_DRAIN = 5000


class OutboxMixin:
    """Part of `JetspecApp`: engine reports in, chat and stats out."""

    _router: OutboxRouter | None = None

    async def _drain(self, force: bool = False) -> None:
        """Handle what the engine reported, then draw it in one frame when the frame budget
        allows (or `force`); until then the text and the redraws wait in `_pending`/`_dirty`."""
        # Reports wait in the outbox until the main screen is composed: their handlers update it.
        if self._draining or not self._main_ready():
            return
        self._draining = True
        try:
            items = []
            while len(items) < MAX_ITEMS_PER_DRAIN:
                try:
                    items.append(self.outbox.get_nowait())
                except queue.Empty:
                    break
            for item in items:
                try:
                    await self._handle(item)
                except Exception:  # noqa: BLE001 - a UI bug must not take the app down
                    self._log_error("UI error while handling an engine event", traceback.format_exc())
            if (self._dirty or self._pending) and (force or self.frames.allows()):
                await self._flush_updates()
                self.frames.drew()
        finally:
            self._draining = False

    async def drain_now(self) -> None:
        """Process and draw everything the engine has reported so far (tests use it too)."""
        await self._drain(force=True)

    def _outbox_router(self) -> OutboxRouter:
        return OutboxRouter(
            {
                ew.LoadProgress: self._on_load_progress,
                ew.EngineReady: self._engine_ready,
                ew.EngineLoadFailed: self._engine_load_failed,
                ew.JobStarted: self._on_job_started,
                ew.GenerationEvent: self._on_generation_event,
                ew.CompareRunStarted: self._on_compare_started,
                ew.CompareRunFinished: self._on_compare_finished,
                ew.JobFinished: self._on_job_finished,
                ew.JobFailed: self._on_job_failed,
                ew.SpecApplied: self._on_spec_applied,
                ew.SpecRejected: self._on_spec_rejected,
                ew.SessionSnapshot: self._engine_snapshot,
                ew.EngineDied: self._on_engine_died,
            }
        )

    async def _handle(self, item: Any) -> None:
        if self._router is None:
            self._router = self._outbox_router()
        if not await self._router.dispatch(item):
            self._log_error("unknown engine report", repr(item))
        self._dirty.add("chrome")

    def _on_load_progress(self, item: ew.LoadProgress) -> None:
        self.load_progress = item
        self._dirty.add("loading")

    async def _on_engine_died(self, item: ew.EngineDied) -> None:
        """The engine process is gone: end what it was doing (answers keep their text), keep
        the conversation, and say how to get the engine back."""
        self.engine_stopped = item.message
        self.load_state = "failed"
        self.load_error = "the engine process stopped"
        self.load_retryable = True
        self._dirty.add("loading")
        for job_id, job in list(self.jobs.items()):
            if job.kind == "chat" and job.message is not None and job.trace is not None:
                await self._finish_message(job)
                job.trace.error = "the engine process stopped"
                job.message.set_meta("⚠ stopped: the engine process ended", "error")
                self._keep_partial_turn(job.trace)
            self.jobs.pop(job_id, None)
        self.chat_job = self.aux_job = None
        if self.compare is not None and self.compare.running:
            self.compare.finished(cancelled=True)
            self._dirty.add("compare")
        self.stopping = False
        self._dirty.update({"tree", "stats"})
        await self.add_note_async(
            f"{item.message} The conversation is kept: press ctrl+e to restart the engine.", "error"
        )

    def _keep_partial_turn(self, trace: AnswerTrace) -> None:
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

    def _on_job_started(self, item: ew.JobStarted) -> None:
        """Nothing to show: the app set the job up when it submitted it."""

    async def _flush_updates(self) -> None:
        for msg, text in list(self._pending.items()):
            if text:
                await msg.append(text)
        self._pending.clear()
        if self.settings.provenance and self.chat_job is not None:
            job = self.jobs.get(self.chat_job)
            if job and job.message and job.trace:
                job.message.show_provenance(job.trace.segments, SpecColors.from_app(self))
        dirty, self._dirty = self._dirty, set()
        if "loading" in dirty:
            self._show_loading()
        if "tree" in dirty:
            self.tree_panel.rounds_updated()
        if "stats" in dirty or "tree" in dirty:
            self._update_stats()
        if "compare" in dirty and can_update(self.compare_screen):
            self.compare_screen.refresh_state()
        self.refresh_chrome()

    # -- engine state

    async def _engine_ready(self, item: ew.EngineReady) -> None:
        info = item.info
        self.engine_info = info
        self.load_state = "ready"
        self._dirty.add("loading")
        if self.settings.tree_algo not in info.tree_algos:
            self.settings.tree_algo = info.tree_algos[0]
        head = f" with draft head {info.head_name}" if info.head_name else ""
        budget = ""
        if self.settings.budget_auto:
            self.settings.budget = auto_budget(info.device)
            where = "a GPU" if info.device.startswith("cuda") else "a CPU"
            budget = f" Budget {self.settings.budget}: the default on {where} (F2/F3 or --budget change it)."
        warmed = ""
        if info.warmed:
            labels = ", ".join("AR" if b == 0 else str(b) for b in info.warmed)
            warmed = f" Warmed up {labels} (kernels and graphs) in {info.warm_seconds:.1f} s."
        await self.add_note_async(
            f"Loaded {info.model_name}{head} on {info.device} ({info.dtype}), context {info.max_context:,} tokens."
            + budget
            + warmed,
            "info",
        )
        if info.max_depth is None:
            await self.add_note_async(NO_HEAD_NOTE, "warning")

    async def _engine_load_failed(self, item: ew.EngineLoadFailed) -> None:
        self.load_state = "failed"
        self.load_error = item.message
        self.load_retryable = item.retryable
        self._dirty.add("loading")
        if item.details:
            self._log_error("model load failed", item.details)
        hint = " Details are in " + str(error_log_path()) + "." if item.details else ""
        await self.add_note_async(f"Could not load the model: {item.message.rstrip('.')}.{hint}", "error")

    # -- generation events

    def _on_generation_event(self, item: ew.GenerationEvent) -> None:
        if item.kind == "compare":
            self._on_compare_event(item)
            return
        job = self.jobs.get(item.job_id)
        if job is None or job.trace is None:
            return
        text = job.trace.add(item.event)
        if isinstance(item.event, PrefillEvent):
            self.last_prefill = item.event
        if job.kind == "chat":
            if text and job.message is not None:
                self._pending[job.message] = self._pending.get(job.message, "") + text
            if isinstance(item.event, (RoundEvent, FinishEvent)):
                self._dirty.add("tree")

    async def _on_job_finished(self, item: ew.JobFinished) -> None:
        job = self.jobs.get(item.job_id)
        if job is None:
            return
        if job.kind == "chat":
            await self._finish_message(job)
            trace = job.trace
            if trace is not None and trace.result is not None and job.message is not None:
                if job.message.raw != trace.result.text:  # the result's text is authoritative
                    await job.message.set_text(trace.result.text)
                job.message.set_label("jetspec · " + trace.label)
                job.message.set_meta(*self._meta_for(trace))
                if not trace.speculated and trace.result.rounds:
                    self.baselines.record(trace, f"plain AR answer, turn {job.turn}")
            if self.chat_job == item.job_id:
                self.chat_job = None
            self._dirty.update({"tree", "stats"})
        elif job.kind == "rerun":
            trace = job.trace
            if self.aux_job == item.job_id:
                self.aux_job = None
            if trace is not None and trace.result is not None and trace.result.rounds and not item.cancelled:
                r = trace.result
                self.baselines.record(trace, f"AR rerun of turn {job.turn}, {r.new_tokens} tokens")
                await self.add_note_async(
                    f"Plain AR on the last prompt: {r.tokens_per_second:.1f} tokens/s "
                    f"({r.new_tokens} tokens, {r.decode_seconds * 1000 / max(1, r.rounds):.1f} ms/token). "
                    "Speedups are now measured against it.",
                    "info",
                )
            elif item.cancelled:
                await self.add_note_async("AR measurement stopped.", "warning")
            self._dirty.add("stats")
        elif job.kind == "compare":
            self._on_compare_done(item)
        if not self.busy:
            self.stopping = False

    async def _on_job_failed(self, item: ew.JobFailed) -> None:
        job = self.jobs.get(item.job_id)
        if item.details:
            self._log_error(f"{item.kind} failed", item.details)
        hint = f" (details in {error_log_path()})" if item.details else ""
        message = f"{item.message}{hint}"
        if job is not None and job.kind == "chat":
            await self._finish_message(job)
            if job.trace is not None:
                job.trace.error = item.message
            msg = job.message
            if msg is not None and not msg.raw.strip():
                await msg.remove()
                await self.add_note_async(f"Engine error: {message}", "error")
            elif msg is not None:
                msg.set_meta(f"⚠ stopped by an engine error: {message}", "error")
            if self.chat_job == item.job_id:
                self.chat_job = None
        elif job is not None and job.kind == "rerun":
            if self.aux_job == item.job_id:
                self.aux_job = None
            await self.add_note_async(f"AR measurement failed: {message}", "error")
        elif job is not None and job.kind == "compare":
            if self.compare is not None:
                self.compare.running = False
            self._dirty.add("compare")
            await self.add_note_async(f"Comparison failed: {message}", "error")
        else:
            await self.add_note_async(f"Engine error: {message}", "error")
        if not self.busy:
            self.stopping = False
        self._dirty.update({"tree", "stats"})

    async def _finish_message(self, job: Job) -> None:
        msg = job.message
        if msg is None:
            return
        pending = self._pending.pop(msg, "")
        if pending:
            await msg.append(pending)
        await msg.finish()
        if self.settings.provenance and job.trace is not None:
            msg.show_provenance(job.trace.segments, SpecColors.from_app(self))

    def _meta_for(self, trace: AnswerTrace) -> tuple[Text, str]:
        r = trace.result
        assert r is not None
        colors = SpecColors.from_app(self)
        t = Text(no_wrap=False)
        kind = ""
        parts = [f"{r.new_tokens} tokens", f"{r.tokens_per_second:.1f} tok/s"]
        speculated = trace.speculated
        if speculated:
            parts.append(f"τ {r.mean_accept_length:.2f}")
        parts.append(f"{r.rounds} rounds")
        gain = speedup(r.mean_accept_length, mean_round_ms(trace.rounds), self.baselines.for_trace(trace))
        if speculated and gain is not None:
            parts.append(f"{gain:.2f}× vs AR on this prompt")
        t.append(" · ".join(parts), style=colors.muted)
        reason = {
            "eos": "",
            "stop": "",
            "length": "stopped at the max new tokens limit",
            "context_full": r.message or "the context window is full",
            "cancelled": "stopped (Esc)",
        }.get(r.finish_reason, r.finish_reason)
        if reason:
            t.append(f" · {reason}", style=f"bold {colors.bonus}")
            kind = "warning"
        if r.prefill_tokens or r.reused_tokens:
            reused = f", {r.reused_tokens:,} reused from the KV cache" if r.reused_tokens else ""
            t.append(f"\nprefill {r.prefill_tokens:,} new tokens{reused}", style=colors.muted)
        return t, kind

    # -- session snapshots

    async def _engine_snapshot(self, item: ew.SessionSnapshot) -> None:
        self.session_data = item.data
        self.session_messages = item.messages
        self.context_tokens = item.context_tokens
        job = self.jobs.get(item.job_id)
        if job is None:
            return
        if job.kind in ("rerun", "compare"):
            self._keep_original_answer(job, item)
        if job.kind in ("chat", "rerun", "compare") and self.session_name:
            self._autosave()
        if job.kind != "chat" or (self.chat_job != item.job_id):
            self.jobs.pop(item.job_id, None)

"""The app's sessions: new chat, save, open, autosave after each answer, and the F12 export
(screen SVG + round trace)."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from jetspec_chat.settings import SessionStoreError, atomic_write_text, exports_dir, suggest_session_name

from . import engine_worker as ew
from .chat import AssistantMessage, ChatLog, NoteMessage, UserMessage
from .dialogs import OpenSessionScreen, SaveSessionScreen
from .jobs import Job


class SessionsMixin:
    """Part of `JetspecApp`: the conversation as a whole, on disk and on screen."""

    def action_new_chat(self) -> None:
        self.action_stop()
        self.worker.submit(ew.NewSessionCommand(self.settings.system_prompt, self.settings.thinking))
        self._reset_chat_view()
        self.session_name = None
        self.session_data = None
        self.add_note("New chat (the previous conversation's KV cache was dropped).", "info")
        self.refresh_chrome()

    def _reset_chat_view(self) -> None:
        chat = self._q("#chat", ChatLog)
        chat.remove_children()
        self._pending.clear()
        self.traces = []
        self.current_trace = None
        self.last_prefill = None
        self.chat_job = None
        self.aux_job = None
        self._tree_position = None
        self.tree_panel.show_trace(None)
        self._update_stats()
        chat.follow()

    def action_save_session(self) -> None:
        messages = list(self.session_messages)
        if not any(m.get("role") == "user" for m in messages):
            self.notify("Nothing to save yet: send a message first.", severity="warning")
            return
        suggested = self.session_name or suggest_session_name(messages)
        existing = {s.name for s in self.store.list()}

        def done(name: str | None) -> None:
            if name:
                self.save_session_as(name)

        self.push_screen(SaveSessionScreen(suggested, existing), done)

    def save_session_as(self, name: str) -> Path | None:
        if self.session_data is None:
            self.notify("Nothing to save yet.", severity="warning")
            return None
        try:
            path = self.store.save(name, self.session_data, **self._session_meta())
        except SessionStoreError as err:
            self.add_note(f"Could not save the session: {err}", "error")
            return None
        self.session_name = path.stem
        self.add_note(f"Saved session {path.stem!r} to {path} (saved again after each answer).", "info")
        self.refresh_chrome()
        return path

    def _session_meta(self) -> dict:
        info = self.engine_info
        return {
            "model": info.model_name if info else self.spec.model,
            "draft_head": info.head_name if info else self.spec.draft_head,
            "extra": {"settings": dataclasses.asdict(self.generation_params())},
        }

    def _autosave(self) -> None:
        if not self.session_name or self.session_data is None:
            return
        try:
            self.store.save(self.session_name, self.session_data, **self._session_meta())
        except SessionStoreError as err:
            self.add_note(f"Autosave failed: {err}", "error")

    def action_open_session(self) -> None:
        def done(name: str | None) -> None:
            if name:
                self.open_session(name)

        self.push_screen(OpenSessionScreen(self.store.list()), done)

    def open_session(self, name: str) -> bool:
        try:
            data = self.store.load(name)
        except SessionStoreError as err:
            self.add_note(f"Could not open the session: {err}", "error")
            return False
        self.action_stop()
        self._restore(data, data.get("name") or name)
        return True

    def _open_requested_session(self, name: str) -> None:
        if self.store.exists(name):
            self.open_session(name)
        else:
            try:
                self.session_name = self.store.path_for(name).stem
            except SessionStoreError as err:
                self.add_note(f"--session: {err}", "error")
                return
            self.add_note(f"New session {self.session_name!r}: it is saved after each answer.", "info")

    def _restore(self, data: dict, name: str) -> None:
        session = data["session"]
        self.worker.submit(ew.RestoreSessionCommand(session, name))
        self._reset_chat_view()
        self.session_name = name
        self.session_data = session
        messages = [m for m in session.get("messages", []) if isinstance(m, dict)]
        self.session_messages = tuple(messages)
        thinking = bool(session.get("thinking", False))
        chat = self._q("#chat", ChatLog)
        widgets = []
        for m in messages:
            role, content = m.get("role"), str(m.get("content", ""))
            if role == "user":
                widgets.append(UserMessage(content))
            elif role == "assistant":
                widgets.append(AssistantMessage("jetspec", content, thinking_enabled=thinking, streaming=False))
            elif role == "system":
                widgets.append(NoteMessage(f"System prompt: {content}", "info"))
        n = sum(1 for m in messages if m.get("role") in ("user", "assistant"))
        widgets.append(
            NoteMessage(
                f"Opened session {name!r} ({n} messages). The KV cache is rebuilt by prefill on the next turn; "
                "after that, each turn reuses it.",
                "info",
            )
        )
        chat.mount_all(widgets)
        self.call_after_refresh(chat.follow)
        self.refresh_chrome()

    def _keep_original_answer(self, job: Job, item: ew.SessionSnapshot) -> None:
        """Reruns replace the last answer in the session. When the text changed (a run was
        stopped early, or sampling drew another answer), put the original conversation back:
        the chat keeps showing it and the next turn continues from it."""
        before = job.pre_session
        if before is None:
            return
        old = [m for m in before.get("messages", []) if m.get("role") == "assistant"]
        new = [m for m in item.messages if m.get("role") == "assistant"]
        if old and new and old[-1].get("content") == new[-1].get("content"):
            return
        self.worker.submit(ew.RestoreSessionCommand(before))
        self.session_data = before
        self.session_messages = tuple(before.get("messages", []))
        self.add_note(f"Kept the original answer ({self._why_texts_differ(job)}); "
                      "its KV cache is rebuilt on the next turn.", "info")

    def _why_texts_differ(self, job: Job) -> str:
        """Why a rerun's text is not the original's, as a parenthesis for the note above."""
        original = next((t for t in reversed(self.traces) if t is not job.trace and t.kind in ("chat", "rerun")
                         and t.result is not None), None)
        reason = original.result.finish_reason if original is not None else ""
        if reason == "cancelled":
            return "it was stopped with Esc, so the rerun went on past where it was cut short"
        if reason in ("length", "context_full"):
            return "it was cut at the token limit, which the rerun did not hit at the same place"
        if self.settings.temperature > 0 or (original is not None and original.params.sampling.temperature > 0):
            return "sampling at temperature > 0 drew a different text"
        return "the rerun's text differed"

    def action_export(self) -> None:
        directory = exports_dir()
        try:
            directory.mkdir(parents=True, exist_ok=True)
            stamp = time.strftime("%Y%m%d-%H%M%S")
            svg = self.save_screenshot(f"jetspec-{stamp}.svg", str(directory))
            lines: list[str] = []
            for i, trace in enumerate(self.traces):
                lines.extend(trace.to_jsonl_lines(i))
            trace_path = None
            if lines:  # answers reopened from a saved session have no trace: nothing to write
                trace_path = directory / f"jetspec-{stamp}.trace.jsonl"
                atomic_write_text(trace_path, "\n".join(lines) + "\n")
        except OSError as err:
            self.add_note(f"Export failed: {err}", "error")
            return
        self.last_export = (Path(svg), trace_path)
        if trace_path is None:
            self.add_note(f"Saved the screen to {svg}; there is no round trace to write (no answer in this chat was "
                          "generated in this run of the app: saved sessions keep their text, not their rounds).", "info")
            self.notify(f"Saved {svg}\n(no round trace to write)", timeout=6)
            return
        rounds = sum(len(t.rounds) for t in self.traces)
        self.add_note(f"Saved the screen to {svg} and the round trace ({rounds} rounds) to {trace_path}.", "info")
        self.notify(f"Saved {svg}\nand {trace_path}", timeout=6)

"""The conversation as a whole, on disk and on screen: new chat, save, open, autosave after
each answer, and the F12 export (screen SVG + round trace)."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from textual.app import App

from jetspec_chat.settings import SessionStoreError, atomic_write_text, exports_dir, suggest_session_name

from . import engine_worker as ew
from .chat import AssistantMessage, NoteMessage, UserMessage
from .chat_view import ChatView
from .controller import ChatController
from .dialogs import OpenSessionScreen, SaveSessionScreen
from .jobs import Job


class SessionActions:
    """New, save, open and export the chat (the store is `chat.store`)."""

    def __init__(self, app: App, chat: ChatController, view: ChatView) -> None:
        """`app`: for the save/open dialogs, notifications and the screenshot."""
        self.app = app
        self.chat = chat
        self.view = view
        self.last_export: tuple[Path, Path | None] | None = None  # (screenshot, round trace if any)

    def new_chat(self) -> None:
        chat = self.chat
        chat.stop()
        chat.worker.submit(ew.NewSessionCommand(chat.settings.system_prompt, chat.settings.thinking))
        self._reset()
        chat.session_name = None
        chat.session_data = None
        self.view.add_note("New chat (the previous conversation's KV cache was dropped).", "info")
        self.view.refresh_chrome()

    def _reset(self) -> None:
        self.chat.clear_chat()
        self.view.reset_chat()

    def ask_save(self) -> None:
        chat = self.chat
        messages = list(chat.session_messages)
        if not any(m.get("role") == "user" for m in messages):
            self.app.notify("Nothing to save yet: send a message first.", severity="warning")
            return
        suggested = chat.session_name or suggest_session_name(messages)
        existing = {s.name for s in chat.store.list()}

        def done(name: str | None) -> None:
            if name:
                self.save_as(name)

        self.app.push_screen(SaveSessionScreen(suggested, existing), done)

    def save_as(self, name: str) -> Path | None:
        chat = self.chat
        if chat.session_data is None:
            self.app.notify("Nothing to save yet.", severity="warning")
            return None
        try:
            path = chat.store.save(name, chat.session_data, **self._meta())
        except SessionStoreError as err:
            self.view.add_note(f"Could not save the session: {err}", "error")
            return None
        chat.session_name = path.stem
        self.view.add_note(f"Saved session {path.stem!r} to {path} (saved again after each answer).", "info")
        self.view.refresh_chrome()
        return path

    def _meta(self) -> dict:
        chat = self.chat
        info = chat.engine_info
        return {
            "model": info.model_name if info else chat.engine_setup.model,
            "draft_head": info.head_name if info else chat.engine_setup.draft_head,
            "extra": {"settings": dataclasses.asdict(chat.generation_params())},
        }

    def autosave(self) -> None:
        chat = self.chat
        if not chat.session_name or chat.session_data is None:
            return
        try:
            chat.store.save(chat.session_name, chat.session_data, **self._meta())
        except SessionStoreError as err:
            self.view.add_note(f"Autosave failed: {err}", "error")

    def ask_open(self) -> None:
        def done(name: str | None) -> None:
            if name:
                self.open(name)

        self.app.push_screen(OpenSessionScreen(self.chat.store.list()), done)

    def open(self, name: str) -> bool:
        try:
            data = self.chat.store.load(name)
        except SessionStoreError as err:
            self.view.add_note(f"Could not open the session: {err}", "error")
            return False
        self.chat.stop()
        self._restore(data, data.get("name") or name)
        return True

    def open_requested(self, name: str) -> None:
        """--session NAME: open it, or start a session saved under that name."""
        chat = self.chat
        if chat.store.exists(name):
            self.open(name)
        else:
            try:
                chat.session_name = chat.store.path_for(name).stem
            except SessionStoreError as err:
                self.view.add_note(f"--session: {err}", "error")
                return
            self.view.add_note(f"New session {chat.session_name!r}: it is saved after each answer.", "info")

    def _restore(self, data: dict, name: str) -> None:
        chat = self.chat
        session = data["session"]
        chat.worker.submit(ew.RestoreSessionCommand(session, name))
        self._reset()
        chat.session_name = name
        chat.session_data = session
        messages = [m for m in session.get("messages", []) if isinstance(m, dict)]
        chat.session_messages = tuple(messages)
        thinking = bool(session.get("thinking", False))
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
        chat_log = self.view.chat_log
        chat_log.mount_all(widgets)
        self.app.call_after_refresh(chat_log.follow)
        self.view.refresh_chrome()

    def keep_original_answer(self, job: Job, item: ew.SessionSnapshot) -> None:
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
        self.chat.put_session_back(before)
        self.view.add_note(f"Kept the original answer ({self.why_texts_differ(job)}); "
                           "its KV cache is rebuilt on the next turn.", "info")

    def why_texts_differ(self, job: Job) -> str:
        """Why a rerun's text is not the original's, as a parenthesis for the note above."""
        chat = self.chat
        original = next((t for t in reversed(chat.traces) if t is not job.trace and t.kind in ("chat", "rerun")
                         and t.result is not None), None)
        reason = original.result.finish_reason if original is not None else ""
        if reason == "cancelled":
            return "it was stopped with Esc, so the rerun went on past where it was cut short"
        if reason in ("length", "context_full"):
            return "it was cut at the token limit, which the rerun did not hit at the same place"
        if chat.settings.temperature > 0 or (original is not None and original.params.sampling.temperature > 0):
            return "sampling at temperature > 0 drew a different text"
        return "the rerun's text differed"

    def export(self) -> None:
        view, traces = self.view, self.chat.traces
        directory = exports_dir()
        try:
            directory.mkdir(parents=True, exist_ok=True)
            stamp = time.strftime("%Y%m%d-%H%M%S")
            svg = self.app.save_screenshot(f"jetspec-{stamp}.svg", str(directory))
            lines: list[str] = []
            for i, trace in enumerate(traces):
                lines.extend(trace.to_jsonl_lines(i))
            trace_path = None
            if lines:  # answers reopened from a saved session have no trace: nothing to write
                trace_path = directory / f"jetspec-{stamp}.trace.jsonl"
                atomic_write_text(trace_path, "\n".join(lines) + "\n")
        except OSError as err:
            view.add_note(f"Export failed: {err}", "error")
            return
        self.last_export = (Path(svg), trace_path)
        if trace_path is None:
            view.add_note(f"Saved the screen to {svg}; there is no round trace to write (no answer in this chat was "
                          "generated in this run of the app: saved sessions keep their text, not their rounds).", "info")
            self.app.notify(f"Saved {svg}\n(no round trace to write)", timeout=6)
            return
        rounds = sum(len(t.rounds) for t in traces)
        view.add_note(f"Saved the screen to {svg} and the round trace ({rounds} rounds) to {trace_path}.", "info")
        self.app.notify(f"Saved {svg}\nand {trace_path}", timeout=6)

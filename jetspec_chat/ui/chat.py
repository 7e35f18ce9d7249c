"""The conversation: message widgets, the streaming answer, and the multi-line input."""
from __future__ import annotations

import re
from dataclasses import dataclass

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Collapsible, Markdown, Static, TextArea
from textual.widgets.markdown import MarkdownStream

from .liveness import can_update
from .themes import SpecColors

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_FENCE_RE = re.compile(r"^(?P<fence>`{3,}|~{3,})[^\n]*\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.S | re.M)


# ----------------------------------------------------------------------------- thinking


@dataclass(frozen=True)
class ThinkSplit:
    thinking: str | None  # None: no thinking block (so far)
    answer: str
    thinking_done: bool


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest proper prefix of `tag` that `text` ends with."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def split_thinking(raw: str, *, thinking_enabled: bool = False, final: bool = False) -> ThinkSplit:
    """Separate a Qwen3-style `<think>...</think>` block from the answer.

    While streaming (`final=False`) a trailing partial tag is held back so it never flashes
    into the answer. Templates that open the block in the prompt produce only `</think>`; that
    form is recognised when the session has thinking on.
    """
    s = raw.lstrip()
    if s.startswith(THINK_OPEN):
        body = s[len(THINK_OPEN) :]
        i = body.find(THINK_CLOSE)
        if i < 0:
            hold = 0 if final else _partial_suffix(body, THINK_CLOSE)
            return ThinkSplit(body[: len(body) - hold].strip("\n"), "", final)
        return ThinkSplit(body[:i].strip(), body[i + len(THINK_CLOSE) :].lstrip(), True)
    if not final and s and THINK_OPEN.startswith(s):
        return ThinkSplit(None, "", False)  # might still become "<think>"
    if thinking_enabled:
        i = raw.find(THINK_CLOSE)
        if i >= 0:
            return ThinkSplit(raw[:i].strip(), raw[i + len(THINK_CLOSE) :].lstrip(), True)
        hold = 0 if final else _partial_suffix(raw, THINK_CLOSE)
        return ThinkSplit(None, raw[: len(raw) - hold].lstrip(), False)
    return ThinkSplit(None, raw.lstrip(), False)


def last_code_block(markdown: str) -> str | None:
    blocks = [m.group("body") for m in _FENCE_RE.finditer(markdown)]
    return blocks[-1].rstrip("\n") if blocks else None


# ----------------------------------------------------------------------------- messages


class UserMessage(Vertical):
    def __init__(self, text: str) -> None:
        super().__init__(classes="message user")
        self.text = text

    def compose(self) -> ComposeResult:
        yield Static("You", classes="role")
        yield Static(self.text, markup=False, classes="body")


class NoteMessage(Static):
    """A line from the app itself: errors, session notes, KV reuse."""

    def __init__(self, text: str, kind: str = "info") -> None:
        super().__init__(text, markup=False, classes=f"note -{kind}")
        self.kind = kind


class AssistantMessage(Vertical):
    """One answer. Streams Markdown through `Markdown.get_stream`; thinking goes to a
    collapsed block; a second view colors the text by provenance."""

    def __init__(self, label: str = "", text: str = "", *, thinking_enabled: bool = False, streaming: bool = True) -> None:
        super().__init__(classes="message assistant")
        self.label = label
        self.raw = text
        self.thinking_enabled = thinking_enabled
        self.streaming = streaming
        self._written = ""  # answer text already handed to the Markdown widget
        self._stream: MarkdownStream | None = None
        self._think_shown = ""
        self.segments: list[tuple[str, str]] | None = None  # provenance, when known
        self.trace = None  # the AnswerTrace this message streams from, when generated in this run
        split = split_thinking(text, thinking_enabled=thinking_enabled, final=not streaming)
        self._initial = split

    def compose(self) -> ComposeResult:
        yield Static(self.label or "jetspec", classes="role")
        with Collapsible(title="Thinking", collapsed=True, classes="thinking"):
            yield Static("", classes="thinking-body", markup=False)
        yield Markdown(self._initial.answer if not self.streaming else "", classes="answer")
        yield Static("", classes="provenance")
        yield Static("", classes="meta")

    def on_mount(self) -> None:
        self._written = self._initial.answer if not self.streaming else ""
        self._show_thinking(self._initial)

    @property
    def answer_text(self) -> str:
        return split_thinking(self.raw, thinking_enabled=self.thinking_enabled, final=True).answer

    def _show_thinking(self, split: ThinkSplit) -> None:
        box = self.query_one(Collapsible)
        if split.thinking is None:
            box.display = False
            return
        box.display = True
        words = len(split.thinking.split())
        box.title = f"Thought ({words} words)" if split.thinking_done else f"Thinking… ({words} words)"
        if split.thinking != self._think_shown:
            self._think_shown = split.thinking
            box.query_one(".thinking-body", Static).update(split.thinking)

    async def append(self, text: str) -> None:
        """Add streamed text (called from the UI's drain timer, batched)."""
        self.raw += text
        await self._sync(final=False)

    async def set_text(self, text: str) -> None:
        """Replace the whole answer (e.g. after a comparison rerun replaced it)."""
        self.raw = text
        await self._sync(final=not self.streaming)

    async def finish(self) -> None:
        self.streaming = False
        await self._sync(final=True)
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None

    async def _sync(self, final: bool) -> None:
        if not can_update(self):  # removed (new chat, reopened session): `raw` still has the text
            return
        split = split_thinking(self.raw, thinking_enabled=self.thinking_enabled, final=final)
        self._show_thinking(split)
        md = self.query_one(".answer", Markdown)
        if split.answer.startswith(self._written):
            delta = split.answer[len(self._written) :]
            if delta:
                if self._stream is None:
                    self._stream = Markdown.get_stream(md)
                await self._stream.write(delta)
                self._written = split.answer
        else:  # the split moved (a late </think>): re-render from scratch
            if self._stream is not None:
                await self._stream.stop()
                self._stream = None
            await md.update(split.answer)
            self._written = split.answer

    def set_label(self, label: str) -> None:
        """The role line: 'jetspec · budget 64 · …' (live tree changes append to it)."""
        self.label = label
        if can_update(self):
            self.query_one(".role", Static).update(label or "jetspec")

    def set_meta(self, text: str | Text, kind: str = "") -> None:
        if not can_update(self):
            return
        meta = self.query_one(".meta", Static)
        meta.update(text)
        meta.set_class(kind == "error", "-error")
        meta.set_class(kind == "warning", "-warning")

    def show_provenance(self, segments: list[tuple[str, str]] | None, colors: SpecColors) -> None:
        if not can_update(self):
            return
        view = self.query_one(".provenance", Static)
        if segments is None:
            t = Text(self.raw)
            t.append("\n(provenance is known only for answers generated in this run)", style=f"italic {colors.muted}")
            view.update(t)
            return
        t = Text()
        for text, kind in segments:
            t.append(text, style=colors.draft_text if kind == "draft" else f"bold {colors.target_text}")
        view.update(t)


class ChatLog(VerticalScroll):
    """The conversation. Anchored to the bottom; scrolling up releases the anchor until the
    user scrolls back down (Textual's anchor semantics)."""

    def on_mount(self) -> None:
        self.anchor()

    def follow(self) -> None:
        self.anchor()
        self.scroll_end(animate=False, immediate=True)


# ----------------------------------------------------------------------------- input


class ChatInput(TextArea):
    """Multi-line input: Enter sends, shift+enter / ctrl+j / alt+enter insert a newline,
    up/down on the first/last line walk the input history."""

    NEWLINE_KEYS = ("shift+enter", "ctrl+j", "alt+enter", "ctrl+enter")

    @dataclass
    class Submitted(Message):
        input: "ChatInput"
        text: str

        @property
        def control(self) -> "ChatInput":
            return self.input

    def __init__(self, input_history: list[str] | None = None, **kwargs) -> None:
        kwargs.setdefault("soft_wrap", True)
        kwargs.setdefault("show_line_numbers", False)
        kwargs.setdefault("tab_behavior", "focus")
        super().__init__(**kwargs)
        self.input_history: list[str] = list(input_history or [])
        self._history_index: int | None = None  # None: editing a fresh draft
        self._draft = ""

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self, self.text))
            return
        if event.key in self.NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)

    def remember(self, text: str) -> None:
        if text.strip() and (not self.input_history or self.input_history[-1] != text):
            self.input_history.append(text)
        self._history_index = None
        self._draft = ""

    def action_cursor_up(self, select: bool = False) -> None:
        if not select and self.cursor_location[0] == 0 and self.input_history:
            self.history_previous()
            return
        super().action_cursor_up(select)

    def action_cursor_down(self, select: bool = False) -> None:
        if not select and self.cursor_location[0] >= self.document.line_count - 1 and self._history_index is not None:
            self.history_next()
            return
        super().action_cursor_down(select)

    def history_previous(self) -> None:
        if not self.input_history:
            return
        if self._history_index is None:
            self._draft = self.text
            self._history_index = len(self.input_history) - 1
        elif self._history_index > 0:
            self._history_index -= 1
        self._load(self.input_history[self._history_index])

    def history_next(self) -> None:
        if self._history_index is None:
            return
        if self._history_index < len(self.input_history) - 1:
            self._history_index += 1
            self._load(self.input_history[self._history_index])
        else:
            self._history_index = None
            self._load(self._draft)

    def _load(self, text: str) -> None:
        self.text = text
        self.move_cursor(self.document.end)

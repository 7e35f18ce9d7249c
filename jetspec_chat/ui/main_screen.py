"""The main screen's layout: top bar, loading panel, chat, input, status line, tree and stats.

What it shows is drawn by `ChatView` (chat_view.py); the screen only composes the widgets.
"""
from __future__ import annotations

import time
from typing import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, ProgressBar, Static

from .chat import ChatInput, ChatLog
from .liveness import can_update
from .stats import StatsPanel
from .tree_view import TreePanel


def context_label(used: int, limit: int) -> str:
    """The status bar's context counter; the engine's count can run one past the window when
    it fills (the token that did not fit), so it is clamped and says full."""
    if used >= limit:
        return f"context full ({limit:,} / {limit:,} tokens)"
    return f"context {used:,} / {limit:,} tokens"


class LoadingPanel(Vertical):
    """The loading phase now under way, with the seconds it has taken so far (phases without a
    fraction, like reading a tokenizer, would otherwise look stalled) and a bar when there is one."""

    _title = ""
    _message = ""
    _started = 0.0
    _fraction: float | None = None

    def compose(self) -> ComposeResult:
        yield Static("Starting…", id="loading-label")
        yield ProgressBar(total=None, show_eta=False, id="loading-bar")

    def on_mount(self) -> None:
        self.set_interval(1.0, self._draw_label)
        self._draw()

    def set_progress(self, title: str, message: str, fraction: float | None) -> None:
        """Safe before compose: the latest progress is kept and drawn once the panel is mounted."""
        if message != self._message:
            self._started = time.monotonic()
        self._title, self._message, self._fraction = title, message, fraction
        if can_update(self):
            self._draw()

    def _draw(self) -> None:
        self._draw_label()
        fraction = self._fraction
        bar = self.query_one(ProgressBar)
        if fraction is None:
            bar.update(total=None)
        else:
            bar.update(total=100, progress=max(0.0, min(100.0, fraction * 100)))

    def _draw_label(self) -> None:
        if not self.display or not self._title or not can_update(self):
            return
        elapsed = f" · {time.monotonic() - self._started:.0f} s"
        self.query_one("#loading-label", Static).update(Text.assemble((self._title, "bold"), "\n",
                                                                      self._message, (elapsed, "dim")))


class MainScreen(Screen):
    def __init__(self, input_history: list[str], when_mounted: Callable[[], None]) -> None:
        """`input_history`: the input box's ↑ history. `when_mounted`: called once the widgets exist."""
        super().__init__(id="main-screen")
        self.input_history = input_history
        self.when_mounted = when_mounted

    def compose(self) -> ComposeResult:
        yield Static("", id="topbar")
        with Horizontal(id="main"):
            with Vertical(id="chat-pane"):
                yield LoadingPanel(id="loading")
                yield ChatLog(id="chat")
                yield ChatInput(
                    input_history=self.input_history,
                    id="input",
                    placeholder="Message (Enter send · shift+Enter/ctrl+J newline · ↑ history · F1 help)",
                )
                yield Static("", id="status")
            with Vertical(id="side-pane"):
                yield TreePanel(id="tree")
                yield StatsPanel(id="stats")
        yield Footer()

    def on_mount(self) -> None:
        self.when_mounted()

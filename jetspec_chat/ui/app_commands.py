"""The app's keys and command palette: key bindings, which actions the main screen alone
takes, theme and help actions, and the palette's commands."""
from __future__ import annotations

from typing import Iterable

from textual import on
from textual.app import SystemCommand
from textual.binding import Binding
from textual.command import CommandList, CommandPalette
from textual.screen import Screen
from textual.widgets import Button, Input

from . import engine_worker as ew
from .dialogs import BUDGET_STEPS, HelpScreen

BINDINGS = [
    Binding("escape", "stop", "Stop", show=True),
    Binding("f1", "help", "Help"),
    Binding("f2", "budget(-1)", "Budget−"),
    Binding("f3", "budget(1)", "Budget+"),
    Binding("f4", "next_algo", "Algo", show=False),
    Binding("f5", "toggle_spec", "Spec on/off"),
    Binding("f6", "compare", "Compare", priority=True),  # priority: TextArea binds f6/f7
    Binding("f7", "tree_pause", "Pause", show=False, priority=True),
    Binding("f8", "tree_step(-1)", "◀ Round", show=False),
    Binding("f9", "tree_step(1)", "Round ▶", show=False),
    Binding("f10", "replay", "Replay", show=False),
    Binding("f12", "export", "Export", show=False),
    Binding("ctrl+b", "spec_settings", "Settings", show=False),
    Binding("ctrl+r", "measure_ar", "Measure AR", show=False),
    Binding("ctrl+n", "new_chat", "New chat"),
    Binding("ctrl+s", "save_session", "Save", show=False),
    Binding("ctrl+o", "open_session", "Open", show=False),
    Binding("ctrl+t", "next_theme", "Theme", show=False),
    Binding("ctrl+l", "copy_answer", "Copy answer", show=False),
    Binding("ctrl+g", "copy_code", "Copy code", show=False),
    Binding("ctrl+backslash", "toggle_provenance", "Provenance", show=False),
    # priority, as the chat input binds ctrl+e (line end); it takes the key only while the
    # engine is stopped (check_action), so the input keeps it otherwise
    Binding("ctrl+e", "restart_engine", "Restart engine", show=False, priority=True),
]

# actions that only make sense on the main screen (disabled under dialogs and the compare screen)
# but for _COMPARE_ACTIONS, which the compare screen takes too
_COMPARE_ACTIONS = {"compare", "help"}
_MAIN_ONLY_ACTIONS = {
    "stop", "help", "budget", "next_algo", "toggle_spec", "compare", "tree_pause", "tree_step", "replay",
    "spec_settings", "measure_ar", "new_chat", "save_session", "open_session", "copy_answer", "copy_code",
    "toggle_provenance", "next_theme", "export", "restart_engine",
}


class Palette(CommandPalette):
    """Textual's command palette, minus three crashes (Textual 8.2) found by the random walk in
    tests/app/test_app_robustness.py: PageUp/PageDown before the list has laid out its lines
    (a small terminal, or no matches yet) raise KeyError in OptionList._move_page; a second
    Enter queued before the first one closed the palette dismisses it again, which pops the
    main screen (ScreenStackError) and would run the command twice; a keystroke queued before
    Esc closed the palette starts a search whose worker finds no CommandList (NoMatches, the
    app exits)."""

    @on(Input.Changed)
    def _input(self, event: Input.Changed) -> None:
        event.prevent_default()  # instead of CommandPalette's own handler, not after it
        event.stop()
        if self.is_current:
            super()._input(event)

    @on(Input.Submitted)
    @on(Button.Pressed)
    def _select_or_command(self, event: Input.Submitted | Button.Pressed | None = None) -> None:
        if event is not None:
            event.prevent_default()  # instead of CommandPalette's own handler, not after it
            event.stop()
        if self.is_current:
            super()._select_or_command()

    def _action_command_list(self, action: str) -> None:
        if action in ("page_up", "page_down"):
            commands = self.query_one(CommandList)
            if not commands._lines:
                return
        super()._action_command_list(action)


class CommandsMixin:
    """Part of `JetspecApp`: key checks, themes, help and the command palette."""

    def action_command_palette(self) -> None:
        if self.use_command_palette and not CommandPalette.is_open(self):
            self.push_screen(Palette(id="--command-palette"))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in _MAIN_ONLY_ACTIONS and self.screen is not self.main_screen:
            if not (action in _COMPARE_ACTIONS and self.screen is self.compare_screen):
                return False
        if action == "stop":
            return True if self.busy else None
        if action == "restart_engine":
            return self.engine_stopped is not None or self.load_state == "failed"
        return True

    def action_next_theme(self) -> None:
        names = self.cycle_themes or self.theme_names()
        i = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(i + 1) % len(names)]
        self.notify(f"theme {self.theme}", timeout=2)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_retry_load(self) -> None:
        if self.load_state != "failed" or not self.load_retryable:
            return
        if self.engine_stopped is not None or not self.worker.alive:
            self.action_restart_engine()
            return
        self.load_state = "loading"
        self.load_progress = None
        self.worker.submit(self._load_command())
        self._show_loading()
        self.refresh_chrome()

    def action_restart_engine(self) -> None:
        """A new engine (process): load the model again and put the conversation back."""
        if self.engine_stopped is None and self.worker.alive and self.load_state != "failed":
            self.notify("The engine is running.", timeout=2)
            return
        self.worker.shutdown(timeout=0.2)
        self.worker = self._new_worker()
        self.worker.start()
        self.engine_stopped = None
        self.engine_info = None
        self.load_state = "loading"
        self.load_progress = None
        self.worker.submit(self._load_command())
        if self.session_data is not None:
            self.worker.submit(ew.RestoreSessionCommand(self.session_data, self.session_name or ""))
        self.add_note("Restarting the engine; the conversation continues where it was.", "info")
        self._show_loading()
        self.refresh_chrome()

    def on_screen_resume(self) -> None:
        self.refresh_chrome()

    # -- command palette

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        c = SystemCommand
        yield c("Compare budgets", "Rerun the last prompt at several budgets and plain AR", self.action_compare)
        yield c("Measure plain AR speed", "Rerun the last prompt without speculation (for the speedup)", self.action_measure_ar)
        yield c("Speculation settings…", "Budget, depth, width, tree algorithm, temperature, …", self.action_spec_settings)
        spec_on = self.settings.speculation
        yield c(
            f"Speculation: turn {'off' if spec_on else 'on'}",
            "Plain autoregressive decoding on the same engine" if spec_on else "Tree speculative decoding",
            self.action_toggle_spec,
        )
        cur = self.settings

        def mark(is_current: bool) -> str:
            return " (current)" if is_current else ""

        for b in BUDGET_STEPS:
            yield c(
                f"Budget: {b}",
                f"Draft tree of at most {b} node{'s' if b > 1 else ''}{mark(b == cur.budget)}",
                lambda b=b: self.set_budget(b),
            )
        max_depth = self.engine_info.max_depth if self.engine_info else None
        yield c("Depth: full", f"Draft as deep as the head's block allows{mark(cur.depth is None)}", lambda: self.set_depth(None))
        for d in range(1, (max_depth or 16)):
            yield c(f"Depth: {d}", f"Draft at most {d} tokens ahead{mark(d == cur.depth)}", lambda d=d: self.set_depth(d))
        for w in (1, 2, 4, 6, 8, 12, 16, 32):
            yield c(f"Width: {w}", f"Top-{w} candidates per depth{mark(w == cur.width)}", lambda w=w: self.set_width(w))
        for a in self.algos:
            yield c(f"Tree algorithm: {a}", f"How the draft tree is built{mark(a == cur.tree_algo)}", lambda a=a: self.set_algo(a))
        for t in (0.0, 0.6, 0.7, 1.0):
            yield c(
                f"Temperature: {t:g}" + (" (greedy)" if t == 0 else ""),
                "Sampling temperature for the next answers",
                lambda t=t: self.set_temperature(t),
            )
        yield c("Pause / follow the live tree", "Stop the tree view on a round, or follow the latest", self.action_tree_pause)
        yield c("Previous round", "Step the tree view back one round", lambda: self.action_tree_step(-1))
        yield c("Next round", "Step the tree view forward one round", lambda: self.action_tree_step(1))
        yield c("Replay the answer", "Show the rounds of the answer one by one", self.action_replay)
        for s in (1, 2, 4, 8, 16):
            yield c(f"Replay speed: {s} rounds/s", "Speed of the round-by-round replay", lambda s=s: self.set_replay_speed(s))
        yield c("Toggle provenance colors", "Color the answer: accepted draft tokens vs target tokens", self.action_toggle_provenance)
        yield c("Toggle tree scores", "Show the cumulative log-probabilities next to tree nodes", self._toggle_scores)
        yield c("Copy the last answer", "To the clipboard", self.action_copy_answer)
        yield c("Copy the last code block", "To the clipboard", self.action_copy_code)
        yield c("New chat", "Start over and drop the KV cache", self.action_new_chat)
        yield c("Save session…", "Save this chat to the data directory", self.action_save_session)
        yield c("Open session…", "Reopen a saved chat", self.action_open_session)
        yield c(
            f"Thinking: turn {'off' if self.settings.thinking else 'on'} (new chats)",
            "Qwen3 thinking mode for the next new chat",
            self._toggle_thinking,
        )
        for name in self.cycle_themes:
            yield c(f"Theme: {name}", "Switch the color theme", lambda n=name: setattr(self, "theme", n))
        yield c("Export screen and round trace", "SVG of the screen and JSONL of every round", self.action_export)
        yield c("Help: keys", "All keys and what the tree shows", self.action_help)
        if self.engine_stopped is not None:
            yield c("Restart the engine", "Start the engine again and continue this conversation", self.action_restart_engine)
        elif self.load_state == "failed" and self.load_retryable:
            yield c("Retry loading the model", "Try to load the model again", self.action_retry_load)

    def _toggle_scores(self) -> None:
        self.settings.show_scores = not self.settings.show_scores
        self.tree_panel.show_scores = self.settings.show_scores
        self.save_settings()

    def _toggle_thinking(self) -> None:
        self.settings.thinking = not self.settings.thinking
        self._changed(f"thinking {'on' if self.settings.thinking else 'off'} for new chats (ctrl+n)", live=False)

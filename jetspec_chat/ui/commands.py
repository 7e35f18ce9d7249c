"""The app's keys: its bindings, which actions the main screen alone takes, and the command
palette (the commands it lists are `JetspecApp.get_system_commands`)."""
from __future__ import annotations

from textual import on
from textual.binding import Binding
from textual.command import CommandList, CommandPalette
from textual.widgets import Button, Input

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
# but for COMPARE_SCREEN_ACTIONS, which the compare screen takes too
COMPARE_SCREEN_ACTIONS = {"compare", "help"}
MAIN_ONLY_ACTIONS = {
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

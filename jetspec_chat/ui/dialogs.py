"""Modal dialogs: speculation settings, save/open session, help."""
from __future__ import annotations

from dataclasses import dataclass, replace

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.reactive import reactive
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Input, Markdown, OptionList, Static
from textual.widgets.option_list import Option

from jetspec_chat.engine.params import MAX_BUDGET, MAX_WIDTH
from jetspec_chat.settings import SessionInfo, Settings

from .liveness import dismiss_if_current

BUDGET_STEPS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
WIDTH_STEPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
TEMPERATURE_STEPS = (0.0, 0.2, 0.4, 0.6, 0.7, 0.8, 1.0, 1.2, 1.5)
MAX_TOKENS_STEPS = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def step_in(ladder: tuple, value, delta: int):
    """The next value on `ladder` above (delta > 0) or below (delta < 0) `value`."""
    if delta > 0:
        bigger = [v for v in ladder if v > value]
        return bigger[0] if bigger else ladder[-1]
    smaller = [v for v in ladder if v < value]
    return smaller[-1] if smaller else ladder[0]


# ----------------------------------------------------------------------------- settings editor


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    numeric: bool = False


ROWS = (
    Row("budget", "budget (tree nodes)", True),
    Row("depth", "depth", True),
    Row("width", "width (top-K per depth)", True),
    Row("tree_algo", "tree algorithm"),
    Row("speculation", "speculation"),
    Row("temperature", "temperature"),
    Row("max_new_tokens", "max new tokens", True),
    Row("thinking", "thinking (new chats)"),
    Row("provenance", "provenance colors"),
)


class SettingsEditor(Widget, can_focus=True):
    """Up/down pick a row, left/right change it, digits type a number, Enter applies."""

    BINDINGS = [
        Binding("up,k", "move(-1)", "Up", show=False),
        Binding("down,j", "move(1)", "Down", show=False),
        Binding("left,h", "change(-1)", "Less"),
        Binding("right,l", "change(1)", "More"),
        Binding("backspace", "backspace", "Erase", show=False),
    ]

    selected: reactive[int] = reactive(0)

    def __init__(self, settings: Settings, algos: tuple[str, ...], max_depth: int | None) -> None:
        super().__init__(id="settings-editor")
        self.values = replace(settings)
        self.algos = algos
        self.max_depth = max_depth
        self.typed = ""
        self.error = ""

    def render(self) -> Text:
        t = Text(no_wrap=True)
        for i, row in enumerate(ROWS):
            sel = i == self.selected
            t.append("▶ " if sel else "  ", style="bold")
            t.append(f"{row.label:<24}", style="bold" if sel else "")
            value = self.typed + "▏" if (sel and self.typed) else self.display(row.key)
            t.append(f"◀ {value} ▶" if sel else f"  {value}", style="reverse bold" if sel else "")
            t.append("\n")
        if self.error:
            t.append(self.error, style="bold red")
        return t

    def display(self, key: str) -> str:
        v = getattr(self.values, key)
        if key == "depth":
            return "full" + (f" ({self.max_depth})" if self.max_depth else "") if v is None else str(v)
        if key in ("speculation", "thinking", "provenance"):
            return "on" if v else "off"
        if key == "temperature":
            return "0 (greedy)" if v <= 0 else f"{v:g}"
        return str(v)

    def action_move(self, delta: int) -> None:
        self.commit_typed()
        self.selected = (self.selected + delta) % len(ROWS)
        self.refresh()

    def action_change(self, delta: int) -> None:
        self.typed = ""
        key = ROWS[self.selected].key
        v = self.values
        if key == "budget":
            v.budget = step_in(BUDGET_STEPS, v.budget, delta)
        elif key == "depth":
            top = self.max_depth or 32
            if v.depth is None:
                v.depth = None if delta > 0 else max(1, top - 1)
            else:
                nd = v.depth + delta
                v.depth = None if nd >= top else max(1, nd)
        elif key == "width":
            v.width = step_in(WIDTH_STEPS, v.width, delta)
        elif key == "tree_algo":
            algos = list(self.algos)
            i = algos.index(v.tree_algo) if v.tree_algo in algos else 0
            v.tree_algo = algos[(i + delta) % len(algos)]
        elif key in ("speculation", "thinking", "provenance"):
            setattr(v, key, not getattr(v, key))
        elif key == "temperature":
            v.temperature = step_in(TEMPERATURE_STEPS, v.temperature, delta)
        elif key == "max_new_tokens":
            v.max_new_tokens = step_in(MAX_TOKENS_STEPS, v.max_new_tokens, delta)
        self.error = ""
        self.refresh()

    def action_backspace(self) -> None:
        self.typed = self.typed[:-1]
        self.refresh()

    def on_key(self, event) -> None:
        if event.character and event.character.isdigit() and ROWS[self.selected].numeric:
            event.stop()
            self.typed = (self.typed + event.character)[:5]
            self.refresh()

    def commit_typed(self) -> bool:
        if not self.typed:
            return True
        key = ROWS[self.selected].key
        n = int(self.typed)
        self.typed = ""
        limits = {"budget": (1, MAX_BUDGET), "depth": (1, self.max_depth or 64), "width": (1, MAX_WIDTH), "max_new_tokens": (1, 1 << 20)}
        lo, hi = limits[key]
        if not lo <= n <= hi:
            self.error = f"{key.replace('_', ' ')} must be between {lo} and {hi}"
            self.refresh()
            return False
        setattr(self.values, key, None if key == "depth" and self.max_depth and n >= self.max_depth else n)
        self.error = ""
        self.refresh()
        return True


class SpecSettingsScreen(ModalScreen[Settings | None]):
    BINDINGS = [
        Binding("escape", "dismiss_none", "Cancel"),
        Binding("enter", "apply", "Apply", priority=True),
    ]

    def __init__(self, settings: Settings, algos: tuple[str, ...], max_depth: int | None) -> None:
        super().__init__()
        self.settings = settings
        self.algos = algos
        self.max_depth = max_depth

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog"):
            yield Static("Speculation settings", classes="dialog-title")
            yield SettingsEditor(self.settings, self.algos, self.max_depth)
            yield Static("System prompt (new chats):", classes="dialog-label")
            yield Input(self.settings.system_prompt or "", placeholder="(none)", id="system-prompt")
            yield Static(
                "↑↓ choose · ←→ change · type digits for a number · Enter apply · Esc cancel",
                classes="dialog-help",
            )

    def on_mount(self) -> None:
        self.query_one(SettingsEditor).focus()

    def action_dismiss_none(self) -> None:
        dismiss_if_current(self, None)

    def action_apply(self) -> None:
        editor = self.query_one(SettingsEditor)
        if not editor.commit_typed():
            return
        values = editor.values
        values.system_prompt = self.query_one("#system-prompt", Input).value.strip() or None
        dismiss_if_current(self, values)


# ----------------------------------------------------------------------------- sessions


class SaveSessionScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "dismiss_none", "Cancel")]

    def __init__(self, suggested: str, existing: set[str]) -> None:
        super().__init__()
        self.suggested = suggested
        self.existing = existing

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static("Save session", classes="dialog-title")
            yield Input(self.suggested, placeholder="session name", id="session-name")
            yield Static("", id="save-note", classes="dialog-help")
            yield Static("Enter save · Esc cancel", classes="dialog-help")

    def on_mount(self) -> None:
        self._note(self.suggested)

    @on(Input.Changed)
    def _changed(self, event: Input.Changed) -> None:
        self._note(event.value)

    def _note(self, name: str) -> None:
        from jetspec_chat.settings import sanitize_session_name

        safe = sanitize_session_name(name)
        note = ""
        if not safe:
            note = "letters, digits, '.', '_' and '-' only"
        elif safe in self.existing:
            note = f"replaces the saved session {safe!r}"
        elif safe != name.strip():
            note = f"saved as {safe!r}"
        self.query_one("#save-note", Static).update(note)

    @on(Input.Submitted)
    def _submit(self, event: Input.Submitted) -> None:
        from jetspec_chat.settings import sanitize_session_name

        if sanitize_session_name(event.value):
            dismiss_if_current(self, event.value.strip())

    def action_dismiss_none(self) -> None:
        dismiss_if_current(self, None)


class OpenSessionScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "dismiss_none", "Cancel")]

    def __init__(self, sessions: list[SessionInfo]) -> None:
        super().__init__()
        self.sessions = sessions

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static("Open session", classes="dialog-title")
            if self.sessions:
                yield OptionList(
                    *[
                        Option(
                            Text.assemble(
                                (s.name, "bold"),
                                f"  {s.title}  ",
                                (f"{s.messages} messages · {s.saved_at.replace('T', ' ')[:16]}", "dim"),
                            ),
                            id=s.name,
                        )
                        for s in self.sessions
                    ],
                    id="session-list",
                )
            else:
                yield Static("No saved sessions yet (ctrl+s saves the current chat).", classes="dialog-help")
            yield Static("Enter open · Esc cancel", classes="dialog-help")

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        dismiss_if_current(self, event.option.id)

    def action_dismiss_none(self) -> None:
        dismiss_if_current(self, None)


# ----------------------------------------------------------------------------- help

HELP = """\
## Keys

| key | action |
|---|---|
| **Enter** | send the message |
| **shift+Enter**, **ctrl+J** | new line in the message |
| **↑ / ↓** | input history (on the first / last line) |
| **Esc** | stop the answer (at the next round boundary) |
| **F2 / F3** | budget ÷2 / ×2 |
| **F4** | next tree algorithm |
| **F5** | speculation on / off (plain AR) |
| **ctrl+B** | speculation settings: budget, depth, width, algorithm, temperature… |
| **F6** | compare budgets on the last prompt |
| **ctrl+R** | measure plain AR speed on the last prompt (for the speedup) |
| **F7** | pause / follow the live tree |
| **F8 / F9** | previous / next round |
| **F10** | replay the answer round by round |
| **Tab** to the tree | ←/→ step, Space pause, R replay, +/− replay speed, Home/End |
| **ctrl+\\\\** | color the answer by provenance (draft vs target tokens) |
| **ctrl+L** | copy the last answer |
| **ctrl+G** | copy the last code block |
| **ctrl+N** | new chat |
| **ctrl+S / ctrl+O** | save / open a session |
| **ctrl+T** | next theme |
| **F12** | save the screen (SVG) and the round trace (JSONL) |
| **ctrl+P** | command palette: every action, budgets, depths, widths, themes |
| **ctrl+Q** | quit |

On the compare screen (**F6**): edit the budget list (`AR, 16, 64, …`), **Enter** or **ctrl+R** runs it,
**Esc** stops a run or closes the screen, **F6** closes it, **F8** races the finished runs, **F1** this help.
The race replays the runs side by side at their measured pace: **r** restart, **space** pause,
**s** slow motion, **c** export an asciinema `.cast`, **p** an SVG still, **Esc** back.

Budget, depth, width, tree algorithm and speculation on/off apply **live**: changed during an
answer, they take effect from its next round (the message's header records the change).
Temperature and length apply from the next answer.

The tree: **◆** the anchor (last token of the answer so far), **✔** accepted draft tokens,
**★** the target's bonus token, **✗** drafted and rejected, **·** below a rejected node.
Numbers are cumulative draft log-probabilities; dimmer means less likely.
"""


def help_text() -> str:
    from jetspec_chat.settings import data_dir, exports_dir, sessions_dir, settings_path, user_themes_dir

    return HELP + f"""
## Files

| what | where |
|---|---|
| settings | `{settings_path()}` |
| your themes (`*.toml`, same keys as the shipped ones) | `{user_themes_dir()}` |
| saved sessions | `{sessions_dir()}` |
| screenshots and round traces (F12) | `{exports_dir()}` |
| error log | `{data_dir() / "error.log"}` |
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss_none", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog", id="help"):
            yield Markdown(help_text())

    def action_dismiss_none(self) -> None:
        dismiss_if_current(self, None)

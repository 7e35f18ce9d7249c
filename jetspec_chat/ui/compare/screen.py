"""Compare budgets: rerun the last prompt at several budgets (and plain AR), side by side.

`CompareRuns` (runs.py) owns the runs; this screen edits the budget list, asks for a run or a
cancel with a message (`RunRequested`, `CancelRequested`, handled by the app), and renders
`CompareState` as a table and a budget-scaling plot (textual-plotext).
"""
from __future__ import annotations

import math
from typing import Callable

from rich.color import Color as RichColor
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Button, DataTable, Footer, Input, ProgressBar, Static
from textual_plotext import PlotextPlot

from .state import AR_LABEL, BudgetListError, CompareRow, CompareState, parse_budget_list
from ..liveness import can_update, dismiss_if_current
from ..race import RaceError, RaceRecording
from ..race_screen import RaceScreen
from ..stats import fmt
from ..themes import SpecColors
from ..trace import result_round_ms

def draw_scaling_plot(plot: PlotextPlot, state: CompareState, colors: SpecColors) -> None:
    """tokens/s (left axis) and τ (right axis) against budget on a log-2 axis, AR's tokens/s as
    a horizontal baseline."""
    plt = plot.plt
    plt.clear_data()
    plt.clear_figure()
    budgets, tps, taus = state.scaling_points()
    ar, _source = state.ar_tps()
    plt.title("tokens/s and τ against budget")
    if not budgets:
        plt.xlabel("results appear as each run finishes")
        plot.refresh()
        return
    xs = [math.log2(b) for b in budgets]
    plt.plot(xs, tps, marker="braille", color=_rgb(colors.bonus), label="tok/s")
    plt.plot(xs, taus, marker="braille", color=_rgb(colors.accepted), label="τ", yside="right")
    if ar:
        plt.hline(ar, color=_rgb(colors.muted))
        plt.text("AR", x=xs[0], y=ar, color=_rgb(colors.muted), alignment="left")
    plt.xticks(xs, [str(b) for b in budgets])
    plt.xlabel("budget (log 2)")
    plot.refresh()


def format_duration(seconds: float) -> str:
    """12 -> '12 s', 200 -> '3 min 20 s', 4000 -> '1 h 07 min'."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _rgb(color: str) -> tuple[int, int, int]:
    triplet = RichColor.parse(color).get_truecolor()
    return (triplet.red, triplet.green, triplet.blue)


class CompareScreen(Screen):
    """Budget comparison. Esc cancels a running comparison, or closes the screen."""

    BINDINGS = [
        Binding("escape", "cancel_or_close", "Cancel / close"),
        Binding("ctrl+r", "run", "Run"),
        Binding("f8", "race", "Race"),
        Binding("f6", "close", "Close", show=False),
    ]

    class RunRequested(Message):
        """Run the comparison of these budget labels."""

        def __init__(self, labels: list[str]) -> None:
            super().__init__()
            self.labels = labels

    class CancelRequested(Message):
        """Cancel the comparison in progress."""

    def __init__(self, state: CompareState, budgets_text: str,
                 estimate_seconds: Callable[[list[str]], float | None]) -> None:
        """`estimate_seconds(labels)`: how long a comparison of `labels` should take (None:
        nothing measured yet), for the hint under the list."""
        super().__init__(id="compare")
        self.state = state
        self.budgets_text = budgets_text
        self.estimate_seconds = estimate_seconds

    def compose(self) -> ComposeResult:
        yield Static("", id="compare-title")
        with Horizontal(id="compare-controls"):
            yield Static("Budgets:", id="compare-budgets-label")
            yield Input(self.budgets_text, id="compare-budgets", placeholder="AR, 16, 32, 64, 128, 256")
            yield Button("Run", id="compare-run", variant="primary")
            yield Button("Close", id="compare-close")
        yield Static("", id="compare-error")
        with Horizontal(id="compare-progress-row"):
            yield ProgressBar(total=max(1, len(self.state.rows)), show_eta=False, id="compare-progress")
            yield Static("", id="compare-status")
        with Horizontal(id="compare-body"):
            yield DataTable(id="compare-table", cursor_type="row", zebra_stripes=True)
            yield PlotextPlot(id="compare-plot")
        yield Footer()

    def on_mount(self) -> None:
        self._fill_table(SpecColors.from_app(self.app))
        self.query_one(Input).focus()
        # not refresh_state() directly: `is_mounted` only turns true once this handler returns
        self.call_after_refresh(self.refresh_state)

    # -- actions

    @on(Input.Submitted, "#compare-budgets")
    @on(Button.Pressed, "#compare-run")
    def action_run(self) -> None:
        if self.state.running:
            return
        text = self.query_one("#compare-budgets", Input).value
        try:
            labels = parse_budget_list(text)
        except BudgetListError as err:
            self.query_one("#compare-error", Static).update(Text(str(err), style="bold red"))
            return
        self.query_one("#compare-error", Static).update("")
        self.post_message(self.RunRequested(labels))

    @on(Button.Pressed, "#compare-close")
    def action_close(self) -> None:
        dismiss_if_current(self)

    def action_cancel_or_close(self) -> None:
        if self.state.running:
            self.post_message(self.CancelRequested())
        else:
            dismiss_if_current(self)

    def action_race(self) -> None:
        """Replay the finished runs side by side at their recorded pace (race_screen.py)."""
        if self.state.running:
            self.query_one("#compare-error", Static).update(Text("wait for the comparison to finish", style="bold red"))
            return
        try:
            recording = RaceRecording.from_runs(((r.label, r.trace) for r in self.state.rows), self.state.prompt)
        except RaceError as err:
            self.query_one("#compare-error", Static).update(Text(str(err), style="bold red"))
            return
        self.query_one("#compare-error", Static).update("")
        self.app.push_screen(RaceScreen(recording))

    def set_state(self, state: CompareState) -> None:
        self.state = state
        self.refresh_state()

    # -- drawing

    def refresh_state(self) -> None:
        if not can_update(self):  # not composed yet, or closed (its children are gone)
            return
        s = self.state
        colors = SpecColors.from_app(self.app)
        title = Text()
        title.append("Compare budgets", style="bold")
        if s.prompt:
            prompt = " ".join(s.prompt.split())
            title.append(f" — rerun of “{prompt[:70]}{'…' if len(prompt) > 70 else ''}”", style=colors.muted)
        self.query_one("#compare-title", Static).update(title)
        self.query_one("#compare-run", Button).disabled = s.running
        bar = self.query_one(ProgressBar)
        bar.update(total=max(1, len(s.rows)), progress=s.progress)
        self.query_one("#compare-status", Static).update(self._status_text(colors))
        self._fill_table(colors)
        draw_scaling_plot(self.query_one("#compare-plot", PlotextPlot), s, colors)

    def _status_text(self, colors: SpecColors) -> Text:
        s = self.state
        t = Text(no_wrap=True, overflow="ellipsis")
        running = next((r for r in s.rows if r.status == "running"), None)
        if running is not None:
            idx = s.rows.index(running) + 1
            t.append(f"run {idx}/{len(s.rows)}: {running.label}", style="bold")
            t.append(f" · round {running.live_rounds} · {running.live_tokens} tokens", style=colors.muted)
            if running.live_tps:
                t.append(f" · {running.live_tps:.0f} tok/s", style=colors.muted)
            t.append("  (Esc cancels)", style=colors.muted)
        elif s.cancelled:
            t.append(f"cancelled after {sum(r.status == 'done' for r in s.rows)} of {len(s.rows)} runs", style="bold")
        elif s.rows and s.done_count == len(s.rows) and any(r.status == "done" for r in s.rows):
            t.append(f"done: {len(s.rows)} runs", style="bold")
            t.append(" · each run regenerated the last answer", style=colors.muted)
        else:
            t.append("Edit the list and press Enter to run (AR = plain autoregressive decoding).", style=colors.muted)
            t.append(self._estimate_text(), style="bold")
        return t

    def _estimate_text(self) -> str:
        """' About 3 min 20 s.' for the list being edited, from the speeds measured so far."""
        try:
            labels = parse_budget_list(self.query_one("#compare-budgets", Input).value)
        except BudgetListError:
            return ""
        seconds = self.estimate_seconds(labels)
        if seconds is None:
            return " No estimate of its time yet (nothing measured on this engine)."
        return f" About {format_duration(seconds)} ({len(labels)} runs, from the speeds measured so far)."

    @on(Input.Changed, "#compare-budgets")
    def _budgets_edited(self) -> None:
        if not self.state.running:
            self.query_one("#compare-status", Static).update(self._status_text(SpecColors.from_app(self.app)))

    def _fill_table(self, colors: SpecColors) -> None:
        table = self.query_one(DataTable)
        # The columns too: their widths only grow, so a transient value (a live count while a
        # run streams) would leave a column wider than what it shows now.
        table.clear(columns=True)
        table.add_column("budget")
        for label in ("tokens/s", "τ", "speedup", "ms/round", "rounds", "tokens", "=AR"):
            table.add_column(Text(label, justify="right"))
        table.add_column("status")
        ar, _source = self.state.ar_tps()
        best = max((r.tps or 0 for r in self.state.rows), default=0)
        for r in self.state.rows:
            speed = "—"
            if r.tps and ar:
                speed = f"{r.tps / ar:.2f}×"
            ms = result_round_ms(r.result) if r.result else None
            status = r.status if not r.error else f"error: {r.error}"
            tps_cell = Text(fmt(r.tps), style=f"bold {colors.bonus}" if r.tps and r.tps == best else "", justify="right")
            rounds = str(r.result.rounds) if r.result else (str(r.live_rounds) if r.status == "running" else "—")
            tokens = str(r.result.new_tokens) if r.result else (str(r.live_tokens) if r.status == "running" else "—")
            table.add_row(
                Text(r.label, style="bold"),
                tps_cell,
                Text(fmt(r.tau, ".2f"), justify="right"),
                Text(speed, justify="right"),
                Text(fmt(ms, ".1f"), justify="right"),
                Text(rounds, justify="right"),
                Text(tokens, justify="right"),
                Text({True: "yes", False: "no", None: "—"}[self.state.same_as_ar(r)], justify="right",
                     style="bold red" if self.state.same_as_ar(r) is False else ""),
                Text(status, style="bold red" if r.error else ("" if r.status == "done" else colors.muted)),
            )

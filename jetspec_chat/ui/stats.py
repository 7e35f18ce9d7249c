"""Live statistics: tokens/s, tau, per-phase round times, speedup over AR, sparklines and an
accept-length histogram. Renders a `trace.Stats`; computes nothing itself."""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Digits, Sparkline, Static

from .liveness import can_update
from .themes import SpecColors
from .trace import Stats

BLOCKS = " ▁▂▃▄▅▆▇█"


def fmt(value: float | None, spec: str = ".1f", none: str = "—") -> str:
    return none if value is None else format(value, spec)


def histogram_text(hist: tuple[tuple[int, int], ...], colors: SpecColors, rows: int = 3, max_cols: int = 16) -> Text:
    """Vertical bars, one column per accept length (tokens per round)."""
    t = Text(no_wrap=True, overflow="crop")
    if not hist:
        t.append("no rounds yet", style=colors.muted)
        return t
    counts = dict(hist)
    top = max(counts)
    lengths = list(range(1, min(top, max_cols) + 1))
    if top > max_cols:  # fold the long tail into the last column
        counts[max_cols] = sum(c for k, c in counts.items() if k >= max_cols)
    peak = max(counts.get(k, 0) for k in lengths) or 1
    for row in range(rows, 0, -1):
        for k in lengths:
            level = counts.get(k, 0) / peak * rows
            fill = max(0.0, min(1.0, level - (row - 1)))
            ch = BLOCKS[int(round(fill * 8))]
            if counts.get(k, 0) and row == 1 and ch == " ":
                ch = BLOCKS[1]
            t.append(ch * 2 + " ", style=colors.accepted)
        t.append("\n")
    for k in lengths:
        label = f"{k}+" if (top > max_cols and k == max_cols) else str(k)
        t.append(f"{label:<3}", style=colors.muted)
    return t


class StatsPanel(Vertical):
    def compose(self) -> ComposeResult:
        with Horizontal(id="stats-top"):
            yield Digits("—", id="stats-digits")
            yield Static("", id="stats-digits-label")
        yield Static("", id="stats-lines")
        with Horizontal(classes="spark-row"):
            yield Static("tok/s", classes="spark-label")
            yield Sparkline([], id="spark-tps", summary_function=max)
        with Horizontal(classes="spark-row"):
            yield Static("τ", classes="spark-label")
            yield Sparkline([], id="spark-tau", summary_function=max)
        yield Static("", id="stats-hist")

    def on_mount(self) -> None:
        self.border_title = "Stats"
        self._stats = Stats()
        self.app.theme_changed_signal.subscribe(self, lambda _t: self.show(self._stats))
        self.show(self._stats)

    def show(self, stats: Stats, *, replay_round: int | None = None) -> None:
        self._stats = stats
        if not can_update(self):
            return
        colors = SpecColors.from_app(self.app)
        live = stats.finish_reason == "" and stats.rounds > 0
        big = stats.tps_current if live or replay_round is not None else stats.tps_answer
        self.query_one("#stats-digits", Digits).update(fmt(big, ".0f", "-"))
        label = Text()
        label.append("tokens/s\n", style="bold")
        if replay_round is not None:
            label.append(f"at round {replay_round + 1}", style=colors.muted)
        elif live:
            label.append("now (last 8 rounds)", style=colors.muted)
        elif stats.rounds:
            label.append("whole answer", style=colors.muted)
        else:
            label.append("waiting for an answer", style=colors.muted)
        self.query_one("#stats-digits-label", Static).update(label)
        self.query_one("#stats-lines", Static).update(self._lines(stats, colors))
        self.query_one("#spark-tps", Sparkline).data = list(stats.tps_series[-200:]) or [0.0]
        self.query_one("#spark-tau", Sparkline).data = list(stats.tau_series[-200:]) or [0.0]
        hist = Text()
        hist.append("accept length (tokens per round)\n", style=colors.muted)
        hist.append_text(histogram_text(stats.histogram, colors))
        self.query_one("#stats-hist", Static).update(hist)

    def _lines(self, s: Stats, colors: SpecColors) -> Text:
        t = Text(no_wrap=True, overflow="ellipsis")
        key = colors.muted
        t.append("answer  ", style=key)
        t.append(f"{fmt(s.tps_answer)} tok/s", style="bold")
        t.append(f"  now {fmt(s.tps_current)}", style=None)
        t.append("\n")
        t.append("speedup ", style=key)
        if not s.spec_enabled and s.rounds:
            t.append("— (this answer is plain AR)", style=key)
        elif s.speedup is not None and s.baseline is not None:
            t.append(f"{s.speedup:.2f}×", style=f"bold {colors.accepted}")
            t.append(f" vs AR {s.baseline.tokens_per_second:.1f} tok/s", style=None)
            t.append(f"\n        AR measured on this prompt: {s.baseline.source}", style=key)
        else:
            t.append("— no AR measurement of this prompt yet (ctrl+r)", style=key)
        t.append("\n")
        t.append("τ       ", style=key)
        t.append(f"mean {fmt(s.tau_mean, '.2f')}", style="bold")
        t.append(f"  last {s.tau_last if s.tau_last is not None else '—'}")
        t.append(f"  rounds {s.rounds}  tokens {s.answer_tokens}")
        t.append("\n")
        m, last = s.ms_mean, s.ms_last
        t.append("ms/round", style=key)
        if s.rounds:
            t.append(f" draft {m.draft:.1f} · verify {m.verify:.1f} · host {m.host:.1f} = {m.total:.1f}")
            t.append(f"\n  last  draft {last.draft:.1f} · verify {last.verify:.1f} · host {last.host:.1f}", style=key)
        else:
            t.append(" —", style=key)
        if s.prefill_new is not None:
            t.append("\n")
            t.append("prefill ", style=key)
            t.append(f"{s.prefill_new:,} new", style=None)
            if s.prefill_reused:
                t.append(f", {s.prefill_reused:,} reused (KV cache)", style=colors.accepted)
            t.append(f" · {fmt(s.prefill_ms, '.0f')} ms", style=key)
        return t

"""The draft-tree view: one round's tree, root to leaves, one indent step per depth.

`render_tree` is a pure function (RoundEvent -> rich Text) so it can be tested on its own;
`TreePanel` is the widget that shows the live round, or lets the user pause, step through and
replay the rounds of an answer.

Large trees stay legible: the accepted path is always shown, then nodes in best-first order
(the engine's order) while they fit; the rest of each node's children collapse into one
"+N more" line.
"""
from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.timer import Timer
from textual.widgets import Static

from jetspec_chat.engine.events import RoundEvent

from .liveness import can_update
from .themes import SpecColors
from .trace import AnswerTrace, split_provenance

MINUS = "\u2212"
VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍", "\u00a0": "⍽"}


def visible_token(text: str, max_len: int = 18) -> str:
    """A token as readable text: whitespace made visible, control characters escaped."""
    if text == "":
        return "∅"
    out = []
    for ch in text:
        if ch in VISIBLE:
            out.append(VISIBLE[ch])
        elif ord(ch) < 32 or 0x7F <= ord(ch) < 0xA0:
            out.append(f"\\x{ord(ch):02x}")
        elif ch == "\ufffd":
            out.append("�")
        else:
            out.append(ch)
    s = "".join(out)
    if len(s) > max_len:
        s = s[: max_len - 1] + "…"
    return s


def format_score(score: float) -> str:
    return f"{MINUS}{abs(score):.2f}" if score < 0 else f"{score:.2f}"


@dataclass(frozen=True)
class TreeLayout:
    """Which nodes are shown, and how many are folded under each shown node."""

    visible: frozenset[int]
    hidden_under: dict[int, int]  # node -> number of hidden nodes in its hidden child subtrees
    children: tuple[tuple[int, ...], ...]


def layout_tree(ev: RoundEvent, max_lines: int) -> TreeLayout:
    """Pick the nodes to show in `max_lines` lines (root and bonus included).

    The accepted path is always shown; then nodes in the engine's best-first order, as long
    as their parent is shown, until the lines run out. Hidden children are counted on their
    parent's line ("+N more"), so every shown node costs exactly one line.
    """
    n = len(ev.tree_texts)
    parents = ev.tree_parents
    children: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        p = parents[i]
        if 0 <= p < n:
            children[p].append(i)
    subtree = [1] * n
    for i in range(n - 1, 0, -1):  # parents come before children
        p = parents[i]
        if 0 <= p < n:
            subtree[p] += subtree[i]
    visible = {0} | {i for i in ev.accepted_nodes if 0 <= i < n}
    for i in list(visible):  # close under parents, in case the event is odd
        while i > 0 and 0 <= parents[i] < n and parents[i] not in visible:
            i = parents[i]
            visible.add(i)
    room = max_lines - len(visible) - 1  # -1: the bonus line
    for i in range(1, n):
        if room <= 0:
            break
        if i not in visible and parents[i] in visible:
            visible.add(i)
            room -= 1
    hidden_under = {}
    for v in visible:
        hidden = sum(subtree[c] for c in children[v] if c not in visible)
        if hidden:
            hidden_under[v] = hidden
    return TreeLayout(frozenset(visible), hidden_under, tuple(tuple(c) for c in children))


def bonus_text(ev: RoundEvent, stop_token: int | None = None) -> str | None:
    """The bonus token's text, or None when the round's last token was not appended (the length
    limit, or a stop token among the drafts) or was `stop_token`, the one that ended the answer
    (the engine appends it to `new_tokens` but it has no text)."""
    if len(ev.new_tokens) < len(ev.accepted_nodes):
        return None
    if stop_token is not None and ev.new_tokens and ev.new_tokens[-1] == stop_token:
        return None
    return split_provenance(ev)[1]


def render_tree(
    ev: RoundEvent,
    colors: SpecColors,
    *,
    width: int = 60,
    max_lines: int = 40,
    show_scores: bool = True,
    end_label: str = "end of answer",
    stop_token: int | None = None,
) -> Text:
    """The tree of one round. `end_label` names why nothing follows when the round's last
    token was not appended (the length limit) or was `stop_token` (see `bonus_text`)."""
    n = len(ev.tree_texts)
    if n == 0:
        return Text("(empty tree)", style=colors.muted)
    layout = layout_tree(ev, max(4, max_lines))
    accepted = set(ev.accepted_nodes)
    deepest = ev.accepted_nodes[-1] if ev.accepted_nodes else 0
    max_depth = max((ev.tree_depths[i] for i in layout.visible), default=0) + 1
    unit = 2 if max_depth * 2 + 24 <= width else 1
    bold = " bold" if colors.tree_bold else ""
    show_scores = show_scores and width >= 34
    guide_style = colors.muted

    out = Text(no_wrap=True, overflow="ellipsis", end="")
    lines: list[Text] = []

    def score_suffix(line: Text, score: float, style: str) -> None:
        if not show_scores:
            return
        label = format_score(score)
        pad = width - line.cell_len - len(label) - 1
        line.append(" " * max(1, pad))
        line.append(label, style=style)

    root = Text(no_wrap=True)
    root.append("◆ ", style=f"bold {colors.root}")
    root.append(visible_token(ev.tree_texts[0], 24), style=f"bold {colors.root}")
    root.append("  anchor", style=f"italic {colors.muted}")
    b_text = bonus_text(ev, stop_token)

    def more(line: Text, node: int) -> None:
        hidden = layout.hidden_under.get(node, 0)
        if hidden:
            line.append(f"  +{hidden} more" if width >= 30 else f" +{hidden}", style=f"italic {colors.muted}")

    def walk(node: int, prefix: str) -> None:
        kids = [c for c in layout.children[node] if c in layout.visible]
        entries: list[tuple[str, int]] = [("node", c) for c in kids]
        if node == deepest:
            entries.insert(0, ("bonus", -1))
        for k, (kind, c) in enumerate(entries):
            last = k == len(entries) - 1
            conn = ("└─" if last else "├─") if unit == 2 else ("└" if last else "├")
            cont = ("  " if last else "│ ") if unit == 2 else (" " if last else "│")
            line = Text(no_wrap=True)
            line.append(prefix + conn, style=guide_style)
            if kind == "bonus":
                style = f"bold {colors.bonus}"
                line.append("★ ", style=style)
                if b_text is None:
                    line.append(f"■ {end_label}", style=style)
                else:
                    line.append(visible_token(b_text, 24), style=f"{style} reverse")
                line.append("  bonus", style=f"italic {colors.bonus}")
                lines.append(line)
                continue
            score = ev.tree_scores[c] if c < len(ev.tree_scores) else 0.0
            if c in accepted:
                style = f"bold {colors.accepted}"
                marker = "✔ "
            else:
                strength = max(0.0, min(1.0, 1.0 + score / 8.0))
                style = colors.shade(colors.rejected, strength) + bold
                marker = "✗ " if ev.tree_parents[c] in accepted else "· "
            line.append(marker, style=style)
            line.append(visible_token(ev.tree_texts[c]), style=style)
            more(line, c)
            score_suffix(line, score, style if c in accepted else colors.shade(colors.rejected, 0.6))
            lines.append(line)
            walk(c, prefix + cont)

    more(root, 0)
    lines.append(root)
    walk(0, "")
    for i, line in enumerate(lines):
        if i:
            out.append("\n")
        line.truncate(max(1, width), overflow="ellipsis")
        out.append_text(line)
    return out


def context_text(trace: AnswerTrace, position: int, colors: SpecColors, width: int) -> Text:
    """The answer around round `position`: earlier text dimmed, this round's tokens colored."""
    ev = trace.rounds[position]
    start = trace.round_offsets[position] if position < len(trace.round_offsets) else 0
    drafted, bonus = split_provenance(ev)
    budget = max(8, width * 2 - len(drafted) - len(bonus) - 4)
    before = trace.text[max(0, start - budget) : start]
    before = before.replace("\n", "↵ ")
    t = Text(no_wrap=False, overflow="fold")
    if start > len(before):
        t.append("…", style=colors.muted)
    t.append(before, style=colors.muted)
    if drafted:
        t.append(drafted.replace("\n", "↵\n"), style=f"bold underline {colors.accepted}")
    if bonus:
        t.append(bonus.replace("\n", "↵\n"), style=f"bold reverse {colors.bonus}")
    return t


class TreePanel(Vertical, can_focus=True):
    """Shows the latest round live; pause, step and replay through an answer's rounds."""

    BINDINGS = [
        Binding("left,h", "step(-1)", "Prev round", show=False),
        Binding("right,l", "step(1)", "Next round", show=False),
        Binding("home", "first", "First round", show=False),
        Binding("end", "live", "Live", show=False),
        Binding("space", "toggle_pause", "Pause/live", show=False),
        Binding("r", "replay", "Replay", show=False),
        Binding("plus,equals_sign", "speed(2)", "Faster", show=False),
        Binding("minus", "speed(0.5)", "Slower", show=False),
    ]

    class PositionChanged(Message):
        """The round shown changed (None = following the live round)."""

        def __init__(self, trace: AnswerTrace | None, position: int | None) -> None:
            super().__init__()
            self.trace = trace
            self.position = position

    mode: reactive[str] = reactive("live")  # "live" | "paused" | "replay"
    replay_speed: reactive[float] = reactive(4.0)
    show_scores: reactive[bool] = reactive(True)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.trace: AnswerTrace | None = None
        self.position: int | None = None  # None: the latest round
        self._replay_timer: Timer | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="tree-context")
        with VerticalScroll(id="tree-scroll"):
            yield Static("", id="tree-body")
        yield Static("", id="tree-legend")

    def on_mount(self) -> None:
        self.border_title = "Draft tree"
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.redraw())
        self.redraw()

    def on_resize(self) -> None:
        self.redraw()

    # -- model

    def show_trace(self, trace: AnswerTrace | None) -> None:
        """A new answer started (or another one is selected): follow it live."""
        self.stop_replay()
        self.trace = trace
        self.position = None
        self.mode = "live"
        self.redraw()
        self._announce()

    def rounds_updated(self) -> None:
        """New rounds arrived for the current trace."""
        if self.position is None:
            self.redraw()
        else:
            self._update_title()

    @property
    def shown_index(self) -> int | None:
        if self.trace is None or not self.trace.rounds:
            return None
        if self.position is None:
            return len(self.trace.rounds) - 1
        return max(0, min(self.position, len(self.trace.rounds) - 1))

    # -- actions

    def action_step(self, delta: int) -> None:
        idx = self.shown_index
        if idx is None or self.trace is None:
            return
        self.stop_replay()
        new = max(0, min(len(self.trace.rounds) - 1, idx + delta))
        self.position = new
        self.mode = "paused"
        self.redraw()
        self._announce()

    def action_first(self) -> None:
        if self.shown_index is None:
            return
        self.stop_replay()
        self.position = 0
        self.mode = "paused"
        self.redraw()
        self._announce()

    def action_live(self) -> None:
        self.stop_replay()
        self.position = None
        self.mode = "live"
        self.redraw()
        self._announce()

    def action_toggle_pause(self) -> None:
        if self.mode == "live":
            if self.shown_index is None:
                return
            self.position = self.shown_index
            self.mode = "paused"
            self.redraw()
            self._announce()
        else:
            self.action_live()

    def action_replay(self) -> None:
        if self.trace is None or not self.trace.rounds:
            return
        self.stop_replay()
        self.position = 0
        self.mode = "replay"
        self._replay_timer = self.set_interval(1.0 / max(0.25, self.replay_speed), self._replay_tick)
        self.redraw()
        self._announce()

    def action_speed(self, factor: float) -> None:
        self.replay_speed = max(0.5, min(64.0, self.replay_speed * factor))
        if self.mode == "replay" and self._replay_timer is not None:
            self._replay_timer.stop()
            self._replay_timer = self.set_interval(1.0 / self.replay_speed, self._replay_tick)
        self._update_title()

    def stop_replay(self) -> None:
        if self._replay_timer is not None:
            self._replay_timer.stop()
            self._replay_timer = None
        if self.mode == "replay":
            self.mode = "paused"

    def _replay_tick(self) -> None:
        if self.trace is None or self.position is None:
            self.stop_replay()
            return
        if self.position >= len(self.trace.rounds) - 1:
            self.stop_replay()
            self._update_title()
            return
        self.position += 1
        self.redraw()
        self._announce()

    def _announce(self) -> None:
        self.post_message(self.PositionChanged(self.trace, None if self.mode == "live" else self.shown_index))

    def watch_show_scores(self) -> None:
        self.redraw()

    # -- drawing

    def _update_title(self) -> None:
        idx = self.shown_index
        if idx is None or self.trace is None:
            self.border_title = "Draft tree"
            self.border_subtitle = ""
            return
        total = len(self.trace.rounds)
        state = {
            "live": "live" if not self.trace.finished else "last round",
            "paused": "paused",
            "replay": f"replay {self.replay_speed:g} rounds/s",
        }[self.mode]
        self.border_title = f"Draft tree · round {idx + 1}/{total} · {state}"
        ev = self.trace.rounds[idx]
        depth = max(ev.tree_depths) if ev.tree_depths else 0
        acc = len(ev.accepted_nodes) - 1
        n = len(ev.tree_texts)
        self.border_subtitle = f"{n} node{'s' if n != 1 else ''} · depth {depth} · accepted {acc} + bonus"

    def redraw(self) -> None:
        if not can_update(self):
            return
        try:
            body = self.query_one("#tree-body", Static)
            context = self.query_one("#tree-context", Static)
            legend = self.query_one("#tree-legend", Static)
        except Exception:  # noqa: BLE001 - not composed yet
            return
        colors = SpecColors.from_app(self.app)
        self._update_title()
        width = max(10, self.content_region.width - 1)
        scroll = self.query_one("#tree-scroll")
        height = scroll.content_region.height if scroll.content_region.height > 0 else self.content_region.height - 5
        height = max(6, height)
        if colors.projector:
            height = max(6, min(height, 24))
        legend.update(self._legend(colors))
        idx = self.shown_index
        if idx is None or self.trace is None:
            context.update("")
            hint = "The draft tree of each decode round appears here while an answer streams."
            body.update(Text(hint, style=colors.muted))
            return
        ev = self.trace.rounds[idx]
        context.update(context_text(self.trace, idx, colors, width))
        end_label = "end of answer"
        result = self.trace.result
        last = result is not None and idx == len(self.trace.rounds) - 1
        if last:
            end_label = {
                "length": "max new tokens reached",
                "context_full": "context window full",
                "cancelled": "stopped",
            }.get(result.finish_reason, end_label)
        body.update(
            render_tree(
                ev,
                colors,
                width=width,
                max_lines=height,
                show_scores=self.show_scores and not colors.projector,
                end_label=end_label,
                stop_token=result.stop_token if last else None,
            )
        )

    @staticmethod
    def _legend(colors: SpecColors) -> Text:
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append("✔ accepted", style=f"bold {colors.accepted}")
        t.append("  ")
        t.append("★ bonus", style=f"bold {colors.bonus}")
        t.append("  ")
        t.append("✗ rejected", style=colors.rejected)
        t.append("  ")
        t.append("· unreached", style=colors.rejected)
        return t

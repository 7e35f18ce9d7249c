"""The race screen: two to four finished compare runs replayed in lanes side by side, each at the
pace it was measured (see race.py for the recording and the replay arithmetic).

Each lane shows its text appearing round by round, its tokens/s and τ so far, a finish marker
with the recorded time, and the tree of its latest round with the accepted path highlighted.
Keys: r restart, space pause, s slow motion (×1 → ×0.25 → ×0.1), c export an asciinema cast,
p save an SVG still, Esc close.
"""
from __future__ import annotations

import time
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from jetspec_chat.settings import atomic_write_text, exports_dir

from .liveness import can_update, dismiss_if_current
from .race import NOTICE, LaneView, RaceRecording, ReplayClock, lane_title, race_cast
from .themes import SpecColors
from .tree_view import render_tree

FRAME_S = 1 / 30  # the replay's redraw interval
TREE_LINES = 12


class RaceScreen(Screen):
    """Replays `recording`'s runs on `clock` (the wall clock, or a test's)."""

    DEFAULT_CSS = """
    #race-title { height: 1; padding: 0 1; background: $panel; }
    #race-notice { height: 1; padding: 0 1; }
    #race-lanes { height: 1fr; padding: 0 1; }
    .race-lane { width: 1fr; height: 1fr; margin: 0 1 0 0; border: round $primary 60%; }
    .race-lane.-finished { border: round $success; }
    .race-head { height: 2; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    .race-text-box { height: 1fr; padding: 0 1; }
    .race-tree { height: 13; max-height: 45%; padding: 0 1; border-top: solid $primary 40%;
                 text-wrap: nowrap; text-overflow: ellipsis; }
    """

    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("r", "restart", "Restart"),
        Binding("space", "pause", "Pause"),
        Binding("s", "slower", "Slow motion"),
        Binding("c", "export_cast", "Export .cast"),
        Binding("p", "export_svg", "SVG still"),
    ]

    def __init__(self, recording: RaceRecording, clock: ReplayClock | None = None) -> None:
        super().__init__(id="race")
        self.recording = recording
        self.clock = clock or ReplayClock()
        self._drawn: list[tuple] = [() for _ in recording.runs]  # what each lane shows now
        self.last_cast: Path | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="race-title")
        yield Static(Text(NOTICE, style="italic"), id="race-notice")
        with Horizontal(id="race-lanes"):
            for i, run in enumerate(self.recording.runs):
                with Vertical(classes="race-lane", id=f"race-lane-{i}") as lane:
                    lane.border_title = lane_title(run)
                    yield Static("", classes="race-head", id=f"race-head-{i}")
                    with VerticalScroll(classes="race-text-box"):
                        yield Static("", classes="race-text", id=f"race-text-{i}")
                    yield Static("", classes="race-tree", id=f"race-tree-{i}")
        yield Footer()

    def on_mount(self) -> None:
        self.clock.restart()
        self.set_interval(FRAME_S, self.tick)
        self.call_after_refresh(self.tick)

    # -- actions

    def action_close(self) -> None:
        dismiss_if_current(self)

    def action_restart(self) -> None:
        self.clock.restart()
        self.tick()

    def action_pause(self) -> None:
        self.clock.toggle_pause()
        self.tick()

    def action_slower(self) -> None:
        self.clock.next_speed()
        self.tick()

    def action_export_cast(self) -> None:
        directory = exports_dir()
        width, height = self.app.size
        path = directory / f"jetspec-race-{time.strftime('%Y%m%d-%H%M%S')}.cast"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, race_cast(self.recording, width=max(40, width), height=max(12, height)))
        except OSError as err:
            self.notify(f"Could not write the cast: {err}", severity="error")
            return
        self.last_cast = path
        self.notify(f"Saved the race to {path}\n(play it with: asciinema play {path.name})", timeout=6)

    def action_export_svg(self) -> None:
        directory = exports_dir()
        try:
            directory.mkdir(parents=True, exist_ok=True)
            svg = self.app.save_screenshot(f"jetspec-race-{time.strftime('%Y%m%d-%H%M%S')}.svg", str(directory))
        except OSError as err:
            self.notify(f"Could not save the still: {err}", severity="error")
            return
        self.notify(f"Saved {svg}", timeout=6)

    # -- drawing

    def lane_views(self) -> list[LaneView]:
        t = self.clock.position()
        return [LaneView(run, t) for run in self.recording.runs]

    def tick(self) -> None:
        if not can_update(self):
            return
        t = self.clock.position()
        colors = SpecColors.from_app(self.app)
        self.query_one("#race-title", Static).update(self._title(t, colors))
        lanes = self.query(".race-lane")
        tree_width = max(20, lanes.first().size.width - 4) if lanes else 40
        for i, run in enumerate(self.recording.runs):
            view = LaneView(run, t)
            key = (view.rounds, view.finished, view.t >= run.prefill_s)
            tps, tau = view.numbers()
            head = Text(no_wrap=True, overflow="ellipsis")
            head.append(tps, style=f"bold {colors.bonus}")
            head.append(f" · {tau}\n", style=f"bold {colors.accepted}")
            head.append(view.status(), style="bold" if view.finished else colors.muted)
            self.query_one(f"#race-head-{i}", Static).update(head)
            if key == self._drawn[i]:
                continue
            self._drawn[i] = key
            self.query_one(f"#race-lane-{i}").set_class(view.finished, "-finished")
            self.query_one(f"#race-text-{i}", Static).update(self._lane_text(view, colors))
            box = self.query_one(f"#race-text-{i}").parent
            if isinstance(box, VerticalScroll):
                box.scroll_end(animate=False)
            current = view.current_round
            tree = (render_tree(current.event, colors, width=tree_width, max_lines=TREE_LINES, show_scores=False)
                    if current is not None else Text("waiting for the first round", style=colors.muted))
            self.query_one(f"#race-tree-{i}", Static).update(tree)

    def _title(self, t: float, colors: SpecColors) -> Text:
        title = Text(no_wrap=True, overflow="ellipsis")
        title.append("Race", style="bold")
        title.append(f"  {min(t, self.recording.duration_s):6.2f} s of {self.recording.duration_s:.2f} s")
        if self.clock.speed != 1.0:
            title.append(f"  slow motion ×{self.clock.speed:g}", style=f"bold {colors.rejected}")
        if self.clock.paused:
            title.append("  paused", style=f"bold {colors.rejected}")
        if self.recording.prompt:
            prompt = " ".join(self.recording.prompt.split())
            title.append(f"  “{prompt[:60]}{'…' if len(prompt) > 60 else ''}”", style=colors.muted)
        return title

    @staticmethod
    def _lane_text(view: LaneView, colors: SpecColors) -> Text:
        """The lane's text, the latest round's part highlighted."""
        text = view.text
        current = view.current_round
        if view.finished or current is None or not current.text or not text.endswith(current.text):
            return Text(text)
        out = Text(text[: len(text) - len(current.text)])
        out.append(current.text, style=f"bold {colors.accepted}")
        return out

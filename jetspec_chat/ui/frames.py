"""How often the app may redraw what the engine reported: at most once per drain tick (~12 a
second), and no more often than the UI process's CPU budget allows.

A frame (new text appended, the latest tree, stats, status) costs the UI process ~25 ms of CPU
on a slow 2-core machine, most of it Textual's layout and rendering. The engine process needs
every core there: each millisecond the UI takes is one its threads wait for (docs/performance.md,
"CPU paths"). So a frame is drawn only when the UI process has used at most
`cpu_share` of one core since the last one, or `max_interval_s` has passed (a one-off cost, like
mounting a new message, must not hold the stream back for seconds); on a fast machine the drain
rate is what binds. Nothing is lost by waiting: the outbox keeps every report, the next frame
shows them all (and replay still has every round).

Nothing here imports Textual: the rule is tested alone.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

UI_CPU_SHARE = 0.05
MAX_FRAME_INTERVAL_S = 0.5


@dataclass
class FrameBudget:
    cpu_share: float = UI_CPU_SHARE
    max_interval_s: float = MAX_FRAME_INTERVAL_S
    wall_clock: Callable[[], float] = time.monotonic
    cpu_clock: Callable[[], float] = time.process_time  # this process, every thread
    _last: tuple[float, float] | None = field(default=None, repr=False)  # (wall, cpu) at the last frame

    def allows(self) -> bool:
        """May a frame be drawn now: has the process used at most `cpu_share` of one core since
        the last frame (its own rendering included), or was the last one `max_interval_s` ago?"""
        if self._last is None:
            return True
        wall, cpu = self._last
        elapsed = self.wall_clock() - wall
        return elapsed >= self.max_interval_s or self.cpu_clock() - cpu <= self.cpu_share * elapsed

    def drew(self) -> None:
        """A frame was drawn now."""
        self._last = (self.wall_clock(), self.cpu_clock())

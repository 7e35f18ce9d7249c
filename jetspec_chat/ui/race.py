"""The race: finished compare runs replayed side by side, each at the pace it was measured.

On one GPU two runs cannot honestly share the device at the same time, so the compare screen
runs them one after another; what a race shows is those real runs, token by token, each round
appearing when the engine reported it (`RoundEvent.elapsed_s`, engine time since the answer
started, prefill included; never the UI's arrival time).

Pure data and arithmetic, no Textual: `RaceRecording` (what was measured), `ReplayClock` (replay
time, with pause and slow motion, on an injectable clock), `LaneView` (one lane at a replay time)
and the asciinema v2 cast export. `race_screen.RaceScreen` draws it.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from jetspec_chat.engine.events import RoundEvent

from .trace import AnswerTrace

MIN_LANES, MAX_LANES = 2, 4
SPEEDS = (1.0, 0.25, 0.1)  # slow motion steps, so a presenter can talk over a round
NOTICE = "Replays of runs measured one after another on this device, each at its recorded pace."


class RaceError(ValueError):
    pass


@dataclass(frozen=True)
class RaceRound:
    at_s: float  # engine time since the run's answer started (prefill included)
    text: str  # text this round committed to the answer
    tokens: int  # tokens it committed (accepted drafts + the bonus)
    event: RoundEvent  # the round's tree and accepted path

    @property
    def accepted_path(self) -> tuple[int, ...]:
        return self.event.accepted_nodes


@dataclass(frozen=True)
class RunTrace:
    """One measured run: when each of its rounds committed what."""

    label: str  # "AR" or the budget
    budget: int | None  # None for plain AR
    prefill_s: float  # the first token is committed here
    first_text: str
    rounds: tuple[RaceRound, ...]
    total_s: float  # the run's recorded time (prefill + decode): its finish
    tokens_per_second: float  # decode throughput, as the compare table shows it
    tau: float  # mean tokens per round
    answer: str  # the final text (authoritative: the engine's result)
    new_tokens: int

    @classmethod
    def from_trace(cls, label: str, trace: AnswerTrace) -> RunTrace:
        if trace.result is None or trace.prefill is None:
            raise RaceError(f"run {label} did not finish")
        result = trace.result
        spec = trace.params.spec
        return cls(
            label=label,
            budget=spec.budget if spec.enabled else None,
            prefill_s=trace.prefill.ms / 1000.0,
            first_text=trace.prefill.first_text,
            rounds=tuple(RaceRound(r.elapsed_s, r.new_text, len(r.new_tokens), r) for r in trace.rounds),
            total_s=result.seconds,
            tokens_per_second=result.tokens_per_second,
            tau=result.mean_accept_length,
            answer=result.text,
            new_tokens=result.new_tokens,
        )

    def rounds_at(self, t: float) -> int:
        """How many rounds have committed by replay time `t`."""
        n = 0
        for r in self.rounds:  # at_s only grows
            if r.at_s > t:
                break
            n += 1
        return n


@dataclass(frozen=True)
class RaceRecording:
    runs: tuple[RunTrace, ...]
    prompt: str = ""

    @property
    def duration_s(self) -> float:
        return max(r.total_s for r in self.runs)

    @classmethod
    def from_runs(cls, runs: Iterable[tuple[str, AnswerTrace | None]], prompt: str = "") -> RaceRecording:
        """The finished runs among `(label, trace)`, the first `MAX_LANES` of them; at least
        `MIN_LANES` must have finished."""
        done = [RunTrace.from_trace(label, t) for label, t in runs
                if t is not None and t.result is not None and t.prefill is not None and t.result.finish_reason != "cancelled"]
        if len(done) < MIN_LANES:
            raise RaceError(f"a race needs at least {MIN_LANES} finished runs; run the comparison first")
        return cls(tuple(done[:MAX_LANES]), prompt)


@dataclass
class ReplayClock:
    """Replay time in seconds of recorded time: runs at `speed` × the wall clock `now`, can pause."""

    now: Callable[[], float] = time.monotonic
    speed: float = 1.0
    paused: bool = False
    _origin_wall: float = field(default=0.0, repr=False)
    _origin_pos: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        self._origin_wall = self.now()

    def position(self) -> float:
        if self.paused:
            return self._origin_pos
        return self._origin_pos + (self.now() - self._origin_wall) * self.speed

    def _rebase(self) -> None:
        self._origin_pos = self.position()
        self._origin_wall = self.now()

    def restart(self) -> None:
        self._origin_pos = 0.0
        self._origin_wall = self.now()

    def seek(self, position: float) -> None:
        self._origin_pos = max(0.0, position)
        self._origin_wall = self.now()

    def toggle_pause(self) -> None:
        self._rebase()
        self.paused = not self.paused

    def set_speed(self, speed: float) -> None:
        self._rebase()
        self.speed = speed

    def next_speed(self) -> float:
        i = SPEEDS.index(self.speed) if self.speed in SPEEDS else -1
        self.set_speed(SPEEDS[(i + 1) % len(SPEEDS)])
        return self.speed


@dataclass(frozen=True)
class LaneView:
    """One lane at replay time `t`: what it shows."""

    run: RunTrace
    t: float

    @property
    def rounds(self) -> int:
        return self.run.rounds_at(self.t) if self.t >= self.run.prefill_s else 0

    @property
    def finished(self) -> bool:
        return self.t >= self.run.total_s

    @property
    def text(self) -> str:
        if self.finished:
            return self.run.answer
        if self.t < self.run.prefill_s:
            return ""
        return self.run.first_text + "".join(r.text for r in self.run.rounds[: self.rounds])

    @property
    def tokens(self) -> int:
        if self.finished:
            return self.run.new_tokens
        if self.t < self.run.prefill_s:
            return 0
        return 1 + sum(r.tokens for r in self.run.rounds[: self.rounds])

    @property
    def current_round(self) -> RaceRound | None:
        n = self.rounds
        return self.run.rounds[n - 1] if n else None

    @property
    def tokens_per_second(self) -> float | None:
        """Decode tokens/s so far (the compare table's figure once finished)."""
        if self.finished:
            return self.run.tokens_per_second
        n = self.rounds
        if not n:
            return None
        decode_s = self.run.rounds[n - 1].at_s - self.run.prefill_s
        produced = sum(r.tokens for r in self.run.rounds[:n])
        return produced / decode_s if decode_s > 0 else None

    @property
    def tau(self) -> float | None:
        if self.finished:
            return self.run.tau
        n = self.rounds
        return sum(r.tokens for r in self.run.rounds[:n]) / n if n else None

    def status(self) -> str:
        if self.finished:
            return f"✔ finished {self.run.total_s:.2f} s"
        if self.t < self.run.prefill_s:
            return f"prefill … {self.t:.2f} s"
        return f"{self.t:.2f} s · round {self.rounds}"

    def numbers(self) -> tuple[str, str]:
        tps, tau = self.tokens_per_second, self.tau
        rate = "—" if not tps else (f"{tps:.0f}" if tps >= 100 else f"{tps:.1f}")
        return f"{rate} tok/s", f"τ {tau:.2f}" if tau else "τ —"


def lane_title(run: RunTrace) -> str:
    return "plain AR" if run.budget is None else f"budget {run.budget}"


# -- asciinema v2 cast export


def wrap_lines(text: str, width: int) -> list[str]:
    """`text` cut into lines of at most `width` characters (newlines kept as line breaks)."""
    out: list[str] = []
    for para in text.split("\n"):
        para = para.replace("\t", "    ")
        if not para:
            out.append("")
            continue
        out.extend(para[i : i + width] for i in range(0, len(para), width))
    return out


LANE_SEPARATOR = " │ "
CAST_HEADER_LINES = 5  # title, notice, blank, lane title, lane numbers + status


def lane_width(width: int, lanes: int) -> int:
    return max(8, (width - len(LANE_SEPARATOR) * (lanes - 1)) // lanes)


def frame_lines(recording: RaceRecording, t: float, width: int, height: int) -> list[str]:
    """The race at replay time `t` as plain text lines, lanes side by side (what the cast plays)."""
    n = len(recording.runs)
    lw = lane_width(width, n)
    views = [LaneView(run, t) for run in recording.runs]
    lines = [f"Race · {t:6.2f} s"[:width], NOTICE[:width], ""]

    def row(cells: list[str]) -> str:
        return LANE_SEPARATOR.join(c[:lw].ljust(lw) for c in cells).rstrip()

    lines.append(row([lane_title(v.run) for v in views]))
    lines.append(row([" · ".join(v.numbers()) + " · " + v.status() for v in views]))
    body = max(1, height - len(lines))
    columns = []
    for v in views:
        wrapped = wrap_lines(v.text, lw)
        columns.append(wrapped[-body:])  # the latest text, as a terminal would scroll
    for i in range(max(len(c) for c in columns)):
        lines.append(row([c[i] if i < len(c) else "" for c in columns]))
    return lines[:height]


def cast_event_times(recording: RaceRecording) -> list[float]:
    """Every moment a lane changes: 0, each prefill, each round, each finish; sorted, unique."""
    times = {0.0}
    for run in recording.runs:
        times.add(run.prefill_s)
        times.update(r.at_s for r in run.rounds)
        times.add(run.total_s)
    return sorted(times)


def race_cast(recording: RaceRecording, width: int = 120, height: int = 36, timestamp: int | None = None) -> str:
    """The race as an asciinema v2 cast: a JSON header line, then one `[t, "o", data]` line per
    moment a lane changes, each redrawing the screen, timed as recorded."""
    header = {
        "version": 2,
        "width": width,
        "height": height,
        "timestamp": int(time.time()) if timestamp is None else timestamp,
        "title": "jetspec-chat race: " + " vs ".join(lane_title(r) for r in recording.runs),
        "env": {"TERM": "xterm-256color"},
    }
    out = [json.dumps(header, ensure_ascii=False)]
    for t in cast_event_times(recording):
        data = "\x1b[H\x1b[2J" + "\r\n".join(frame_lines(recording, t, width, height))
        out.append(json.dumps([round(t, 6), "o", data], ensure_ascii=False))
    return "\n".join(out) + "\n"

"""The race: compare runs on the fake engine replayed side by side at their recorded pace.

The replay runs on an injected clock, stepped one frame at a time: fast and deterministic.
"""
from __future__ import annotations

import json

import pytest
from app_support import async_test, compare_then_race, isolate, make_app, open_compare, send, wait_idle, wait_ready, wait_until

from jetspec_chat.ui.race import (
    CAST_HEADER_LINES,
    LANE_SEPARATOR,
    RaceError,
    RaceRecording,
    ReplayClock,
    lane_title,
    lane_width,
    race_cast,
)
from jetspec_chat.ui.race_screen import FRAME_S, RaceScreen

SIZE = (140, 40)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    isolate(monkeypatch, tmp_path)


class StepClock:
    """A wall clock the test advances by hand."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@async_test
async def test_race_replays_each_run_at_its_recorded_pace():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        race = await compare_then_race(pilot)
        rows = app.chat.compare.rows
        assert [run.label for run in race.recording.runs] == ["AR", "16", "64"]
        now = StepClock()
        race.clock = ReplayClock(now=now)
        finished_at: list[float | None] = [None] * len(rows)
        seen: list[list[str]] = [[] for _ in rows]
        while not all(f is not None for f in finished_at):
            race.tick()
            position = race.clock.position()
            for i, view in enumerate(race.lane_views()):
                if not seen[i] or seen[i][-1] != view.text:
                    seen[i].append(view.text)
                if view.finished and finished_at[i] is None:
                    finished_at[i] = position
                    assert "finished" in str(race.query_one(f"#race-head-{i}").content)
            now.t += FRAME_S
            assert position < 60, "the replay never finished"
        for i, row in enumerate(rows):
            trace = row.trace
            # each lane finishes at its run's recorded time, within a frame
            assert abs(finished_at[i] - row.result.seconds) <= FRAME_S + 1e-9
            # the text grows by the run's own rounds, in their order
            prefixes = [trace.prefill.first_text]
            for r in trace.rounds:
                prefixes.append(prefixes[-1] + r.new_text)
            prefixes.append(row.result.text)
            shown = [s for s in seen[i] if s]
            it = iter(prefixes)
            assert all(any(s == p for p in it) for s in shown), f"lane {row.label} replayed out of order"
            assert shown[-1] == row.result.text
        # the faster runs finish first: the race is the measured numbers
        assert finished_at[2] < finished_at[0]
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.view.compare_screen


@async_test
async def test_race_controls_pause_slow_motion_restart_and_cast_export(tmp_path):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        race = await compare_then_race(pilot, "AR, 64")
        now = StepClock()
        race.clock = ReplayClock(now=now)
        now.t += 0.5
        assert race.clock.position() == pytest.approx(0.5)
        await pilot.press("space")  # pause
        now.t += 1.0
        assert race.clock.position() == pytest.approx(0.5)
        assert "paused" in str(race.query_one("#race-title").content)
        await pilot.press("space")  # resume
        await pilot.press("s")  # ×0.25
        now.t += 1.0
        assert race.clock.position() == pytest.approx(0.75)
        await pilot.press("s")  # ×0.1
        now.t += 1.0
        assert race.clock.position() == pytest.approx(0.85)
        assert "×0.1" in str(race.query_one("#race-title").content)
        await pilot.press("s")  # back to ×1
        await pilot.press("r")
        assert race.clock.position() == 0.0
        await pilot.press("c")
        await pilot.pause()
        assert race.last_cast is not None and race.last_cast.suffix == ".cast"
        header = json.loads(race.last_cast.read_text().splitlines()[0])
        assert header["version"] == 2


@async_test
async def test_cast_reads_back_with_the_runs_answers():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        race = await compare_then_race(pilot)
        rows = app.chat.compare.rows
    width, height = 120, 400  # tall enough that no lane scrolls
    lines = race_cast(race.recording, width=width, height=height, timestamp=1_700_000_000).splitlines()
    header = json.loads(lines[0])
    assert header["version"] == 2 and header["width"] == width and header["height"] == height
    assert header["timestamp"] == 1_700_000_000
    events = [json.loads(line) for line in lines[1:]]
    times = [e[0] for e in events]
    assert all(e[1] == "o" for e in events)
    assert times == sorted(times) and times[0] == 0.0
    assert times[-1] == pytest.approx(max(r.result.seconds for r in rows))
    # the last frame: each lane's column holds its run's answer
    frame = events[-1][2].removeprefix("\x1b[H\x1b[2J").split("\r\n")
    lw = lane_width(width, len(rows))
    for i, row in enumerate(rows):
        start = i * (lw + len(LANE_SEPARATOR))
        assert frame[CAST_HEADER_LINES - 2][start:].startswith(lane_title(race.recording.runs[i]))
        column = "".join(line[start : start + lw] for line in frame[CAST_HEADER_LINES:])
        assert "".join(column.split()) == "".join(row.result.text.split())
        assert "finished" in frame[CAST_HEADER_LINES - 1][start : start + lw]


@async_test
async def test_race_needs_two_finished_runs_and_race_flag_opens_it():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "write python fib")
        screen = await open_compare(pilot)
        await pilot.press("f8")  # nothing has run yet
        await pilot.pause()
        assert app.screen is screen
        assert "at least 2 finished runs" in str(screen.query_one("#compare-error").content)
    with pytest.raises(RaceError):
        RaceRecording.from_runs([("AR", None)])
    app = make_app(race=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "write python fib")
        screen = await open_compare(pilot)
        screen.query_one("#compare-budgets").value = "AR, 64"
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, RaceScreen), what="the race to open by itself")
        assert [r.label for r in app.screen.recording.runs] == ["AR", "64"]


def test_replay_clock_and_race_flag_on_the_command_line():
    import argparse

    from jetspec_chat.ui.launch import add_arguments, app_argv

    now = StepClock()
    clock = ReplayClock(now=now)
    now.t += 2.0
    assert clock.position() == pytest.approx(2.0)
    assert clock.next_speed() == 0.25 and clock.next_speed() == 0.1 and clock.next_speed() == 1.0
    clock.seek(-1.0)
    assert clock.position() == 0.0
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--demo", "--race"])
    assert args.race and "--race" in app_argv(args)

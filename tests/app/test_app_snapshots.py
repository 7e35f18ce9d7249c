"""SVG snapshots of the app on the deterministic fake engine (pytest-textual-snapshot).

Regenerate after an intended UI change with `pytest tests/app/test_app_snapshots.py --snapshot-update`
and look at the report. Everything shown is deterministic: the fake engine reports simulated
timings, the cursor does not blink, no toasts are left on screen.
"""
from __future__ import annotations

import pytest
from app_support import (
    compare_then_race,
    freeze,
    isolate,
    make_app,
    send,
    wait_idle,
    wait_ready,
    wait_until,
)

from jetspec_chat.settings import Settings
from jetspec_chat.ui.race import ReplayClock
from jetspec_chat.ui.tree_view import TreePanel

MAIN_SIZE = (140, 44)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    isolate(monkeypatch, tmp_path)


async def _answer_and_pick_round(pilot, round_index: int = 9) -> None:
    await wait_ready(pilot)
    await send(pilot, "write python fib")
    tree = pilot.app.main_screen.query_one(TreePanel)
    tree.position = round_index
    tree.mode = "paused"
    tree.redraw()
    pilot.app.view.tree_position = round_index
    pilot.app.view.update_stats()
    await freeze(pilot)


def test_snapshot_main_screen_with_tree(snap_compare):
    app = make_app(settings=Settings(theme="jetspec-dark"))
    assert snap_compare(app, terminal_size=MAIN_SIZE, run_before=_answer_and_pick_round)


def test_snapshot_projector_theme(snap_compare):
    app = make_app(settings=Settings(theme="jetspec-projector"))
    assert snap_compare(app, terminal_size=MAIN_SIZE, run_before=_answer_and_pick_round)


def test_snapshot_light_theme_live_last_round(snap_compare):
    async def run_before(pilot):
        await wait_ready(pilot)
        await send(pilot, "hello")
        await freeze(pilot)

    app = make_app(settings=Settings(theme="jetspec-light"))
    assert snap_compare(app, terminal_size=(120, 36), run_before=run_before)


def test_snapshot_compare_screen(snap_compare):
    async def run_before(pilot):
        app = pilot.app
        await wait_ready(pilot)
        await send(pilot, "write python fib")
        await pilot.press("f6")
        await pilot.pause()
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.chat.compare is not None and not app.chat.compare.running, what="comparison")
        await wait_idle(pilot)
        app.view.compare_screen.refresh_state()
        app.view.compare_screen.query_one("#compare-table").focus()
        await freeze(pilot)

    app = make_app()
    assert snap_compare(app, terminal_size=(120, 36), run_before=run_before)


@pytest.mark.parametrize("theme", ["jetspec-dark", "jetspec-light", "jetspec-projector"])
def test_snapshot_race_screen(snap_compare, theme):
    """Mid-race on a frozen clock: AR still typing, budget 64 further along, trees per lane."""

    async def run_before(pilot):
        race = await compare_then_race(pilot, "AR, 16, 64")
        race.clock = ReplayClock(now=lambda: 0.0)
        race.clock.seek(0.45 * race.recording.duration_s)
        race.clock.toggle_pause()
        race.tick()
        await wait_idle(pilot)
        await freeze(pilot)

    app = make_app(settings=Settings(theme=theme))
    assert snap_compare(app, terminal_size=(140, 40), run_before=run_before)

"""No update reaches a widget that is not there: the two crashes seen by users, and a seeded
random walk through every screen on the fake engine that fails on any exception."""
from __future__ import annotations

import os
import random

import pytest
from textual import events
from app_support import async_test, isolate, make_app, open_compare, send, wait_idle, wait_ready, wait_until

from jetspec_chat.settings import Settings, error_log_path
from jetspec_chat.ui import engine_worker as ew
from jetspec_chat.ui.app import JetspecApp
from jetspec_chat.ui.main_screen import LoadingPanel
from jetspec_chat.ui.fake_engine import FakeBackend

SIZE = (120, 40)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    isolate(monkeypatch, tmp_path)


def ui_errors() -> str:
    """What the app logged as its own bug (engine errors are logged too, and are fine here)."""
    path = error_log_path()
    if not path.exists():
        return ""
    text = path.read_text()
    return text if "UI error" in text or "unknown engine report" in text else ""


def test_loading_panel_takes_progress_before_it_is_composed():
    panel = LoadingPanel(id="loading")
    panel.set_progress("Loading x", "reading weights", 0.5)  # was: NoMatches('#loading-label')
    assert (panel._title, panel._message, panel._fraction) == ("Loading x", "reading weights", 0.5)


@async_test
async def test_engine_reports_before_the_main_screen_is_composed():
    """The H200 crash: load progress drained before the main screen's widgets existed."""

    class EarlyReport(JetspecApp):
        async def on_mount(self) -> None:
            super().on_mount()
            assert not self.view.ready()
            self.chat.outbox.put(ew.LoadProgress("early progress", 0.5))
            await self.reports.drain()  # was: NoMatches('#loading') / ('#loading-label')

    app = EarlyReport(backend=FakeBackend(load_delay_s=0.2), settings=Settings())
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert app.chat.load_state == "ready"
    assert not ui_errors()


@async_test
async def test_theme_change_after_the_compare_screen_was_closed():
    """The CPU crash (also in --demo): ctrl+t after F6 then Esc."""
    app = make_app(FakeBackend(round_delay_s=0.01))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "write python fib")
        await open_compare(pilot)
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.main_screen
        await pilot.press("ctrl+t")  # was: NoMatches('#compare-title') from CompareScreen.refresh_state
        await pilot.pause()
        app.theme = "jetspec-dark"
        await pilot.pause()
        await open_compare(pilot)  # and the compare screen opens again
        await pilot.press("escape")
    assert not ui_errors()


@async_test
async def test_a_second_close_of_a_closed_screen_pops_nothing():
    """Two Esc presses queued on a screen: the second one used to pop the main screen."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        screen = await open_compare(pilot)
        screen.action_cancel_or_close()
        screen.action_cancel_or_close()  # was: ScreenStackError
        await pilot.press("f1")
        await pilot.pause()
        help_screen = app.screen
        help_screen.action_dismiss_none()
        help_screen.action_dismiss_none()
        await pilot.pause()
        assert app.screen is app.main_screen


@async_test
async def test_new_chat_mid_answer_leaves_the_removed_message_alone():
    """The answer's last reports arrive after ctrl+n removed its message from the chat."""
    app = make_app(FakeBackend(round_delay_s=0.01))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "/long go", wait=False)
        await wait_until(pilot, lambda: len(app.chat.current_trace.rounds) >= 3, what="rounds")
        await pilot.press("ctrl+n")
        await wait_idle(pilot)
        await send(pilot, "hello")
        assert app.chat.current_trace.result.finish_reason == "eos"
    assert not ui_errors(), ui_errors()  # was: NoMatches('Collapsible') on the removed message


# ----------------------------------------------------------------------------- random walk

KEYS = (
    ["f1", "f2", "f3", "f4", "f5", "f6", "f7", "f8", "f9", "f10", "f12", "escape", "escape", "enter", "tab",
     "shift+tab", "up", "down", "left", "right", "home", "end", "space", "backspace", "ctrl+b", "ctrl+n", "ctrl+s",
     "ctrl+o", "ctrl+t", "ctrl+l", "ctrl+g", "ctrl+r", "ctrl+backslash", "ctrl+p", "ctrl+j", "pageup", "pagedown"]
    + list("abr+-1640 ")
)
PROMPTS = ("hello", "write python fib", "/long go on", "/long again", "sort a list", "kv cache?", "/error crash", "/error oom")
# ~35 s on an idle 2-core machine (about 1 ms of work per key plus what the answers draw)
STEPS = int(os.environ.get("JETSPEC_FUZZ_KEYS", "2000"))  # keys pressed in all, besides the commands
SEED = int(os.environ.get("JETSPEC_FUZZ_SEED", "1"))
BATCH = 10


async def press(pilot, key: str) -> None:
    """One key, handled in full: as `Pilot.press` sends it, without its >= 40 ms of idle
    waiting per key (that alone would make a few thousand keys take minutes)."""
    app = pilot.app
    char = " " if key == "space" else (key if len(key) == 1 else None)
    event = events.Key(key, char)
    event.set_sender(app)
    app._driver.send_message(event)
    await pilot._wait_for_screen()


@async_test
async def test_random_walk_through_every_screen_raises_nothing():
    rng = random.Random(SEED)
    app = make_app(FakeBackend(round_delay_s=0.002), settings=Settings(compare_budgets=["AR", "4", "16"]))
    async with app.run_test(size=(80, 24)) as pilot:  # small: rendering is most of the time
        await wait_ready(pilot)
        themes = app.theme_names()
        keys_sent = 0
        visited: set[str] = set()
        esc_mid_answer = 0
        while keys_sent < STEPS:
            # Every draw of a batch is made whatever the app's state, so the keys pressed are the
            # same on a slow machine: only which of them find the app busy differs (drawing only
            # when idle let a loaded CI machine walk another path, and miss two screens).
            roll, long, prompt, pause = rng.random(), rng.random() < 0.5, rng.choice(PROMPTS), rng.uniform(0.0, 0.05)
            theme, size, budget = rng.choice(themes), (rng.choice((50, 80, 100)), rng.choice((12, 24, 30))), rng.choice((1, 4, 16, 64, 256))
            keys = [rng.choice(KEYS) for _ in range(BATCH)]
            if roll < 0.25 and app.screen is app.main_screen and not app.chat.busy:
                if not long:
                    await send(pilot, prompt, wait=False)
                else:  # a long answer, stopped with Esc after a few rounds
                    await send(pilot, "/long " + prompt, wait=False)
                    await pilot.pause(pause)
                    esc_mid_answer += app.chat.chat_job is not None
                    await press(pilot, "escape")
            elif roll < 0.29:
                app.theme = theme
            elif roll < 0.30:
                await pilot.resize_terminal(*size)
            elif roll < 0.35 and app.screen is app.main_screen:
                app.speculation.set_budget(budget)
            for key in keys:
                await press(pilot, key)
                visited.add(type(app.screen).__name__)
            keys_sent += BATCH
            await pilot.pause()  # let timers (drain, toasts, replay) run between batches
        await pilot.press("escape", "escape", "escape")
        await wait_idle(pilot)
    assert not ui_errors(), ui_errors()
    every_screen = {"MainScreen", "CompareScreen", "HelpScreen", "SpecSettingsScreen", "SaveSessionScreen", "OpenSessionScreen", "Palette"}
    assert every_screen <= visited, f"the walk never reached {every_screen - visited}"
    assert esc_mid_answer >= 2, "the walk should stop answers mid-way"

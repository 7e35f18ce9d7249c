"""Helpers for the app tests: an isolated app on the deterministic fake engine, and waits."""
from __future__ import annotations

import asyncio
import functools
import time
from typing import Callable

from jetspec_chat.settings import Settings
from jetspec_chat.ui.app import JetspecApp
from jetspec_chat.ui.chat import ChatInput
from jetspec_chat.ui.compare import CompareScreen
from jetspec_chat.ui.fake_engine import FakeBackend
from jetspec_chat.ui.race_screen import RaceScreen


def async_test(fn):
    """Run an `async def` test with asyncio (no pytest async plugin needed)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


def isolate(monkeypatch, tmp_path) -> None:
    """Point settings, sessions and exports at a temporary directory."""
    monkeypatch.setenv("JETSPEC_CHAT_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("JETSPEC_CHAT_CONFIG", str(tmp_path / "config"))


def make_app(
    backend: FakeBackend | None = None, settings: Settings | None = None, *, device_budget: bool = False, **kwargs
) -> JetspecApp:
    """The app on the fake engine. The budget stays what `settings` say (64 by default) unless
    `device_budget`: then it follows the (fake, CPU) device as for a user who never chose one."""
    settings = settings or Settings()
    settings.budget_auto = device_budget
    return JetspecApp(backend=backend or FakeBackend(), settings=settings, **kwargs)


async def wait_until(pilot, cond: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)


async def wait_ready(pilot) -> None:
    app = pilot.app
    await wait_until(pilot, lambda: app.chat.load_state != "loading" and app.main_screen.is_mounted, what="model load")
    await app.drain_now()
    await pilot.pause()


async def wait_idle(pilot) -> None:
    """Until nothing runs and everything the engine reported has been shown."""
    app = pilot.app
    await wait_until(pilot, lambda: not app.chat.busy and app.chat.outbox.empty(), what="engine idle")
    await app.drain_now()
    await pilot.pause()
    await pilot.pause()


async def send(pilot, text: str, *, wait: bool = True) -> None:
    """Type `text` and send it. With wait=False the Enter key is simulated by calling the
    submit handler directly: Pilot.press would wait for the screen to settle, which it does
    not while an answer streams."""
    app = pilot.app
    box = app.main_screen.query_one(ChatInput)
    box.text = text
    box.move_cursor(box.document.end)
    box.focus()
    if wait:
        await pilot.press("enter")
        await wait_idle(pilot)
    else:
        await app.send_message(box.text)


async def open_compare(pilot) -> CompareScreen:
    """F6 from the chat: the compare screen is on top (a prompt must have been sent)."""
    await pilot.press("f6")
    await pilot.pause()
    screen = pilot.app.screen
    assert isinstance(screen, CompareScreen)
    return screen


async def compare_then_race(pilot, budgets: str = "AR, 16, 64") -> RaceScreen:
    """From a fresh app: a prompt, F6 with `budgets`, the comparison to its end, then F8: the
    race screen on top."""
    app = pilot.app
    await wait_ready(pilot)
    await send(pilot, "write python fib")
    screen = await open_compare(pilot)
    screen.query_one("#compare-budgets").value = budgets
    await pilot.press("enter")
    await wait_until(pilot, lambda: app.chat.compare is not None and not app.chat.compare.running, what="comparison")
    await wait_idle(pilot)
    await pilot.press("f8")
    await pilot.pause()
    race = app.screen
    assert isinstance(race, RaceScreen)
    return race


async def freeze(pilot) -> None:
    """Remove what moves on its own before a snapshot: cursor blink, toasts."""
    app = pilot.app
    for box in app.main_screen.query(ChatInput):
        box.cursor_blink = False
    app.clear_notifications()
    await pilot.pause()

"""The app on the real engine split over 2 CPU ranks (--tp 2, gloo): the engine process starts
the worker rank, answers, and a cancel (Escape) mid-answer reaches every rank."""
from __future__ import annotations

import pytest
from app_support import async_test, isolate, send, wait_idle, wait_ready, wait_until

from jetspec_chat.settings import Settings
from jetspec_chat.ui.app import JetspecApp

pytestmark = pytest.mark.slow

TIMEOUT = 120.0


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    isolate(monkeypatch, tmp_path)


@async_test
async def test_tp2_engine_process_answers_and_cancels():
    settings = Settings(budget=4, budget_auto=False, max_new_tokens=8, theme="jetspec-dark", compare_budgets=["AR"])
    app = JetspecApp(model="random:tiny-qwen3", device="cpu", max_context=512, tp=2, settings=settings)
    async with app.run_test(size=(140, 44)) as pilot:
        await wait_until(pilot, lambda: app.chat.load_state != "loading", timeout=TIMEOUT, what="the model to load")
        await wait_ready(pilot)
        assert app.chat.load_state == "ready", app.chat.load_error
        await send(pilot, "Reverse a list.", wait=False)
        await wait_until(pilot, lambda: not app.chat.busy and app.chat.outbox.empty(), timeout=TIMEOUT, what="the answer")
        await wait_idle(pilot)
        result = app.chat.current_trace.result
        assert result is not None and result.finish_reason == "length" and result.new_tokens == 8
        # A long answer, cancelled after its first rounds: the next answer still runs on both ranks.
        app.chat.settings.max_new_tokens = 100000
        await send(pilot, "Tell me a long story.", wait=False)
        trace = app.chat.current_trace
        await wait_until(pilot, lambda: len(trace.rounds) >= 2, timeout=TIMEOUT, what="the first rounds")
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.chat.busy and app.chat.outbox.empty(), timeout=TIMEOUT, what="the cancel")
        await wait_idle(pilot)
        assert trace.result is not None and trace.result.finish_reason == "cancelled"
        app.chat.settings.max_new_tokens = 8
        await send(pilot, "Again.", wait=False)
        await wait_until(pilot, lambda: not app.chat.busy and app.chat.outbox.empty(), timeout=TIMEOUT, what="the last answer")
        await wait_idle(pilot)
        assert app.chat.current_trace.result is not None and app.chat.current_trace.result.new_tokens == 8

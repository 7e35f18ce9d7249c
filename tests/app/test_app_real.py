"""The app on the REAL engine (random:tiny-qwen3: random weights and a random draft head, CPU).

What the fake-engine tests cannot show: the engine thread, the real events and the real session
behind the same widgets. Kept short (a few dozen rounds in all): answers are capped at a few
tokens, the trees are small.
"""
from __future__ import annotations

import pytest
from app_support import async_test, isolate, open_compare, send, wait_idle, wait_ready, wait_until

from jetspec_chat.settings import Settings
from jetspec_chat.ui.app import JetspecApp
from jetspec_chat.ui.chat import AssistantMessage
from jetspec_chat.ui.tree_view import TreePanel

pytestmark = pytest.mark.slow

MODEL = "random:tiny-qwen3"
SIZE = (140, 44)
TIMEOUT = 90.0  # generous: CI machines can be slow and busy


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    isolate(monkeypatch, tmp_path)


def real_app(model: str = MODEL, **settings) -> JetspecApp:
    base = {"budget": 16, "budget_auto": False, "max_new_tokens": 12, "theme": "jetspec-dark", "compare_budgets": ["AR", "4", "16"]}
    base.update(settings)
    return JetspecApp(model=model, device="cpu", max_context=1024, settings=Settings(**base))


async def ready(pilot) -> None:
    app = pilot.app
    await wait_until(pilot, lambda: app.chat.load_state != "loading", timeout=TIMEOUT, what="the model to load")
    await wait_ready(pilot)
    assert app.chat.load_state == "ready", app.chat.load_error


async def idle(pilot) -> None:
    app = pilot.app
    await wait_until(pilot, lambda: not app.chat.busy and app.chat.outbox.empty(), timeout=TIMEOUT, what="the engine")
    await wait_idle(pilot)


async def ask(pilot, text: str) -> None:
    await send(pilot, text, wait=False)
    await idle(pilot)


def content(app, selector: str) -> str:
    return str(app.main_screen.query_one(selector).content)


@async_test
async def test_real_engine_answers_with_trees_stats_and_kv_reuse():
    app = real_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        info = app.chat.engine_info
        assert info.model_name == MODEL and info.max_depth and info.head_name.startswith("random")
        await ask(pilot, "Write a Python function that reverses a list.")
        trace = app.chat.current_trace
        result = trace.result
        assert result is not None and result.finish_reason in ("length", "eos"), trace.error
        assert trace.rounds and result.rounds == len(trace.rounds)
        assert all(len(r.tree_texts) > 1 for r in trace.rounds)  # speculation on: real trees
        msg = list(app.main_screen.query(AssistantMessage))[-1]
        assert msg.raw == result.text
        # the tree view: the last round's tree, its node count and the legend
        tree = app.main_screen.query_one(TreePanel)
        n = len(trace.rounds)
        assert f"round {n}/{n}" in tree.border_title
        assert f"{len(trace.rounds[-1].tree_texts)} nodes" in tree.border_subtitle
        assert "★" in content(app, "#tree-body")  # the bonus token is drawn
        assert "accepted" in content(app, "#tree-legend")
        # stats: tokens/s and tau, from the real timings
        lines = content(app, "#stats-lines")
        assert "tok/s" in lines and "τ" in lines and f"rounds {n}" in lines
        meta = str(msg.query_one(".meta").content)
        assert "tok/s" in meta and "τ" in meta
        # the second turn reuses the first one's KV cache
        await ask(pilot, "Now in Rust.")
        assert app.chat.last_prefill is not None and app.chat.last_prefill.reused_tokens > 0
        assert "reused" in content(app, "#status") and "reused" in content(app, "#stats-lines")
        assert app.chat.current_trace.result.reused_tokens > 0
        assert [m["role"] for m in app.chat.session_messages] == ["user", "assistant"] * 2


@async_test
async def test_real_engine_live_budget_change_and_escape():
    app = real_app(max_new_tokens=1000)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "Tell me a long story.", wait=False)
        trace = app.chat.current_trace
        await wait_until(pilot, lambda: len(trace.rounds) >= 2, timeout=TIMEOUT, what="the first rounds")
        app.speculation.set_budget(4)
        await wait_until(pilot, lambda: trace.spec_changes, timeout=TIMEOUT, what="the budget change")
        start = trace.spec_changes[-1][0]
        await wait_until(pilot, lambda: len(trace.rounds) >= start + 2, timeout=TIMEOUT, what="rounds at budget 4")
        await pilot.press("escape")
        await idle(pilot)
        result = trace.result
        assert result.finish_reason == "cancelled"
        assert result.rounds < 1000
        sizes = [len(r.tree_texts) for r in trace.rounds]
        assert min(sizes[:start]) > 4 and max(sizes[start:]) <= 4, sizes
        assert "→ budget 4" in str(list(app.main_screen.query(AssistantMessage))[-1].query_one(".role").content)
        msg = list(app.main_screen.query(AssistantMessage))[-1]
        assert msg.raw == result.text == app.chat.session_messages[-1]["content"]
        assert "stopped (Esc)" in str(msg.query_one(".meta").content)
        # still usable after the cancel, from the same (kept) conversation
        app.chat.settings.max_new_tokens = 6
        await ask(pilot, "Shorter, please.")
        assert app.chat.current_trace.result.finish_reason in ("length", "eos")
        assert app.chat.current_trace.result.reused_tokens > 0


@async_test
async def test_real_engine_compare_budgets():
    app = real_app(max_new_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await ask(pilot, "Count to five.")
        first = app.chat.current_trace.result.text
        screen = await open_compare(pilot)
        await pilot.press("enter")  # runs the default list: AR, 4, 16
        await wait_until(
            pilot, lambda: app.chat.compare.job_id is not None and not app.chat.compare.running, timeout=TIMEOUT, what="the comparison"
        )
        await idle(pilot)
        rows = app.chat.compare.rows
        assert [r.label for r in rows] == ["AR", "4", "16"]
        assert all(r.status == "done" and r.result is not None for r in rows), [(r.label, r.status, r.error) for r in rows]
        assert len({r.result.text for r in rows}) == 1 and rows[0].result.text == first  # greedy: lossless
        assert screen.query_one("#compare-table").row_count == 3
        assert app.chat.baseline is not None and "comparison" in app.chat.baseline.source
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.main_screen

"""The app on a MoE target (random:tiny-qwen3-moe) and a Gated DeltaNet hybrid (random:tiny-qwen3.5),
real engine, CPU: one answer with its trees and stats, then a budget comparison. The MoE block and
the recurrent layers change nothing the app sees but the model."""
from __future__ import annotations

import pytest
from app_support import async_test, isolate, open_compare, wait_until
from test_app_real import SIZE, TIMEOUT, ask, content, idle, ready, real_app

from jetspec_chat.ui.chat import AssistantMessage
from jetspec_chat.ui.tree_view import TreePanel

pytestmark = pytest.mark.slow

@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    isolate(monkeypatch, tmp_path)


@pytest.mark.parametrize("model", ["random:tiny-qwen3-moe", "random:tiny-qwen3.5"])
@async_test
async def test_the_model_answers_with_trees_stats_and_compare(model):
    app = real_app(model, max_new_tokens=8, compare_budgets=["AR", "16"])
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.chat.engine_info.model_name == model and app.chat.engine_info.head_name.startswith("random")
        await ask(pilot, "Route this through the experts.")
        trace = app.chat.current_trace
        result = trace.result
        assert result is not None and result.finish_reason in ("length", "eos"), trace.error
        assert trace.rounds and all(len(r.tree_texts) > 1 for r in trace.rounds)  # real trees
        assert list(app.main_screen.query(AssistantMessage))[-1].raw == result.text
        n = len(trace.rounds)
        assert f"round {n}/{n}" in app.main_screen.query_one(TreePanel).border_title
        lines = content(app, "#stats-lines")
        assert "tok/s" in lines and "τ" in lines and f"rounds {n}" in lines
        await open_compare(pilot)
        await pilot.press("enter")
        await wait_until(
            pilot, lambda: app.chat.compare.job_id is not None and not app.chat.compare.running, timeout=TIMEOUT, what="the comparison"
        )
        await idle(pilot)
        rows = app.chat.compare.rows
        assert [r.label for r in rows] == ["AR", "16"]
        assert all(r.status == "done" and r.result is not None for r in rows), [(r.label, r.status, r.error) for r in rows]
        assert {r.result.text for r in rows} == {result.text}  # greedy: the same answer at every budget

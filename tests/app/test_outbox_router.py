"""The outbox routing table and the compare state, driven without Textual running."""
from __future__ import annotations

import asyncio

from app_support import make_app

from jetspec_chat.engine.events import GenerationResult, PhaseTimings, RoundEvent
from jetspec_chat.ui import engine_worker as ew
from jetspec_chat.ui.compare import CompareState
from jetspec_chat.ui.jobs import OutboxRouter, outbox_item_types


def test_router_calls_the_handler_of_the_items_type_sync_or_async():
    seen = []

    async def on_finished(item):
        seen.append(("finished", item.job_id))

    router = OutboxRouter({ew.JobStarted: lambda item: seen.append(("started", item.job_id)), ew.JobFinished: on_finished})
    assert asyncio.run(router.dispatch(ew.JobStarted(1, "chat")))
    assert asyncio.run(router.dispatch(ew.JobFinished(1, "chat")))
    assert not asyncio.run(router.dispatch(ew.LoadProgress("x", None)))  # nobody registered it
    assert seen == [("started", 1), ("finished", 1)]
    assert ew.LoadProgress in router.missing()


def test_the_app_handles_every_outbox_item_type():
    app = make_app()
    assert app.reports.router.missing() == []
    assert len(outbox_item_types()) >= 12


def _round(index: int, tokens: int, elapsed: float) -> RoundEvent:
    return RoundEvent(index, (1,), ("a",), (-1,), (0,), (0.0,), (0,), 1, (1,), "a", PhaseTimings(), tokens, tokens, elapsed)


def _result(reason: str = "eos") -> GenerationResult:
    return GenerationResult("a b", (1, 2), reason, 2, (1, 1), 3, 0, 0.01, 0.1, 0.11)


def test_compare_state_follows_the_runs():
    state = CompareState(["AR", "16", "64"])
    state.run_started(0)
    assert state.rows[0].status == "running"
    state.run_event(0, _round(0, 5, 0.5), prefill_ms=100.0)
    assert state.rows[0].live_rounds == 1 and state.rows[0].live_tps == 4 / 0.4
    assert state.run_finished(0, _result(), "").status == "done"
    assert state.run_finished(1, None, "out of memory").status == "error"
    assert state.ar_tps() == (state.rows[0].tps, "AR row")
    state.finished(cancelled=True)
    assert [r.status for r in state.rows] == ["done", "error", "cancelled"]
    assert state.done_count == 3 and state.cancelled and not state.running

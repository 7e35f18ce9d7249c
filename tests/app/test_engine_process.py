"""The engine in a spawned child process: the same commands and events as on a thread, and
an app that survives the child's death (kill mid-answer -> one sentence, chat kept, ctrl+e
restarts, nothing typed lost)."""
from __future__ import annotations

import pickle

import pytest
from app_support import async_test, isolate, make_app, send, wait_idle, wait_ready, wait_until

from jetspec_chat.engine.events import FinishEvent, GenerationResult, PhaseTimings, PrefillEvent, RoundEvent
from jetspec_chat.settings import Settings
from jetspec_chat.ui import engine_worker as ew
from jetspec_chat.ui.app import JetspecApp
from jetspec_chat.ui.chat import AssistantMessage, ChatInput, NoteMessage, UserMessage
from jetspec_chat.ui.engine_process import describe_exit
from jetspec_chat.ui.fake_engine import ANSWERS, FakeBackend

SIZE = (120, 40)
TIMEOUT = 90.0


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    isolate(monkeypatch, tmp_path)


def test_events_and_outbox_items_pickle():
    timings = PhaseTimings(1.0, 2.0, 3.0, 4.0, 5.0, 15.0)
    round_ = RoundEvent(0, (1, 2), ("a", "b"), (-1, 0), (0, 1), (0.0, -0.5), (0, 1), 3, (2, 3), "b c", timings, 3, 9, 0.1)
    result = GenerationResult("a b c", (1, 2, 3), "eos", 1, (2,), 5, 2, 0.01, 0.02, 0.03)
    items = [
        ew.GenerationEvent(1, "chat", PrefillEvent(5, 2, 1, "a", 1.5)),
        ew.GenerationEvent(1, "chat", round_),
        ew.GenerationEvent(1, "chat", FinishEvent(result)),
        ew.EngineReady(ew.EngineInfo("m", "h", "cpu", "float32", 3, 100, ("accum_logp",))),
        ew.SessionSnapshot(1, ({"role": "user", "content": "x"},), 9, {"messages": []}),
        ew.EngineDied("gone"),
    ]
    assert [pickle.loads(pickle.dumps(i)) for i in items] == items


def test_describe_exit():
    assert describe_exit(-9) == "The engine process was killed by SIGKILL (out of memory, or killed)."
    assert describe_exit(4) == "The engine process exited unexpectedly (exit code 4)."
    assert describe_exit(3) == "A tensor-parallel worker of the engine died, and the engine stopped with it."


@async_test
async def test_fake_engine_in_a_child_process_answers_cancels_and_takes_live_changes():
    app = make_app(FakeBackend(round_delay_s=0.01), engine_process=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.chat.load_state != "loading", timeout=TIMEOUT, what="the child to load")
        await wait_ready(pilot)
        assert app.chat.worker.pid is not None and app.chat.worker.alive
        await send(pilot, "write python fib")
        assert list(app.main_screen.query(AssistantMessage))[-1].raw == ANSWERS[1]
        await send(pilot, "/long go", wait=False)
        trace = app.chat.current_trace
        await wait_until(pilot, lambda: len(trace.rounds) >= 3, what="rounds")
        app.speculation.set_budget(8)
        await wait_until(pilot, lambda: trace.spec_changes, what="the live change to reach the child")
        await pilot.press("escape")
        await wait_idle(pilot)
        assert trace.result.finish_reason == "cancelled"
        start = trace.spec_changes[-1][0]
        assert all(len(r.tree_texts) <= 8 for r in trace.rounds[start:])
    assert not app.chat.worker.alive  # shut down with the app


def _notes(app, kind):
    return [str(n.content) for n in app.main_screen.query(NoteMessage) if n.kind == kind]


@pytest.mark.slow
@async_test
async def test_killed_engine_process_mid_answer_keeps_the_chat_and_restarts():
    app = JetspecApp(
        model="random:tiny-qwen3",
        device="cpu",
        max_context=1024,
        settings=Settings(budget=8, budget_auto=False, max_new_tokens=2000, theme="jetspec-dark"),
    )
    assert app.chat.engine_process  # the real engine runs in a child by default
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.chat.load_state != "loading", timeout=TIMEOUT, what="the model to load")
        await wait_ready(pilot)
        assert app.chat.load_state == "ready", app.chat.load_error
        await send(pilot, "Tell me a long story.", wait=False)
        trace = app.chat.current_trace
        # Rounds with some text: a random model's first tokens may decode to none yet.
        await wait_until(pilot, lambda: len(trace.rounds) >= 2 and trace.text, timeout=TIMEOUT, what="the first rounds")
        box = app.main_screen.query_one(ChatInput)
        box.text = "a message typed while the engine dies"
        app.chat.worker.kill()
        await wait_until(pilot, lambda: app.chat.engine_stopped is not None, timeout=TIMEOUT, what="the app to notice")
        await wait_idle(pilot)
        errors = _notes(app, "error")
        assert any("killed by SIGKILL" in n and "ctrl+e" in n for n in errors), errors
        # the chat is kept: the question and the partial answer, and the typed text
        assert [str(m.text) for m in app.main_screen.query(UserMessage)][-1:] == ["Tell me a long story."]
        partial = list(app.main_screen.query(AssistantMessage))[-1]
        assert partial.raw and partial.raw == trace.text
        assert box.text == "a message typed while the engine dies"
        # sending now is refused without losing the text
        await app.send_message(box.text)
        assert box.text == "a message typed while the engine dies"
        # ctrl+e: a new process, the same conversation
        await pilot.press("ctrl+e")
        await wait_until(pilot, lambda: app.chat.load_state == "ready", timeout=TIMEOUT, what="the restarted engine")
        await wait_idle(pilot)
        assert app.chat.engine_stopped is None and app.chat.worker.alive
        app.chat.settings.max_new_tokens = 4
        await send(pilot, "Shorter, please.", wait=False)
        await wait_until(pilot, lambda: not app.chat.busy, timeout=TIMEOUT, what="the answer")
        await wait_idle(pilot)
        assert app.chat.current_trace.result.finish_reason in ("length", "eos"), app.chat.current_trace.error
        users = [m["content"] for m in app.chat.session_messages if m["role"] == "user"]
        assert users == ["Tell me a long story.", "Shorter, please."]


@pytest.mark.slow
def test_worker_warms_the_budgets_before_they_are_timed():
    """Load warms AR and the app's budget (a GPU would warm the compare budgets too); a compare
    budget first used later is warmed before its run is timed."""
    import queue as _queue
    import time as _time

    from jetspec_chat.engine.params import GenerationParams, SpecParams

    worker = ew.EngineWorker(None)
    worker.start()
    try:
        setup = ew.EngineSetup("random:tiny-qwen3", device="cpu", max_context=512)
        worker.submit(ew.LoadCommand(setup, budget=8, compare_budgets=(16,)))
        progress, ready = [], None
        deadline = _time.monotonic() + TIMEOUT
        while ready is None and _time.monotonic() < deadline:
            try:
                item = worker.outbox.get(timeout=1.0)
            except _queue.Empty:
                continue
            if isinstance(item, ew.LoadProgress):
                progress.append(item.message)
            elif isinstance(item, ew.EngineLoadFailed):
                raise AssertionError(item.message)
            elif isinstance(item, ew.EngineReady):
                ready = item.info
        assert ready is not None and ready.warmed == (0, 8) and ready.warm_seconds > 0  # CPU: not 16 yet
        assert "Warming up: AR" in progress and "Warming up: budget 8" in progress
        job = worker.submit(ew.SendCommand("hi", GenerationParams(max_new_tokens=2, spec=SpecParams(budget=8))))
        entries = (ew.CompareEntry("16", GenerationParams(max_new_tokens=2, spec=SpecParams(budget=16))),)
        worker.submit(ew.CompareCommand(entries))
        deadline = _time.monotonic() + TIMEOUT
        prefills = []
        while _time.monotonic() < deadline:
            item = worker.outbox.get(timeout=TIMEOUT)
            if isinstance(item, ew.GenerationEvent) and isinstance(item.event, PrefillEvent):
                prefills.append(item.event)
            if isinstance(item, ew.JobFinished) and item.kind == "compare":
                break
            assert not isinstance(item, ew.JobFailed), item
        assert worker._warmed == {0, 8, 16} and job
        # the warm-up answered the run's own prompt: the run reuses the cached prompt, all but
        # the anchor token, as a run at a warmed budget does
        chat, run = prefills
        assert run.reused_tokens + run.new_tokens == chat.reused_tokens + chat.new_tokens
        assert run.new_tokens <= 1, run
    finally:
        worker.shutdown(timeout=2.0)


def test_worker_says_from_which_round_a_live_change_applies_with_a_round_ahead():
    """The engine launches the next round before a round's event goes out (the round ahead), so
    a tree change requested then applies one round later: SpecApplied names the first round
    that used it, and every round before it kept the old tree."""
    import queue as _queue
    import time as _time

    from jetspec_chat.engine.params import GenerationParams, SpecParams

    worker = ew.EngineWorker(None)
    worker.start()
    try:
        worker.submit(ew.LoadCommand(ew.EngineSetup("random:tiny-qwen3", device="cpu", max_context=512), budget=8))
        items, deadline, job, rounds = [], _time.monotonic() + TIMEOUT, None, []
        while _time.monotonic() < deadline:
            try:
                item = worker.outbox.get(timeout=1.0)
            except _queue.Empty:
                continue
            items.append(item)
            if isinstance(item, ew.EngineLoadFailed):
                raise AssertionError(item.message)
            if isinstance(item, ew.EngineReady):
                job = worker.submit(ew.SendCommand("tell me a story", GenerationParams(max_new_tokens=40, spec=SpecParams(budget=8))))
            if isinstance(item, ew.GenerationEvent) and isinstance(item.event, RoundEvent):
                rounds.append(item.event)
                if len(rounds) == 1:
                    worker.update_spec(job, SpecParams(enabled=False))
            if isinstance(item, ew.JobFinished):
                break
        applied = [i for i in items if isinstance(i, ew.SpecApplied)]
        assert len(applied) == 1 and len(rounds) > applied[0].from_round + 1, (applied, len(rounds))
        first = applied[0].from_round
        assert all(len(r.tree_tokens) > 1 for r in rounds[:first]), [len(r.tree_tokens) for r in rounds]
        assert all(len(r.tree_tokens) == 1 for r in rounds[first:]), [len(r.tree_tokens) for r in rounds]
    finally:
        worker.shutdown()

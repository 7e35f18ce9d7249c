"""Small but visible things a newcomer meets in the app: the context counter when full,
the demo label, export without a trace, why a rerun's text differed, the compare bar inside a
run, the loading panel's elapsed time, and budget keys right after the Help screen."""
from __future__ import annotations

import argparse
from types import SimpleNamespace

from app_support import async_test, isolate, make_app, open_compare, send, wait_ready, wait_until

from jetspec_chat.engine import GenerationParams, SamplingParams
from jetspec_chat.ui.main_screen import context_label
from jetspec_chat.ui.compare import CompareState
from jetspec_chat.ui.dialogs import BUDGET_STEPS, HelpScreen
from jetspec_chat.ui.fake_engine import FakeBackend
from jetspec_chat.ui.jobs import Job
from jetspec_chat.ui.launch import add_arguments, build_app
from jetspec_chat.ui.trace import AnswerTrace

SIZE = (120, 40)


def text_of(app, selector: str) -> str:
    return str(app.main_screen.query_one(selector).render())


def test_context_counter_is_clamped_and_says_full():
    assert context_label(150, 200) == "context 150 / 200 tokens"
    assert context_label(200, 200) == "context full (200 / 200 tokens)"
    assert context_label(201, 200) == "context full (200 / 200 tokens)"


@async_test
async def test_status_bar_context_full(tmp_path, monkeypatch):
    isolate(monkeypatch, tmp_path)
    app = make_app(FakeBackend(max_context=200))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        app.chat.context_tokens = 201
        app.view.refresh_chrome()
        status = text_of(app, "#status")
        assert "context full (200 / 200 tokens)" in status and "201" not in status


@async_test
async def test_demo_header_says_scripted(tmp_path, monkeypatch):
    isolate(monkeypatch, tmp_path)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    app = build_app(parser.parse_args(["--demo"]))
    assert app.view.demo
    app.chat.worker.backend = FakeBackend()  # no load delay in the test
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        top = text_of(app, "#topbar")
        assert "DEMO: a scripted engine, its numbers are made up" in top and "float32" not in top


@async_test
async def test_a_real_run_has_no_demo_label(tmp_path, monkeypatch):
    isolate(monkeypatch, tmp_path)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert "DEMO" not in text_of(app, "#topbar")


@async_test
async def test_export_without_answers_says_there_is_no_trace(tmp_path, monkeypatch):
    isolate(monkeypatch, tmp_path)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await pilot.press("f12")
        await pilot.pause()
        svg, trace = app.sessions.last_export
        assert svg.exists() and trace is None
        assert not list(svg.parent.glob("*.trace.jsonl"))
        notes = [str(n.render()) for n in app.main_screen.query("NoteMessage")]
        assert any("no round trace to write" in n for n in notes)


def answer(finish_reason: str, temperature: float = 0.0) -> AnswerTrace:
    trace = AnswerTrace(job_id=1, kind="chat", params=GenerationParams(sampling=SamplingParams(temperature=temperature)))
    trace.result = SimpleNamespace(finish_reason=finish_reason, new_tokens=40)
    return trace


def test_why_a_rerun_differs_names_the_cut_short_original():
    app = make_app()
    job = Job("compare")
    app.chat.traces = [answer("cancelled")]
    assert "stopped with Esc" in app.sessions.why_texts_differ(job)
    app.chat.traces = [answer("length")]
    assert "token limit" in app.sessions.why_texts_differ(job)
    app.chat.traces = [answer("eos", temperature=0.7)]
    assert "temperature" in app.sessions.why_texts_differ(job)


def test_compare_bar_moves_inside_the_first_run():
    state = CompareState(["AR", "16"], expected_tokens=40)
    state.run_started(0)
    state.rows[0].live_tokens = 10
    assert state.progress == 0.25
    state.rows[0].live_tokens = 400  # ran longer than expected: never shows the run as done
    assert 0.9 < state.progress < 1
    state.run_finished(0, SimpleNamespace(finish_reason="eos", new_tokens=80, rounds=1), "")
    state.run_started(1)
    state.rows[1].live_tokens = 40  # the finished run's length is now the estimate
    assert state.progress == 1.5


@async_test
async def test_loading_panel_shows_elapsed_time(tmp_path, monkeypatch):
    isolate(monkeypatch, tmp_path)
    app = make_app(FakeBackend(load_delay_s=3.0, load_steps=1))
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.chat.load_progress is not None, what="a load phase")
        label = app.main_screen.query_one("#loading-label")
        await wait_until(pilot, lambda: " · 1 s" in str(label.render()), timeout=5, what="elapsed seconds")


@async_test
async def test_budget_keys_right_after_closing_help(tmp_path, monkeypatch):
    """Every budget key press counts right after Help closes, however it is closed and wherever
    the focus was when it opened."""
    isolate(monkeypatch, tmp_path)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        for where in ("#input", "#tree", "#chat"):
            app.main_screen.query_one(where).focus()
            for close in ("escape", "f1", "q"):
                for key, step in (("f2", -1), ("f3", 1)):
                    before = app.chat.settings.budget
                    await pilot.press("f1")
                    assert isinstance(app.screen, HelpScreen)
                    await pilot.press(close, key)  # no pause between closing and the key
                    await pilot.pause()
                    i = BUDGET_STEPS.index(before)
                    expected = BUDGET_STEPS[max(0, min(len(BUDGET_STEPS) - 1, i + step))]
                    assert app.chat.settings.budget == expected, (where, close, key)


@async_test
async def test_f6_reopens_compare_after_esc_closed_it(tmp_path, monkeypatch):
    from jetspec_chat.ui.compare import CompareScreen

    isolate(monkeypatch, tmp_path)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        for _ in range(2):
            await open_compare(pilot)
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, CompareScreen)

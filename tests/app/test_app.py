"""Pilot tests of the chat app on the deterministic fake engine."""
from __future__ import annotations

import json

import pytest
from app_support import (
    async_test,
    freeze,
    isolate,
    make_app,
    open_compare,
    send,
    wait_idle,
    wait_ready,
    wait_until,
)
from jetspec_chat.engine.errors import ModelNotFoundError

from jetspec_chat.settings import SessionStore, Settings, load_settings
from jetspec_chat.ui.chat import AssistantMessage, ChatInput, NoteMessage, UserMessage
from jetspec_chat.ui.compare import CompareScreen
from jetspec_chat.ui.dialogs import (
    HelpScreen,
    OpenSessionScreen,
    SaveSessionScreen,
    SpecSettingsScreen,
)
from jetspec_chat.ui.fake_engine import ANSWERS, FakeBackend
from jetspec_chat.ui.frames import FrameBudget
from jetspec_chat.ui.stats import StatsPanel
from jetspec_chat.ui.trace import compute_stats
from jetspec_chat.ui.tree_view import TreePanel

SIZE = (120, 40)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    isolate(monkeypatch, tmp_path)


def notes(app, kind: str | None = None) -> list[str]:
    return [str(n.content) for n in app.main_screen.query(NoteMessage) if kind is None or n.kind == kind]


def answers(app) -> list[AssistantMessage]:
    return list(app.main_screen.query(AssistantMessage))


@async_test
async def test_send_prompt_streams_answer():
    app = make_app(FakeBackend(round_delay_s=0.02))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert any("Loaded fake/Qwen3-8B-demo" in n for n in notes(app))
        await send(pilot, "/long speculation", wait=False)
        msg = answers(app)[-1]
        seen = set()

        def two_partials() -> bool:
            if msg.raw:
                seen.add(len(msg.raw))
            return len(seen) >= 2

        await wait_until(pilot, two_partials, what="streamed text")
        assert app.chat.busy, "the answer streams in several batches while the engine runs"
        await pilot.press("escape")
        await wait_idle(pilot)
        assert msg.raw == app.chat.current_trace.text
        await send(pilot, "write python fib")
        msg = answers(app)[-1]
        assert msg.raw == ANSWERS[1]
        assert msg.answer_text.startswith("Here is a small")
        trace = app.chat.current_trace
        assert trace.result is not None and trace.result.finish_reason == "eos"
        assert trace.rounds and trace.text == ANSWERS[1]
        # the session mirror and the status line
        assert [m["role"] for m in app.chat.session_messages] == ["user", "assistant"] * 2
        status = str(app.main_screen.query_one("#status").content)
        assert "prefill" in status and "context" in status
        assert "tok/s" in str(msg.query_one(".meta").content)
        tree = app.main_screen.query_one(TreePanel)
        assert f"round {len(trace.rounds)}/{len(trace.rounds)}" in tree.border_title


@async_test
async def test_second_turn_reuses_kv_cache():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        await send(pilot, "and the kv cache?")
        assert app.chat.last_prefill is not None and app.chat.last_prefill.reused_tokens > 0
        status = str(app.main_screen.query_one("#status").content)
        assert "reused from the KV cache" in status
        meta = str(answers(app)[-1].query_one(".meta").content)
        assert "reused from the KV cache" in meta


@async_test
async def test_escape_cancels_at_round_boundary_and_app_stays_usable():
    app = make_app(FakeBackend(round_delay_s=0.02))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "/long tell me about speculation", wait=False)
        await wait_until(pilot, lambda: app.chat.current_trace is not None and len(app.chat.current_trace.rounds) >= 3, what="rounds")
        await pilot.press("escape")
        await wait_idle(pilot)
        trace = app.chat.current_trace
        assert trace.result.finish_reason == "cancelled"
        assert 3 <= trace.result.rounds < 150
        msg = answers(app)[-1]
        assert "stopped (Esc)" in str(msg.query_one(".meta").content)
        assert app.chat.session_messages[-1]["role"] == "assistant"
        assert app.chat.session_messages[-1]["content"] == trace.text  # partial answer kept
        await send(pilot, "hello again")
        assert app.chat.current_trace.result.finish_reason == "eos"


@async_test
async def test_auto_scroll_stops_when_the_user_scrolls_up():
    app = make_app(FakeBackend(round_delay_s=0.01))
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "write python fib")
        await send(pilot, "/long go", wait=False)
        chat = app.main_screen.query_one("#chat")
        await wait_until(pilot, lambda: len(app.chat.current_trace.rounds) > 10, what="rounds")
        await pilot.pause(0.1)
        assert chat.scroll_y == chat.max_scroll_y  # following the answer
        chat.scroll_up(animate=False)
        await pilot.pause(0.1)
        held = chat.scroll_y
        await wait_until(pilot, lambda: chat.max_scroll_y > held + 5, what="more text")
        assert chat.scroll_y == held  # the user's position is kept
        chat.scroll_end(animate=False)  # back at the bottom: following again
        await pilot.pause(0.1)
        mark = chat.max_scroll_y
        await wait_until(pilot, lambda: chat.max_scroll_y > mark + 3, what="more text")
        await pilot.pause(0.2)
        assert chat.scroll_y >= mark + 3
        await pilot.press("escape")
        await wait_idle(pilot)


@async_test
async def test_budget_depth_width_algo_changes():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await pilot.press("f3")
        assert app.chat.settings.budget == 96
        await pilot.press("f2", "f2", "f2")
        assert app.chat.settings.budget == 32
        await pilot.pause()
        assert "budget 32" in str(app.main_screen.query_one("#topbar").content)
        await pilot.press("f4")
        assert app.chat.settings.tree_algo == "adaptive"
        # the settings dialog: budget up, depth down, width down, algorithm next
        await pilot.press("ctrl+b")
        await pilot.pause()
        assert isinstance(app.screen, SpecSettingsScreen)
        await pilot.press("right", "down", "left", "down", "left", "down", "right", "enter")
        await pilot.pause()
        assert app.chat.settings.budget == 48
        assert app.chat.settings.depth == 14
        assert app.chat.settings.width == 24  # a step down from the default 32
        assert app.chat.settings.tree_algo == "chain"
        # typed numbers
        await pilot.press("ctrl+b")
        await pilot.pause()
        await pilot.press("1", "6", "enter")
        await pilot.pause()
        assert app.chat.settings.budget == 16
        await send(pilot, "hello")
        trace = app.chat.current_trace
        assert trace.params.spec.budget == 16 and trace.params.spec.tree_algo == "chain"
        assert all(len(r.tree_texts) <= 16 for r in trace.rounds)
        assert load_settings().budget == 16  # remembered


@async_test
async def test_live_changes_reach_the_answer_in_progress():
    app = make_app(FakeBackend(round_delay_s=0.03))
    toasts: list[str] = []
    real_notify = app.notify
    app.notify = lambda message, **kw: (toasts.append(str(message)), real_notify(message, **kw))[1]
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "/long tell me about speculation", wait=False)
        trace = app.chat.current_trace
        await wait_until(pilot, lambda: len(trace.rounds) >= 3, what="rounds")
        app.speculation.set_budget(8)
        assert toasts[-1] == "budget 8 (from the next round)"
        await wait_until(pilot, lambda: trace.spec_changes, what="the budget change to reach the engine")
        start = trace.spec_changes[-1][0]
        await wait_until(pilot, lambda: len(trace.rounds) >= start + 3, what="rounds at the new budget")
        await pilot.press("f5")  # speculation off, mid-answer
        assert toasts[-1] == "speculation off: plain AR (from the next round)"
        await wait_until(pilot, lambda: len(trace.spec_changes) == 2, what="speculation off")
        off = trace.spec_changes[-1][0]
        await wait_until(pilot, lambda: len(trace.rounds) >= off + 3, what="plain AR rounds")
        app.speculation.set_temperature(0.7)
        assert toasts[-1] == "temperature 0.7 (from the next answer)"
        app.speculation.set_temperature(0.0)
        await pilot.press("escape")
        await wait_idle(pilot)
        sizes = [len(r.tree_texts) for r in trace.rounds]
        assert min(sizes[:start]) > 8 and max(sizes[start:off]) <= 8 and set(sizes[off:]) == {1}
        msg = answers(app)[-1]
        role = str(msg.query_one(".role").content)
        assert f"→ budget 8 · depth full · width 32 · accum_logp (from round {start + 1})" in role
        assert f"→ AR (from round {off + 1})" in role
        assert "τ" in str(msg.query_one(".meta").content)  # partly speculative: still has a tau
        assert app.chat.baseline is None  # not a plain AR answer
        assert "speedup" in str(app.main_screen.query_one("#stats-lines").content)
        # the next answer starts with the settings as they are now
        await send(pilot, "hello")
        assert not app.chat.current_trace.params.spec.enabled and not app.chat.current_trace.spec_changes


@async_test
async def test_the_result_text_is_shown_when_an_answer_ends():
    """The engine may hold back a short tail while streaming (e.g. after a cancel): the
    finished answer must show `FinishEvent.result.text`."""
    app = make_app(FakeBackend(round_delay_s=0.02, stop_strings=("@" * 10,)))  # never matched: the text lags 9 characters
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "/long go", wait=False)
        await wait_until(pilot, lambda: len(app.chat.current_trace.rounds) >= 3, what="rounds")
        await pilot.press("escape")
        await wait_idle(pilot)
        result = app.chat.current_trace.result
        assert result.finish_reason == "cancelled"
        msg = answers(app)[-1]
        assert msg.raw == result.text == app.chat.session_messages[-1]["content"]
        assert result.text.endswith(app.chat.current_trace.segments[-1][0])
        await send(pilot, "write python fib")
        assert answers(app)[-1].raw == ANSWERS[1]


@async_test
async def test_frames_wait_for_the_budget_and_lose_nothing():
    """Over its CPU budget the app holds the text and the redraws back; the next frame shows
    everything the engine reported meanwhile."""
    app = make_app(FakeBackend(round_delay_s=0.02))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        app.view.frames = FrameBudget(cpu_share=0.0, max_interval_s=3600.0)  # no frame but forced ones
        app.view.frames.drew()
        await send(pilot, "/long go", wait=False)
        trace = app.chat.current_trace
        await wait_until(pilot, lambda: len(trace.rounds) >= 5, what="rounds")
        msg = answers(app)[-1]
        assert msg.raw == "" and app.view.pending[msg]  # reported and handled, not drawn yet
        await app.drain_now()  # a forced frame
        assert msg.raw == trace.text
        await pilot.press("escape")
        await wait_idle(pilot)
        assert msg.raw == trace.result.text


@async_test
async def test_no_draft_head_says_speculation_is_off():
    app = make_app(FakeBackend(max_depth=None))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        expected = "no draft head: speculation off (plain AR); pass --draft-head to speculate"
        assert expected in notes(app, "warning")
        assert "no draft head: speculation off (plain AR)" in str(app.main_screen.query_one("#topbar").content)
        await pilot.press("f5")
        await send(pilot, "hello")
        assert not app.chat.current_trace.params.spec.enabled


@async_test
async def test_command_palette_sets_budget():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await pilot.press("ctrl+p")
        await pilot.pause(0.2)
        await pilot.press(*"budget: 256")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.chat.settings.budget == 256, timeout=5, what="palette command")


@async_test
async def test_speculation_off_runs_plain_ar_and_sets_baseline():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await pilot.press("f5")
        assert app.chat.settings.speculation is False
        await send(pilot, "hello")
        trace = app.chat.current_trace
        assert not trace.params.spec.enabled
        assert all(len(r.tree_texts) == 1 and r.accept_length == 1 for r in trace.rounds)
        assert app.chat.baseline is not None and "plain AR answer" in app.chat.baseline.source
        await pilot.press("f5")
        await send(pilot, "hello")
        spec_trace = app.chat.current_trace
        assert spec_trace.params.spec.enabled
        stats = app.main_screen.query_one("#stats-lines")
        # the AR answer was another turn (a longer context): not this prompt's baseline
        assert "no AR measurement of this prompt yet" in str(stats.content)
        await pilot.press("ctrl+r")  # AR on this very prompt
        await wait_idle(pilot)
        baseline = app.chat.baselines.for_trace(spec_trace)
        assert baseline is not None and "AR rerun of turn 2" in baseline.source
        stats = compute_stats(spec_trace, baseline)
        spec_ms = sum(r.timings.total_ms for r in spec_trace.rounds) / len(spec_trace.rounds)
        assert stats.speedup == pytest.approx(stats.tau_mean * baseline.round_ms / spec_ms)
        assert stats.speedup <= stats.tau_mean


@async_test
async def test_measure_ar_rerun():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert app.chat.baseline is None  # nothing to rerun yet
        await send(pilot, "write python fib")
        await pilot.press("ctrl+r")
        await wait_idle(pilot)
        assert app.chat.baseline is not None and "AR rerun of turn 1" in app.chat.baseline.source
        assert any("Plain AR on the last prompt" in n for n in notes(app))
        # greedy: the AR rerun reproduces the answer exactly, so the chat keeps it
        assert answers(app)[-1].raw == ANSWERS[1]


@async_test
async def test_compare_budgets_flow():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await pilot.press("f6")
        await pilot.pause()
        assert not isinstance(app.screen, CompareScreen)  # needs a prompt first
        await send(pilot, "write python fib")
        screen = await open_compare(pilot)
        assert "Compare budgets" in str(screen.query_one("#compare-title").content)  # drawn on open
        assert screen.query_one("#compare-table").row_count == len(app.compare_runs.budget_labels())
        assert app.compare_runs.budget_labels() == ["AR", "2", "4", "8", "16"]  # the fake engine runs on "cpu"
        # the time the list should take, from the answer's measured speed, before anything runs
        tps = app.chat.current_trace.result.tokens_per_second
        tokens = app.chat.current_trace.result.new_tokens
        assert app.compare_runs.estimate_seconds(["AR", "16"]) == pytest.approx(2 * tokens / tps)
        await pilot.pause()
        assert "About " in str(screen.query_one("#compare-status").content)
        box = screen.query_one("#compare-budgets")
        box.value = "AR, 16, nonsense"
        await pilot.press("enter")
        await pilot.pause()
        assert "not a budget" in str(screen.query_one("#compare-error").content)
        box.value = "AR 16 64"
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.chat.compare is not None and not app.chat.compare.running and app.chat.compare.done_count == 3)
        await wait_idle(pilot)
        rows = app.chat.compare.rows
        assert [r.label for r in rows] == ["AR", "16", "64"]
        assert all(r.status == "done" for r in rows)
        assert rows[0].tau == 1.0 and rows[2].tau > rows[1].tau > 1.0
        table = screen.query_one("#compare-table")
        assert table.row_count == 3
        assert "1.00×" in str(table.get_row_at(0)[3])
        assert app.chat.baseline is not None and "comparison" in app.chat.baseline.source
        assert app.chat.settings.compare_budgets == ["AR", "16", "64"]
        budgets, tps, taus = app.chat.compare.scaling_points()  # what the plot draws
        assert budgets == [16, 64] and tps == [rows[1].tps, rows[2].tps] and taus == [rows[1].tau, rows[2].tau]
        assert [str(table.get_row_at(i)[7]) for i in range(3)] == ["—", "yes", "yes"]  # =AR: token-identical
        # the answer is unchanged (greedy is lossless)
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.main_screen
        assert answers(app)[-1].raw == ANSWERS[1]


@async_test
async def test_compare_can_be_cancelled():
    app = make_app(FakeBackend(round_delay_s=0.02))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "write python fib")
        await pilot.press("f6")
        await pilot.pause()
        app.screen.query_one("#compare-budgets").value = "AR, 16, 32, 64"
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.chat.compare.rows[0].live_rounds >= 3, what="first compare rounds")
        await pilot.press("escape")  # cancels, does not close
        await wait_until(pilot, lambda: not app.chat.compare.running, what="cancel")
        await wait_idle(pilot)
        assert isinstance(app.screen, CompareScreen)
        assert app.chat.compare.cancelled
        assert all(r.status == "cancelled" for r in app.chat.compare.rows)
        # the stopped rerun truncated the session's last answer: the original is put back
        assert app.chat.session_messages[-1]["content"] == ANSWERS[1]
        assert any("Kept the original answer" in n for n in notes(app))
        await pilot.press("escape")  # now closes
        await pilot.pause()
        assert app.screen is app.main_screen
        await send(pilot, "hello")  # still usable
        assert app.chat.current_trace.result.finish_reason == "eos"


@async_test
async def test_session_save_and_reopen(tmp_path):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        await send(pilot, "write python fib")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, SaveSessionScreen)
        name_box = app.screen.query_one("#session-name")
        name_box.value = "my demo"
        await pilot.press("enter")
        await pilot.pause()
        path = tmp_path / "data" / "sessions" / "my-demo.json"
        assert path.exists()
        data = json.loads(path.read_text())
        assert [m["role"] for m in data["session"]["messages"]] == ["user", "assistant", "user", "assistant"]
        assert data["model"] == "fake/Qwen3-8B-demo"
        assert app.chat.session_name == "my-demo"
        await pilot.press("ctrl+n")
        await wait_idle(pilot)
        assert not answers(app)
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert isinstance(app.screen, OpenSessionScreen)
        await pilot.press("enter")
        await wait_idle(pilot)
        assert len(app.main_screen.query(UserMessage)) == 2
        assert answers(app)[-1].raw == ANSWERS[1]
        assert any("Opened session 'my-demo'" in n for n in notes(app))
        # the next turn goes on from the reopened conversation and autosaves
        await send(pilot, "and the kv cache?")
        data = json.loads(path.read_text())
        assert len(data["session"]["messages"]) == 6
        await send(pilot, "thanks")
        assert app.chat.last_prefill.reused_tokens > 0


@async_test
async def test_session_option_opens_or_creates(tmp_path):
    store = SessionStore()
    store.save("talk", {"system_prompt": None, "thinking": False, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}]})
    app = make_app(session="talk")
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await wait_idle(pilot)
        assert answers(app)[-1].raw == "Hello!"
        assert app.chat.session_name == "talk"
    app = make_app(session="fresh")
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        assert store.exists("fresh")


@async_test
async def test_theme_switch_and_user_theme(tmp_path):
    themes = tmp_path / "config" / "themes"
    themes.mkdir(parents=True)
    (themes / "mine.toml").write_text('name = "my-theme"\nprimary = "#ff00ff"\n[variables]\nspec-accepted = "#00ffff"\n')
    (themes / "broken.toml").write_text('name = "broken"\n')
    app = make_app(theme="light")
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert app.theme == "jetspec-light"
        assert "my-theme" in app.available_themes
        assert any("broken.toml ignored" in n for n in notes(app, "warning"))
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert app.theme == "jetspec-projector"
        assert app.has_class("-projector")
        assert load_settings().theme == "jetspec-projector"
        app.theme = "my-theme"
        await pilot.pause()
        assert app.theme_variables["spec-accepted"] == "#00ffff"
        assert not app.has_class("-projector")
    app = make_app(theme="no-such-theme")
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert app.theme == "jetspec-dark"
        assert any("unknown theme" in n for n in notes(app, "warning"))


@async_test
async def test_engine_errors_are_shown_and_app_stays_usable(tmp_path):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "/error overflow")
        assert any("does not fit in the context window" in n for n in notes(app, "error"))
        await send(pilot, "/error crash")
        errors = notes(app, "error")
        assert any("unexpected engine error (RuntimeError: simulated crash" in n for n in errors)
        log = (tmp_path / "data" / "error.log").read_text()
        assert "simulated crash" in log and "Traceback" in log
        await send(pilot, "hello")
        assert app.chat.current_trace.result.finish_reason == "eos"


@async_test
async def test_load_failure_is_shown():
    app = make_app(FakeBackend(load_error=ModelNotFoundError("model 'nope' not found")))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert app.chat.load_state == "failed"
        assert any("Could not load the model: model 'nope' not found" in n for n in notes(app, "error"))
        await send(pilot, "hello")
        assert any("No model is loaded" in n for n in notes(app, "error"))
        assert not answers(app)


@async_test
async def test_a_missing_package_says_what_to_install_and_offers_no_retry():
    app = make_app(FakeBackend(load_error=ModuleNotFoundError("No module named 'gguf'", name="gguf")))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert app.chat.load_state == "failed" and not app.chat.load_retryable
        errors = notes(app, "error")
        assert any("the Python package 'gguf' is missing: install it (pip install gguf)" in n for n in errors), errors
        assert not any("unexpected engine error" in n for n in errors)
        await send(pilot, "hello")
        assert not any("Retry" in n for n in notes(app, "error"))


@async_test
async def test_loading_progress_is_shown():
    app = make_app(FakeBackend(load_delay_s=1.0), device_budget=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.chat.load_progress is not None and app.chat.load_progress.fraction, what="progress")
        await app.drain_now()
        loading = app.main_screen.query_one("#loading")
        assert loading.display
        assert "Loading" in str(app.main_screen.query_one("#loading-label").content)
        assert "loading" in str(app.main_screen.query_one("#status").content)
        # the automatic budget is the device's, unknown until the engine says which device
        assert "budget auto" in str(app.main_screen.query_one("#topbar").content)
        # typing and sending while loading is fine: the message waits for the model
        await send(pilot, "hello", wait=False)
        await wait_ready(pilot)
        await wait_idle(pilot)
        assert not loading.display
        assert app.chat.current_trace.result.finish_reason == "eos"
        assert "budget 4" in str(app.main_screen.query_one("#topbar").content)  # the fake's device: cpu


@async_test
async def test_input_history_and_multiline():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "first")
        await send(pilot, "second")
        box = app.main_screen.query_one(ChatInput)
        box.focus()
        await pilot.press("up")
        assert box.text == "second"
        await pilot.press("up")
        assert box.text == "first"
        await pilot.press("down")
        assert box.text == "second"
        await pilot.press("down")
        assert box.text == ""
        await pilot.press("a", "ctrl+j", "b")
        assert box.text == "a\nb"
        assert not app.chat.busy


@async_test
async def test_copy_answer_and_code_block():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "write python fib")
        await pilot.press("ctrl+l")
        assert app.clipboard == ANSWERS[1]
        await pilot.press("ctrl+g")
        assert app.clipboard.startswith("def fib(n: int) -> int:")
        assert app.clipboard.rstrip().endswith("print([fib(i) for i in range(10)])")


@async_test
async def test_thinking_is_collapsed():
    app = make_app(settings=Settings(thinking=True))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        msg = answers(app)[-1]
        box = msg.query_one(".thinking")
        assert box.display and box.collapsed
        assert box.title.startswith("Thought (")
        assert "<think>" not in msg.answer_text and msg.answer_text.strip()
        assert "Let me recall" in str(msg.query_one(".thinking-body").content)


@async_test
async def test_tree_pause_step_and_replay():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "write python fib")
        tree = app.main_screen.query_one(TreePanel)
        n = len(app.chat.current_trace.rounds)
        await pilot.press("f7")
        assert tree.mode == "paused" and tree.shown_index == n - 1
        await pilot.press("f8", "f8")
        assert tree.shown_index == n - 3
        assert f"round {n - 2}/{n}" in tree.border_title
        await pilot.pause()
        assert "at round" in str(app.main_screen.query_one("#stats-digits-label").content)
        await pilot.press("f9")
        assert tree.shown_index == n - 2
        tree.replay_speed = 2
        await pilot.press("f10")
        assert tree.mode == "replay" and tree.shown_index <= 1
        tree.replay_speed = 32
        tree.action_speed(2)  # 64 rounds/s
        await wait_until(pilot, lambda: tree.mode == "paused", what="replay to finish")
        assert tree.shown_index == n - 1
        await pilot.press("f7")
        assert tree.mode == "live"
        # keys on the focused tree
        tree.focus()
        await pilot.press("home", "right", "right")
        assert tree.shown_index == 2
        await pilot.press("end")
        assert tree.mode == "live"


@async_test
async def test_provenance_toggle():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        await pilot.press("ctrl+backslash")
        await pilot.pause()
        chat = app.main_screen.query_one("#chat")
        assert chat.has_class("-provenance")
        view = answers(app)[-1].query_one(".provenance")
        assert str(view.content) == app.chat.current_trace.text
        kinds = {k for _, k in app.chat.current_trace.segments}
        assert kinds == {"draft", "target"}
        await pilot.press("ctrl+backslash")
        assert not chat.has_class("-provenance")


@async_test
async def test_export_svg_and_trace(tmp_path):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        await pilot.press("f12")
        await pilot.pause()
        svg, trace = app.sessions.last_export
        assert svg.exists() and svg.read_text().startswith("<svg")
        lines = [json.loads(line) for line in trace.read_text().splitlines()]
        assert lines[0]["type"] == "answer"
        rounds = [line for line in lines if line["type"] == "round"]
        assert len(rounds) == len(app.chat.current_trace.rounds)
        assert {"tree_texts", "accepted_nodes", "timings", "accept_length"} <= set(rounds[0])
        assert lines[-1]["type"] == "finish"
        assert str(svg.parent) == str(tmp_path / "data" / "exports")
        assert any(str(trace) in n for n in notes(app))


@async_test
async def test_resize_and_tiny_terminals():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        for size in ((80, 24), (40, 12), (12, 4), (1, 1), (200, 60), SIZE):
            await pilot.resize_terminal(*size)
            await pilot.pause()
        assert app.main_screen.query_one(StatsPanel).is_mounted
        await send(pilot, "again")
        assert app.chat.current_trace.result.finish_reason == "eos"


@async_test
async def test_new_chat_drops_everything():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        await pilot.press("ctrl+n")
        await wait_idle(pilot)
        assert not answers(app) and app.chat.current_trace is None
        assert app.chat.session_messages == ()
        await send(pilot, "hello")
        assert app.chat.last_prefill.reused_tokens == 0


@async_test
async def test_help_screen():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await pilot.press("f1")
        await pilot.pause()
        assert app.screen.__class__.__name__ == "HelpScreen"
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.main_screen
        await freeze(pilot)


@async_test
async def test_help_on_the_compare_screen():
    """F1 did nothing on the compare screen."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        await open_compare(pilot)
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert "On the compare screen" in app.screen.query_one("Markdown").source
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.view.compare_screen  # back where F1 was pressed


@async_test
async def test_default_budget_follows_the_device_until_the_user_picks_one():
    app = make_app(device_budget=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert app.chat.engine_info.device == "cpu"
        assert app.chat.settings.budget == 4 and app.chat.settings.budget_auto  # CPU: 4 beats AR, 64 does not
        assert any("Budget 4: the default on a CPU" in n for n in notes(app))
        await pilot.press("f3")
        assert app.chat.settings.budget == 8 and not app.chat.settings.budget_auto
    saved = load_settings()
    assert (saved.budget, saved.budget_auto) == (8, False)  # remembered as the user's choice


def test_auto_budget_and_the_budget_flag():
    import argparse

    from jetspec_chat.engine.params import auto_budget
    from jetspec_chat.ui.launch import _settings_from_args, add_arguments

    assert (auto_budget("cuda:0"), auto_budget("cuda"), auto_budget("cpu")) == (64, 64, 4)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert _settings_from_args(parser.parse_args([])).budget_auto
    explicit = _settings_from_args(parser.parse_args(["--budget", "64"]))
    assert (explicit.budget, explicit.budget_auto) == (64, False)


@async_test
async def test_tree_redraws_at_most_about_15_times_a_second_and_keeps_every_round(monkeypatch):
    """Whatever the round rate, the UI redraws the tree once per drain (12 Hz) with the latest
    round; the trace keeps every round for stepping and replay."""
    import time as _time

    redraws = []
    real_redraw = TreePanel.redraw
    monkeypatch.setattr(TreePanel, "redraw", lambda self: (redraws.append(_time.monotonic()), real_redraw(self))[1])
    app = make_app(FakeBackend(round_delay_s=0.0005))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        redraws.clear()
        start = _time.monotonic()
        await send(pilot, "/long go")
        elapsed = _time.monotonic() - start
        trace = app.chat.current_trace
        assert len(trace.rounds) == trace.result.rounds > 100
        assert len(redraws) <= 15 * elapsed + 5, (len(redraws), elapsed)

"""Unit tests of the app's non-UI parts: tree layout, thinking split, settings and session
store, themes, the fake engine, the engine thread, stats and the command line."""
from __future__ import annotations

import argparse
import json
import os
import queue
import threading
import time
from dataclasses import replace

import pytest
from app_support import isolate
from jetspec_chat.engine.errors import ContextOverflowError, EngineError
from jetspec_chat.engine.events import FinishEvent, PrefillEvent, RoundEvent
from jetspec_chat.engine.params import GenerationParams, SpecParams

from jetspec_chat.settings import (
    SessionStore,
    SessionStoreError,
    Settings,
    atomic_write_text,
    load_settings,
    sanitize_session_name,
    save_settings,
)
from jetspec_chat.ui import engine_worker as ew
from jetspec_chat.ui.chat import last_code_block, split_thinking
from jetspec_chat.ui.compare import BudgetListError, parse_budget_list
from jetspec_chat.ui.fake_engine import ANSWERS, EOS_ID, FakeBackend, FakeChatSession, tokenize
from jetspec_chat.ui.frames import FrameBudget
from jetspec_chat.ui.launch import add_arguments, app_argv
from jetspec_chat.ui.themes import (
    SpecColors,
    ThemeFileError,
    _parse_mini_toml,
    builtin_themes,
    theme_from_mapping,
)
from jetspec_chat.ui.trace import AnswerTrace, compute_stats, split_provenance
from jetspec_chat.ui.tree_view import layout_tree, render_tree, visible_token


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    isolate(monkeypatch, tmp_path)


def run(session, text, **spec):
    params = GenerationParams(spec=SpecParams(**spec))
    return list(session.send(text, params))


@pytest.fixture(scope="module")
def engine():
    return FakeBackend().load_engine()


COLORS = SpecColors.from_variables({"background": "#000000", "foreground": "#ffffff"})


# ----------------------------------------------------------------------------- fake engine


def test_fake_engine_is_lossless_and_trees_are_well_formed(engine):
    texts = set()
    for spec in ({"enabled": False}, {"budget": 16}, {"budget": 256}, {"budget": 64, "tree_algo": "chain"}):
        events = run(FakeChatSession(engine), "write python fib", **spec)
        assert isinstance(events[0], PrefillEvent) and isinstance(events[-1], FinishEvent)
        result = events[-1].result
        rounds = [e for e in events if isinstance(e, RoundEvent)]
        assert result.rounds == len(rounds) and result.finish_reason == "eos"
        texts.add(result.text)
        assert events[0].first_text + "".join(r.new_text for r in rounds) == result.text
        for r in rounds:
            n = len(r.tree_texts)
            assert n <= spec.get("budget", 1) or not spec.get("enabled", True)
            assert r.tree_parents[0] == -1 and all(0 <= p < i for i, p in enumerate(r.tree_parents) if i)
            assert all(r.tree_depths[i] == r.tree_depths[r.tree_parents[i]] + 1 for i in range(1, n))
            assert all(r.tree_scores[i] < r.tree_scores[r.tree_parents[i]] for i in range(1, n))
            path = r.accepted_nodes
            assert path[0] == 0 and all(r.tree_parents[b] == a for a, b in zip(path, path[1:]))
            drafted, bonus = split_provenance(r)
            assert drafted + bonus == r.new_text
    assert texts == {ANSWERS[1]}


def test_fake_engine_cancel_rerun_and_state(engine):
    s = FakeChatSession(engine, system_prompt="be brief")
    cancel = threading.Event()
    events = []
    for ev in s.send("/long explain", GenerationParams(), cancel=cancel):
        events.append(ev)
        if isinstance(ev, RoundEvent) and ev.index == 2:
            cancel.set()
    assert events[-1].result.finish_reason == "cancelled" and events[-1].result.rounds == 3
    assert s.messages[-1] == {"role": "assistant", "content": events[-1].result.text}
    rerun = list(s.rerun_last(GenerationParams(spec=SpecParams(enabled=False), max_new_tokens=5)))
    assert rerun[-1].result.finish_reason == "length" and rerun[-1].result.new_tokens == 5
    assert [m["role"] for m in s.messages] == ["system", "user", "assistant"]
    again = FakeChatSession.from_dict(engine, json.loads(json.dumps(s.to_dict())))
    assert again.messages == s.messages and again.system_prompt == "be brief"
    with pytest.raises(ContextOverflowError):
        s.send("/error overflow", GenerationParams())
    with pytest.raises(EngineError):
        FakeChatSession(engine).rerun_last(GenerationParams())


def test_tokenize_roundtrip():
    for text in ANSWERS:
        assert "".join(tokenize(text)) == text


# ----------------------------------------------------------------------------- tree view


def _big_round(engine) -> RoundEvent:
    events = run(FakeChatSession(engine), "hello there", budget=256, width=16)
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    return max(rounds, key=lambda r: (len(r.tree_texts), len(r.accepted_nodes)))


def test_layout_keeps_accepted_path_and_counts_hidden_nodes(engine):
    ev = _big_round(engine)
    n = len(ev.tree_texts)
    assert n == 256
    for max_lines in (4, 12, 40, 300):
        layout = layout_tree(ev, max_lines)
        assert set(ev.accepted_nodes) <= layout.visible
        assert len(layout.visible) + sum(layout.hidden_under.values()) == n
        assert len(layout.visible) + 1 <= max(max_lines, len(ev.accepted_nodes) + 1)
        for v in layout.visible:  # prefix-closed
            assert v == 0 or ev.tree_parents[v] in layout.visible


def test_render_tree_is_legible(engine):
    ev = _big_round(engine)
    text = render_tree(ev, COLORS, width=60, max_lines=30)
    lines = text.plain.splitlines()
    assert len(lines) <= 30
    assert all(len(line) <= 60 for line in lines)
    assert lines[0].startswith("◆ ") and "anchor" in lines[0]
    assert sum("✔" in line for line in lines) == len(ev.accepted_nodes) - 1
    assert sum("★" in line for line in lines) == 1
    assert any("more" in line for line in lines)
    narrow = render_tree(ev, COLORS, width=12, max_lines=8)
    assert all(len(line) <= 12 for line in narrow.plain.splitlines())


def test_a_stop_token_bonus_reads_end_of_answer():
    """The engine appends the stop token that ends an answer to the last round's new_tokens
    (with no text): the tree says the answer ended there, not an empty bonus."""
    events = list(FakeChatSession(FakeBackend().load_engine()).send("hello", GenerationParams()))
    last, result = events[-2], events[-1].result
    assert last.new_tokens[-1] == last.bonus_token == result.stop_token
    assert "★ ■ end of answer" in render_tree(last, COLORS, stop_token=result.stop_token).plain
    assert "★ ∅" in render_tree(last, COLORS).plain  # what it showed without the stop token


def test_visible_token():
    assert visible_token(" a\n\t") == "␣a↵⇥"
    assert visible_token("") == "∅"
    assert visible_token("\x00") == "\\x00"
    assert visible_token("x" * 40, 10) == "x" * 9 + "…"


# ----------------------------------------------------------------------------- chat helpers


def test_split_thinking():
    s = split_thinking("<think>\nhmm\n</think>\n\nAnswer", final=True)
    assert (s.thinking, s.answer, s.thinking_done) == ("hmm", "Answer", True)
    s = split_thinking("<thi")
    assert s.thinking is None and s.answer == ""
    s = split_thinking("<think>working</thi")
    assert s.thinking == "working" and s.answer == "" and not s.thinking_done
    s = split_thinking("plain answer with </think> text")
    assert s.thinking is None and s.answer == "plain answer with </think> text"
    s = split_thinking("opened by the template</think>\n\nAnswer", thinking_enabled=True)
    assert (s.thinking, s.answer) == ("opened by the template", "Answer")
    s = split_thinking("  Hello", final=False)
    assert s.answer == "Hello"


class HarmonyPieces:
    """A harmony vocabulary (gpt-oss's special tokens among its added tokens): ids index pieces."""

    PIECES = ["<|channel|>", "analysis", "<|message|>", "The user", " greets", " me.", "<|end|>", "<|start|>",
              "assistant", "final", "Hello", "! How", " can I help?", "<|return|>", " Ignored."]

    def get_added_vocab(self):
        return {p: i for i, p in enumerate(self.PIECES) if p.startswith("<|")}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(p for p in (self.PIECES[i] for i in ids) if not (skip_special_tokens and p.startswith("<|")))


@pytest.mark.parametrize("round_size", [1, 2, 5])
def test_a_harmony_answer_streams_its_analysis_as_thinking(round_size):
    """A gpt-oss answer (analysis, then final, then <|return|>) streamed in rounds through the
    engine's Answer and split as the assistant message splits it: at every round the Thinking
    box holds only analysis text and the answer only final text; no special token shows; the
    answer ends at <|return|>."""
    from jetspec_chat.engine.answer import Answer

    analysis, final = "The user greets me.", "Hello! How can I help?"
    ids = [0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 9, 2, 10, 11, 12, 13, 14]
    answer, raw = Answer(HarmonyPieces(), frozenset(), GenerationParams(max_new_tokens=64)), ""
    for k in range(0, len(ids), round_size):
        new = ids[k:k + round_size]
        raw += answer.add(new[:answer.room_for(new)])
        split = split_thinking(raw)
        assert "<|" not in raw
        assert analysis.startswith(split.thinking or "") and final.startswith(split.answer), (k, split)
        assert not split.answer or split.thinking_done
        if answer.finish:
            break
    assert answer.finish == "eos" and answer.stop_token == 13
    done = split_thinking(raw, final=True)
    assert (done.thinking, done.answer, done.thinking_done) == (analysis, final, True)


def test_last_code_block():
    md = "a\n```python\nx = 1\n```\nb\n~~~\ny\n~~~\n"
    assert last_code_block(md) == "y"
    assert last_code_block("no code") is None


def test_parse_budget_list():
    assert parse_budget_list("AR, 16 32,64, 16; off") == ["AR", "16", "32", "64"]
    for bad in ("", "x", "0.5", "2000"):
        with pytest.raises(BudgetListError):
            parse_budget_list(bad)


# ----------------------------------------------------------------------------- settings, sessions


def test_settings_roundtrip_and_bad_files(tmp_path):
    s = Settings(budget=128, depth=7, theme="jetspec-light", compare_budgets=["AR", "8"])
    save_settings(s)
    assert load_settings() == s
    path = tmp_path / "config" / "settings.json"
    path.write_text('{"budget": "many", "width": 4, "depth": null, "speculation": 1}')
    loaded = load_settings()
    assert loaded.budget == Settings().budget and loaded.width == 4 and loaded.depth is None
    assert loaded.speculation is True  # a non-bool is ignored, the default stays
    path.write_text("{not json")
    assert load_settings() == Settings()


def test_atomic_write_never_leaves_a_torn_file(tmp_path, monkeypatch):
    target = tmp_path / "x" / "file.json"
    atomic_write_text(target, "old")

    def boom(*_a, **_k):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in target.parent.iterdir()] == ["file.json"]


def test_session_store(tmp_path):
    store = SessionStore()
    session = {"system_prompt": None, "thinking": False, "messages": [{"role": "user", "content": "Hi there, how are you?"}]}
    path = store.save("My chat!", session, model="m")
    assert path.name == "My-chat.json"
    data = store.load("My-chat")
    assert data["session"] == session and data["model"] == "m" and data["title"].startswith("Hi there")
    (store.directory / "junk.json").write_text("[1, 2")
    (store.directory / "other.json").write_text('{"format": "something else"}')
    assert [s.name for s in store.list()] == ["My-chat"]
    with pytest.raises(SessionStoreError):
        store.load("junk")
    with pytest.raises(SessionStoreError):
        store.load("missing")
    with pytest.raises(SessionStoreError):
        store.save("///", session)
    assert sanitize_session_name(" a b/c ") == "a-b-c"


# ----------------------------------------------------------------------------- themes


def test_builtin_themes_define_the_spec_colors():
    themes = {t.name: t for t in builtin_themes()}
    assert {"jetspec-dark", "jetspec-light", "jetspec-projector"} <= set(themes)
    for theme in themes.values():
        for var in ("spec-accepted", "spec-rejected", "spec-bonus", "spec-root"):
            assert var in theme.variables
    assert SpecColors.from_variables(themes["jetspec-projector"].variables).projector


def test_mini_toml_matches_tomllib():
    from importlib import resources

    import tomllib

    for entry in resources.files("jetspec_chat.themes").iterdir():
        if entry.name.endswith(".toml"):
            text = entry.read_text(encoding="utf-8")
            assert _parse_mini_toml(text) == tomllib.loads(text)


def test_bad_theme_is_rejected():
    with pytest.raises(ThemeFileError):
        theme_from_mapping({"name": "x", "primary": "not-a-color"}, "x")
    with pytest.raises(ThemeFileError):
        theme_from_mapping({"name": "x"}, "x")


# ----------------------------------------------------------------------------- engine thread


def _collect(outbox: queue.SimpleQueue, until, timeout=10.0) -> list:
    items, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            item = outbox.get(timeout=0.05)
        except queue.Empty:
            continue
        items.append(item)
        if until(item):
            return items
    raise AssertionError(f"timed out; got {[type(i).__name__ for i in items]}")


def test_engine_worker_send_cancel_and_errors():
    worker = ew.EngineWorker(FakeBackend(round_delay_s=0.005))
    worker.start()
    try:
        worker.submit(ew.LoadCommand(ew.EngineSetup()))
        items = _collect(worker.outbox, lambda i: isinstance(i, ew.EngineReady))
        assert any(isinstance(i, ew.LoadProgress) for i in items)
        job = worker.submit(ew.SendCommand("/long go", GenerationParams()))
        items = _collect(worker.outbox, lambda i: isinstance(i, ew.GenerationEvent) and isinstance(i.event, RoundEvent))
        worker.cancel(job)
        items = _collect(worker.outbox, lambda i: isinstance(i, ew.SessionSnapshot) and i.job_id == job)
        finished = [i for i in items if isinstance(i, ew.JobFinished)]
        assert finished and finished[0].cancelled
        job = worker.submit(ew.SendCommand("/error crash", GenerationParams()))
        items = _collect(worker.outbox, lambda i: isinstance(i, ew.SessionSnapshot) and i.job_id == job)
        failed = [i for i in items if isinstance(i, ew.JobFailed)][0]
        assert failed.unexpected and "RuntimeError" in failed.message and "Traceback" in failed.details
        job = worker.submit(ew.SendCommand("hi", GenerationParams(spec=SpecParams(budget=0))))
        items = _collect(worker.outbox, lambda i: isinstance(i, ew.SessionSnapshot) and i.job_id == job)
        failed = [i for i in items if isinstance(i, ew.JobFailed)][0]
        assert not failed.unexpected and "budget must be between" in failed.message
        entries = tuple(ew.CompareEntry(label, GenerationParams(spec=spec)) for label, spec in
                        (("AR", SpecParams(enabled=False)), ("32", SpecParams(budget=32))))
        job = worker.submit(ew.SendCommand("hello", GenerationParams()))
        _collect(worker.outbox, lambda i: isinstance(i, ew.SessionSnapshot) and i.job_id == job)
        job = worker.submit(ew.CompareCommand(entries))
        items = _collect(worker.outbox, lambda i: isinstance(i, ew.SessionSnapshot) and i.job_id == job)
        done = [i for i in items if isinstance(i, ew.CompareRunFinished)]
        assert [d.label for d in done] == ["AR", "32"] and all(d.result for d in done)
        assert done[0].result.text == done[1].result.text
    finally:
        worker.shutdown()
    assert not worker.alive


def test_engine_worker_live_spec_changes_apply_from_the_next_round():
    worker = ew.EngineWorker(FakeBackend(round_delay_s=0.005))
    worker.start()
    try:
        worker.submit(ew.LoadCommand(ew.EngineSetup()))
        _collect(worker.outbox, lambda i: isinstance(i, ew.EngineReady))
        job = worker.submit(ew.SendCommand("/long go", GenerationParams(spec=SpecParams(budget=64))))
        _collect(worker.outbox, lambda i: isinstance(i, ew.GenerationEvent) and isinstance(i.event, RoundEvent))
        worker.update_spec(job, SpecParams(budget=0))  # invalid: rejected, the answer goes on
        items = _collect(worker.outbox, lambda i: isinstance(i, (ew.SpecRejected, ew.SpecApplied)))
        assert isinstance(items[-1], ew.SpecRejected) and "budget must be between" in items[-1].message
        worker.update_spec(job, SpecParams(budget=32))
        worker.update_spec(job, SpecParams(budget=8))  # the latest request wins
        items = _collect(worker.outbox, lambda i: isinstance(i, ew.SpecApplied))
        applied = items[-1]
        assert applied.spec.budget == 8 and not any(isinstance(i, ew.SpecApplied) and i.spec.budget == 32 for i in items)
        items = _collect(worker.outbox, lambda i: isinstance(i, ew.GenerationEvent) and isinstance(i.event, RoundEvent)
                         and i.event.index >= applied.from_round + 2)
        later = [i.event for i in items if isinstance(i, ew.GenerationEvent) and isinstance(i.event, RoundEvent)]
        assert later and all(len(r.tree_texts) <= 8 for r in later if r.index >= applied.from_round)
        worker.cancel(job)
        items = _collect(worker.outbox, lambda i: isinstance(i, ew.SessionSnapshot) and i.job_id == job)
        worker.update_spec(job, SpecParams(budget=4))  # the job is over: ignored
        assert job not in worker._spec_requests
    finally:
        worker.shutdown()


def test_fake_engine_update_spec_changes_later_rounds(engine):
    session = FakeChatSession(engine)
    rounds = []
    for ev in session.send("/long go", GenerationParams(spec=SpecParams(budget=64))):
        if isinstance(ev, RoundEvent):
            rounds.append(ev)
            if ev.index == 2:
                engine.update_spec(SpecParams(budget=8))
            if ev.index == 5:
                engine.update_spec(SpecParams(enabled=False))
            if ev.index == 8:
                break
    sizes = [len(r.tree_texts) for r in rounds]
    assert min(sizes[:3]) > 8 and 1 < max(sizes[3:6]) <= 8 and sizes[6:] == [1, 1, 1]
    with pytest.raises(EngineError):
        engine.update_spec(SpecParams(width=0))


def test_trace_live_changes_and_authoritative_result_text():
    engine = FakeBackend(stop_strings=("@" * 7,)).load_engine()  # never matched: the text lags 6 characters
    session = FakeChatSession(engine)
    trace = AnswerTrace(0, "chat", GenerationParams(spec=SpecParams(budget=64)))
    cancel = threading.Event()
    streamed = ""
    for ev in session.send("write python fib", trace.params, cancel=cancel):
        streamed += trace.add(ev)
        if isinstance(ev, RoundEvent) and ev.index == 1:
            trace.add_spec_change(2, SpecParams(budget=8))
        if isinstance(ev, RoundEvent) and ev.index == 3:
            cancel.set()
    assert trace.result.finish_reason == "cancelled"
    assert streamed == trace.text == trace.result.text  # the held-back tail arrived with the result
    assert trace.params_at(1).spec.budget == 64 and trace.params_at(2).spec.budget == 8
    assert trace.label.endswith("→ budget 8 · depth full · width 32 · accum_logp (from round 3)")
    assert compute_stats(trace).label.startswith("budget 8")
    trace.add_spec_change(len(trace.rounds), SpecParams(budget=4))  # asked during the last round
    assert "budget 4" not in trace.label  # never took effect
    head = json.loads(next(iter(trace.to_jsonl_lines(0))))
    assert [c["from_round"] for c in head["spec_changes"]] == [2, len(trace.rounds)]


def test_engine_worker_load_failure_then_commands_fail_politely():
    worker = ew.EngineWorker(FakeBackend())
    worker.start()
    try:
        worker.submit(ew.LoadCommand(ew.EngineSetup(model="missing-model")))
        items = _collect(worker.outbox, lambda i: isinstance(i, ew.EngineLoadFailed))
        assert "not found" in items[-1].message and not items[-1].details
        worker.submit(ew.SendCommand("hi", GenerationParams()))
        items = _collect(worker.outbox, lambda i: isinstance(i, ew.JobFailed))
        assert "not found" in items[-1].message
    finally:
        worker.shutdown()


# ----------------------------------------------------------------------------- stats


def test_compute_stats_matches_the_result(engine):
    events = run(FakeChatSession(engine), "write python fib", budget=64)
    trace = AnswerTrace(job_id=1, kind="chat", params=GenerationParams())
    for ev in events:
        trace.add(ev)
    stats = compute_stats(trace)
    result = events[-1].result
    assert stats.rounds == result.rounds
    assert stats.tps_answer == pytest.approx(result.tokens_per_second)
    assert stats.tau_mean == pytest.approx(result.mean_accept_length)
    assert sum(c for _, c in stats.histogram) == result.rounds
    assert trace.text == result.text
    partial = compute_stats(trace, upto=5)
    assert partial.rounds == 5 and partial.finish_reason == ""
    from jetspec_chat.ui.trace import ArBaseline, PromptKey, mean_round_ms, prompt_key

    spec_ms = mean_round_ms(trace.rounds)
    ar = ArBaseline(spec_ms / 2, "test", prompt_key(trace))  # AR rounds half as long as speculative ones
    with_ar = compute_stats(trace, ar)
    assert with_ar.speedup == pytest.approx(stats.tau_mean / 2)  # tau x AR round / spec round
    slow_ar = ArBaseline(spec_ms * 1.5, "measured under other load", prompt_key(trace))
    assert compute_stats(trace, slow_ar).speedup is None  # it would exceed tau: not shown
    other = ArBaseline(spec_ms / 2, "another prompt", PromptKey("other", 9, 512, GenerationParams().sampling))
    assert compute_stats(trace, other).speedup is None and compute_stats(trace, other).baseline is None


# ----------------------------------------------------------------------------- command line


def test_arguments_and_web_command():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["Qwen/Qwen3-8B", "--budget", "128", "--depth", "full", "--theme", "projector", "--web"])
    assert args.model == "Qwen/Qwen3-8B" and args.budget == 128 and args.depth == "full" and args.web
    argv = app_argv(args)
    assert "--web" not in argv and argv[0] == "Qwen/Qwen3-8B"
    again = parser.parse_args(argv)
    assert (again.budget, again.depth, again.theme) == (128, "full", "projector")
    with pytest.raises(SystemExit):
        parser.parse_args(["--budget", "0"])
    assert parser.parse_args([]).model is None


def test_settings_from_args(tmp_path):
    from jetspec_chat.ui.launch import _settings_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    s = _settings_from_args(parser.parse_args(["--no-spec", "--width", "4", "--depth", "3", "--temperature", "0.7"]))
    assert (s.speculation, s.width, s.depth, s.temperature) == (False, 4, 3, 0.7)


def test_generation_params_clamps_depth():
    from jetspec_chat.ui.app import JetspecApp

    app = JetspecApp(backend=FakeBackend(), settings=Settings(depth=40))
    app.chat.engine_info = ew.EngineInfo("m", "h", "cpu", "float32", 15, 100, ("accum_logp",))
    assert app.chat.generation_params().spec.depth is None
    app.chat.engine_info = replace(app.chat.engine_info, max_depth=None)
    assert app.chat.generation_params().spec.enabled is False


def test_fake_engine_ends_answers_by_the_engines_rules():
    """Stop strings and max new tokens through engine/answer.py, as on the real engine."""
    engine = FakeBackend().load_engine()
    result = list(FakeChatSession(engine).send("write python fib", GenerationParams(stop=("print(",))))[-1].result
    assert result.finish_reason == "stop" and result.text == ANSWERS[1][: ANSWERS[1].index("print(")]
    events = list(FakeChatSession(engine).send("write python fib", GenerationParams(max_new_tokens=7)))
    result = events[-1].result
    assert result.finish_reason == "length" and len(result.token_ids) == 7
    assert events[0].first_text + "".join(e.new_text for e in events[1:-1]) == result.text == "".join(tokenize(ANSWERS[1])[:7])
    result = list(FakeChatSession(engine).send("write python fib", GenerationParams()))[-1].result
    assert result.finish_reason == "eos" and result.stop_token == EOS_ID and result.text == ANSWERS[1]
    assert sum(result.accept_lengths) == len(result.token_ids)  # the first token from the prefill, the stop token counted


def test_frame_budget_keeps_the_ui_under_its_cpu_share():
    """A frame only when the UI process used at most cpu_share of a core since the last one."""
    clock = {"wall": 0.0, "cpu": 0.0}
    budget = FrameBudget(cpu_share=0.05, wall_clock=lambda: clock["wall"], cpu_clock=lambda: clock["cpu"])
    assert budget.allows()  # the first frame at once
    frames = 0
    for _ in range(1000):  # 10 s of 10 ms drain ticks; each frame costs 25 ms of CPU
        clock["wall"] += 0.01
        if budget.allows():
            budget.drew()
            clock["cpu"] += 0.025
            frames += 1
    assert 19 <= frames <= 21 and clock["cpu"] / clock["wall"] <= 0.05 + 1e-9  # 2 frames a second
    cheap = FrameBudget(cpu_share=0.05, wall_clock=lambda: clock["wall"], cpu_clock=lambda: clock["cpu"])
    cheap.drew()
    clock["wall"] += 0.01  # a 0.1 ms frame: the next one is allowed at the next tick
    clock["cpu"] += 0.0001
    assert cheap.allows()
    cheap.drew()
    clock["cpu"] += 1.0  # a one-off second of CPU (say, mounting messages) ...
    clock["wall"] += 0.49
    assert not cheap.allows()
    clock["wall"] += 0.01
    assert cheap.allows()  # ... holds frames back for max_interval_s, not 20 s

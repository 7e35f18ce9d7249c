"""Multi-turn sessions, prefix reuse, cancellation, stop strings, limits, bad input."""
import threading

import pytest

from engine_helpers import OracleDraft, hf_model, random_prompt, run, tiny_engine
from jetspec_chat.engine import (
    ChatSession, ConfigError, ContextOverflowError, FinishEvent, GenerationParams, PrefillEvent, RoundEvent, SpecParams,
)

PARAMS = GenerationParams(max_new_tokens=20, spec=SpecParams(budget=16, width=4))


def answer(session, text, params=PARAMS, cancel=None):
    events = list(session.send(text, params, cancel))
    return events[0], events[-1].result


def test_second_turn_reuses_the_cache_and_equals_a_fresh_session():
    engine = tiny_engine("tiny-qwen3")
    s = ChatSession(engine, system_prompt="be brief")
    _, first = answer(s, "hello there")
    prefill, second = answer(s, "and now?")
    assert isinstance(prefill, PrefillEvent)
    assert prefill.reused_tokens > 0 and prefill.new_tokens < prefill.reused_tokens
    assert s.context_tokens > prefill.reused_tokens
    # a fresh engine state with the same history gives the same second answer
    engine.reset()
    fresh = ChatSession.from_dict(engine, s.to_dict())
    fresh.messages = fresh.messages[:-1]  # drop the second answer
    events = list(fresh.rerun_last(PARAMS))
    assert events[0].reused_tokens == 0
    assert events[-1].result.token_ids == second.token_ids
    assert [m["role"] for m in s.messages] == ["system", "user", "assistant", "user", "assistant"]


def test_turn_reuse_with_long_accepted_paths():
    engine = tiny_engine("tiny-llama")
    s = ChatSession(engine)
    with OracleDraft(engine, hf_model("tiny-llama"), error_rate=0.3):
        answer(s, "one")
        _, second = answer(s, "two")
        engine.reset()
        fresh = ChatSession.from_dict(engine, s.to_dict())
        fresh.messages.pop()
        again = list(fresh.rerun_last(PARAMS))[-1].result
    assert again.token_ids == second.token_ids
    assert second.mean_accept_length > 1.5


def test_rerun_last_replaces_the_answer_and_keeps_the_prompt():
    engine = tiny_engine("tiny-qwen2")
    s = ChatSession(engine)
    answer(s, "compare me")
    events = list(s.rerun_last(GenerationParams(max_new_tokens=10, spec=SpecParams(enabled=False))))
    assert events[0].reused_tokens > 0
    assert [m["role"] for m in s.messages] == ["user", "assistant"]
    assert s.messages[-1]["content"] == events[-1].result.text


def test_cancel_stops_at_a_round_boundary_and_keeps_the_partial_answer():
    engine = tiny_engine("tiny-qwen3")
    s = ChatSession(engine)
    cancel = threading.Event()
    events = []
    for ev in s.send("tell me a long story", GenerationParams(max_new_tokens=200), cancel):
        events.append(ev)
        if isinstance(ev, RoundEvent) and ev.index == 2:
            cancel.set()
    result = events[-1].result
    assert result.finish_reason == "cancelled"
    assert result.rounds == 3
    assert s.messages[-1] == {"role": "assistant", "content": result.text}
    _, after = answer(s, "go on")  # still usable
    assert after.finish_reason in ("length", "eos")


def test_stop_string_cuts_the_text_and_the_tokens():
    engine = tiny_engine("tiny-qwen3")
    # random weights answer in arbitrary bytes: pick an answer with a printable two-character
    # string that first appears a few characters in, and stop on it
    for seed in range(20):
        prompt = random_prompt(seed, 10)
        engine.reset()
        _, full = run(engine, prompt, max_new_tokens=40)
        text = full.text
        candidates = [text[i:i + 2] for i in range(3, len(text) - 2)
                      if text[i:i + 2].isascii() and text[i:i + 2].isprintable() and text[i:i + 2] not in text[:i + 1]]
        if candidates:
            stop = candidates[0]
            break
    engine.reset()
    _, res = run(engine, prompt, max_new_tokens=40, stop=(stop,))
    assert res.finish_reason == "stop"
    assert res.text == text[: text.index(stop)]
    assert stop in engine.tokenizer.decode(list(res.token_ids))
    assert stop not in engine.tokenizer.decode(list(res.token_ids[:-1]))


def test_max_new_tokens_is_exact():
    engine = tiny_engine("tiny-qwen3")
    with OracleDraft(engine, hf_model("tiny-qwen3"), error_rate=0.2):
        for n in (1, 2, 7, 13):
            engine.reset()
            _, res = run(engine, random_prompt(n, 8), max_new_tokens=n, budget=64)
            assert res.finish_reason == "eos" or (res.new_tokens == n and res.finish_reason == "length")


def test_context_overflow_is_clear_and_nothing_is_lost():
    engine = tiny_engine("tiny-qwen3", max_context=256)
    s = ChatSession(engine)
    answer(s, "short")
    before = [dict(m) for m in s.messages]
    held = s.context_tokens
    with pytest.raises(ContextOverflowError, match="context holds 256; start a new chat or shorten it"):
        list(s.send("x" * 400, PARAMS))
    assert s.messages == before and s.context_tokens == held
    _, ok = answer(s, "fine again")
    assert ok.finish_reason in ("length", "eos")


def test_context_full_during_generation_ends_the_answer_with_a_message():
    engine = tiny_engine("tiny-qwen3", max_context=256)
    prompt = random_prompt(1, 200)
    _, res = run(engine, prompt, max_new_tokens=500, budget=64)
    assert res.finish_reason == "context_full"
    assert res.message == "the context is full (256 tokens); raise --max-context"  # no chat to start afresh
    assert engine.context_tokens <= 256
    assert len(prompt) + res.new_tokens >= 250


def test_a_full_context_in_a_chat_suggests_a_new_chat():
    engine = tiny_engine("tiny-qwen3", max_context=256)
    s = ChatSession(engine)
    events = list(s.send("x" * 150, GenerationParams(max_new_tokens=500, spec=SpecParams(budget=16))))
    res = events[-1].result
    assert res.finish_reason == "context_full"
    assert res.message == "the context is full (256 tokens); start a new chat or raise --max-context"


@pytest.mark.parametrize("spec,match", [
    (SpecParams(budget=0), "budget"), (SpecParams(budget=5000), "budget"), (SpecParams(width=0), "width"),
    (SpecParams(depth=99), "depth"), (SpecParams(tree_algo="nope"), "tree algorithm"),
])
def test_bad_parameters_are_clear_errors_and_leave_the_session_intact(spec, match):
    engine = tiny_engine("tiny-qwen3")
    s = ChatSession(engine)
    answer(s, "hi")
    before, held = [dict(m) for m in s.messages], s.context_tokens
    with pytest.raises(ConfigError, match=match):
        list(s.send("again", GenerationParams(spec=spec)))
    assert s.messages == before and s.context_tokens == held


def test_round_events_describe_the_tree():
    engine = tiny_engine("tiny-qwen3")
    events, res = run(engine, random_prompt(5, 10), max_new_tokens=30, budget=16, width=4)
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    assert len(rounds) == res.rounds
    text = events[0].first_text + "".join(r.new_text for r in rounds)
    assert text == res.text
    for r in rounds:
        n = len(r.tree_tokens)
        assert len(r.tree_texts) == len(r.tree_parents) == len(r.tree_depths) == len(r.tree_scores) == n
        assert r.accepted_nodes[0] == 0 and r.tree_parents[0] == -1
        assert r.accept_length == len(r.new_tokens) == len(r.accepted_nodes) or r is rounds[-1]
        assert r.timings.total_ms >= r.timings.verify_ms > 0
    assert isinstance(events[-1], FinishEvent)


def test_update_spec_applies_from_the_next_round_not_yet_launched():
    """A change made while round 1's event is out applies from the first round launched after
    it: round 2, or round 3 when round 2 was already launched (`round_ahead`)."""
    engine = tiny_engine("tiny-qwen3")
    prompt = random_prompt(4, 10)
    _, reference = run(engine, prompt, max_new_tokens=30, budget=16)
    engine.reset()
    events, ahead = [], None
    for ev in engine.generate(prompt, GenerationParams(max_new_tokens=30, spec=SpecParams(budget=16))):
        events.append(ev)
        if isinstance(ev, RoundEvent) and ev.index == 1:
            ahead = engine.round_ahead
            engine.update_spec(SpecParams(enabled=False))
    assert ahead  # greedy without stop strings: the next round runs while the host handles this one
    first_changed = 1 + 1 + ahead
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    assert all(len(r.tree_tokens) > 1 for r in rounds[:first_changed])
    assert all(len(r.tree_tokens) == 1 for r in rounds[first_changed:])
    assert events[-1].result.token_ids == reference.token_ids
    with pytest.raises(ConfigError):
        engine.update_spec(SpecParams(budget=0))


def test_accepted_nodes_form_a_path_from_the_root():
    engine = tiny_engine("tiny-qwen2")
    with OracleDraft(engine, hf_model("tiny-qwen2"), error_rate=0.4):
        events, _ = run(engine, random_prompt(9, 12), max_new_tokens=40, budget=32, width=4)
    for r in (e for e in events if isinstance(e, RoundEvent)):
        path = r.accepted_nodes
        assert path[0] == 0
        assert all(r.tree_parents[b] == a for a, b in zip(path, path[1:]))
        assert [r.tree_depths[i] for i in path] == list(range(len(path)))

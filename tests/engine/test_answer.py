"""The answer's rules (engine/answer.py), shared by the engine's decode loop and the app's fake
engine: stop tokens, max new tokens, stop strings held back then released or cut, cancel, and
live tree-shape changes taken at a round boundary. No model and no torch: a byte tokenizer."""
import subprocess
import sys
import threading

from jetspec_chat.engine.answer import Answer, LiveSpec
from jetspec_chat.engine.params import GenerationParams, SpecParams

EOS = 256


class ByteTokenizer:
    """One token per UTF-8 byte; EOS is special."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(i for i in ids if i != EOS).decode("utf-8", errors="replace")


def ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def answer(max_new_tokens: int = 100, stop: tuple[str, ...] = ()) -> Answer:
    return Answer(ByteTokenizer(), frozenset({EOS}), GenerationParams(max_new_tokens=max_new_tokens, stop=stop))


def round_(a: Answer, new: list[int]) -> str:
    """One round as both decode loops run it: take what fits, stream its text."""
    return a.add(new[: a.room_for(new)])


def test_the_module_imports_no_torch():
    code = "import sys, jetspec_chat.engine.answer; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_a_stop_token_ends_the_answer_counts_as_kept_and_has_no_text():
    a = answer()
    assert round_(a, ids("ab")) == "ab" and a.finish is None
    new = ids("cd") + [EOS] + ids("xy")  # the round's tokens past the stop token are dropped
    assert a.room_for(new) == 3 and (a.finish, a.stop_token) == ("eos", EOS)
    assert a.add(new[:3]) == "cd"
    assert (a.ids, a.text) == (ids("abcd"), "abcd")


def test_max_new_tokens_is_exact_and_a_stop_token_counts_toward_it():
    a = answer(max_new_tokens=5)
    assert round_(a, ids("a")) == "a"
    assert a.room_for(ids("bcdefg")) == 4 and a.finish == "length"
    assert a.add(ids("bcde")) == "bcde" and a.ids == ids("abcde")
    b = answer(max_new_tokens=3)
    assert b.room_for(ids("ab") + [EOS]) == 3 and b.finish == "eos"  # the stop token is the 3rd
    c = answer(max_new_tokens=2)
    assert c.room_for(ids("ab") + [EOS]) == 2 and c.finish == "length"  # no room left for it


def test_a_stop_string_is_held_back_then_released_when_it_does_not_complete():
    a = answer(stop=("END",))  # text lags by 2 characters
    streamed = [round_(a, ids(t)) for t in ("ab", "cE", "N", "x")]
    assert streamed == ["", "ab", "c", "E"]  # "EN" was held while it could begin "END"
    assert a.finish is None and a.text == "abcE"
    a.finish = "cancelled"  # at a round boundary: the tail comes with the result
    assert a.flush() == "Nx" and a.text == "abcENx"


def test_a_stop_string_cuts_the_text_and_the_tokens():
    a = answer(stop=("END", "!!"))
    assert round_(a, ids("xyE")) == "x"
    assert round_(a, ids("ND and more")) == "y"  # cut at the stop: "E" was never streamed
    assert (a.finish, a.text) == ("stop", "xy")
    assert a.ids == ids("xyEND")  # the tokens up to the one that completed the stop string
    assert a.flush() == ""


def test_the_held_tail_is_released_when_the_answer_ends_otherwise():
    a = answer(max_new_tokens=4, stop=("STOP",))  # holds 3 characters
    assert round_(a, ids("abc")) == ""
    assert round_(a, ids("de")) == "abcd" and a.finish == "length"  # the whole tail, at once
    b = answer(stop=("STOP",))
    assert round_(b, ids("abc")) == ""
    assert round_(b, ids("d") + [EOS]) == "abcd" and b.finish == "eos"


def test_a_split_utf8_character_waits_for_its_last_byte():
    a = answer()
    e = ids("é")
    assert round_(a, ids("a") + e[:1]) == ""  # the round's text waits for the character
    assert round_(a, e[1:]) == "aé" and a.text == "aé"


def test_cancel_is_seen_at_a_round_boundary():
    a = answer()
    cancel = threading.Event()
    assert not a.cancelled(None) and not a.cancelled(cancel) and a.finish is None
    cancel.set()
    assert a.cancelled(cancel) and a.finish == "cancelled"


def test_a_live_spec_change_is_picked_up_at_the_next_round_the_latest_wins():
    live = LiveSpec()
    params = GenerationParams(spec=SpecParams(budget=64))
    live.put(SpecParams(budget=16))  # before the answer: dropped when it starts
    live.clear()
    used = []
    for round_index in range(5):
        params = live.apply(params)  # the top of each round
        used.append(params.spec.budget)
        if round_index == 1:  # during round 1, two changes: the latter applies from round 2
            live.put(SpecParams(budget=8))
            live.put(SpecParams(budget=4))
    assert used == [64, 64, 4, 4, 4]
    assert params.max_new_tokens == GenerationParams().max_new_tokens  # only the spec changes

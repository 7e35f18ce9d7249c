"""gpt-oss's harmony answers stream as `<think>analysis</think>final`, the form the app folds."""
import pytest

from jetspec_chat.engine.answer import Answer
from jetspec_chat.engine.detokenize import IncrementalDecoder, harmony_channel, harmony_text
from jetspec_chat.engine.params import GenerationParams

ANSWER = ("<|channel|>analysis<|message|>User asks if 2<3. Yes.<|end|><|start|>assistant<|channel|>final"
          "<|message|>Yes, **2 < 3**.<|return|>")
SHOWN = "<think>\nUser asks if 2<3. Yes.\n</think>\n\nYes, **2 < 3**."


def test_channels_become_a_thinking_block():
    assert harmony_text(ANSWER, final=True) == SHOWN
    assert harmony_text("<|channel|>final<|message|>Hi<|return|>", final=True) == "Hi"


def test_streamed_text_never_changes_what_was_shown():
    shown = ""
    for k in range(len(ANSWER) + 1):
        text = harmony_text(ANSWER[:k])
        assert text.startswith(shown) and SHOWN.startswith(text), (k, text)
        assert "<|" not in text
        shown = text


class PieceTokenizer:
    """Ids index a list of text pieces, special tokens among them."""

    PIECES = ["<|channel|>", "analysis", "<|message|>", "User asks", " if 2<3.", " Yes.", "<|end|>", "<|start|>",
              "assistant", "final", "Yes, **2", " < 3**.", "<|return|>", "<|call|>", "commentary", "{}"]

    def get_added_vocab(self):
        return {p: i for i, p in enumerate(self.PIECES) if p.startswith("<|")}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(p for p in (self.PIECES[i] for i in ids) if not (skip_special_tokens and p.startswith("<|")))


def test_decoder_rewrites_a_harmony_vocabulary():
    ids = [0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 9, 2, 10, 11, 12]
    dec = IncrementalDecoder(PieceTokenizer())
    assert dec.harmony
    text = "".join(dec.push([i]) for i in ids) + dec.flush()
    assert text == SHOWN


ANALYSIS = [0, 1, 2, 3, 4, 5, 6]  # <|channel|>analysis<|message|>User asks if 2<3. Yes.<|end|>
FINAL = [7, 8, 0, 9, 2, 10, 11]  # <|start|>assistant<|channel|>final<|message|>Yes, **2 < 3**.


def answer_of(ids, round_size=3):
    """Feed ids to an Answer in rounds, as the engine does; returns (answer, text streamed)."""
    answer, text = Answer(PieceTokenizer(), frozenset(), GenerationParams(max_new_tokens=100)), ""
    for k in range(0, len(ids), round_size):
        new = ids[k:k + round_size]
        text += answer.add(new[:answer.room_for(new)])
        if answer.finish:
            break
    return answer, text + ("" if answer.finish else answer.flush())


def test_channel_at_the_end():
    assert harmony_channel("") is None
    assert harmony_channel("<|channel|>analysis<|message|>hmm") == "analysis"
    assert harmony_channel(ANSWER) == "final"


@pytest.mark.parametrize("stop", [6, 12, 13])  # <|end|> of the final message, <|return|>, <|call|>
def test_harmony_stop_rules(stop):
    """The analysis message's <|end|> goes on to the final message; the final message's <|end|>,
    <|return|> and <|call|> end the answer, and nothing after them is taken."""
    answer, text = answer_of(ANALYSIS + FINAL + [stop, 7, 8, 0, 9, 2, 10])
    assert answer.finish == "eos" and answer.stop_token == stop
    assert text == SHOWN and answer.ids == ANALYSIS + FINAL


def test_an_end_on_a_non_final_channel_is_no_stop():
    answer, text = answer_of([0, 14, 2, 15, 6] + FINAL + [12], round_size=4)  # commentary<|message|>{}<|end|>
    assert answer.finish == "eos" and answer.stop_token == 12 and text.endswith("Yes, **2 < 3**.")


def test_earlier_answers_go_back_to_the_template_split():
    """A shown answer is kept as shown (`<think>…</think>final`, what the app folds and saves);
    the next prompt hands it to harmony's chat template as content + thinking, the template's
    own fields (its final channel never sees the think tags)."""
    import types

    from jetspec_chat.engine.detokenize import harmony_history_message
    from jetspec_chat.engine.session import ChatSession

    assert harmony_history_message(SHOWN) == {"role": "assistant", "content": "Yes, **2 < 3**.",
                                              "thinking": "User asks if 2<3. Yes."}
    assert harmony_history_message("Hi") == {"role": "assistant", "content": "Hi"}

    class Recording(PieceTokenizer):
        def apply_chat_template(self, messages, **kw):
            self.seen = messages
            return [0]

    session = ChatSession(types.SimpleNamespace(tokenizer=Recording()))
    session.messages = [{"role": "user", "content": "2<3?"}, {"role": "assistant", "content": SHOWN},
                        {"role": "user", "content": "and 3<2?"}]
    assert session.prompt_ids() == [0]
    assert session.engine.tokenizer.seen[1] == harmony_history_message(SHOWN)
    assert session.messages[1]["content"] == SHOWN  # kept as shown

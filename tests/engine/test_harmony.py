"""gpt-oss's harmony answers stream as `<think>analysis</think>final`, the form the app folds."""
from jetspec_chat.engine.detokenize import IncrementalDecoder, harmony_text

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
              "assistant", "final", "Yes, **2", " < 3**.", "<|return|>"]

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

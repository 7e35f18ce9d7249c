"""Turning token ids into text, incrementally and per token."""
from __future__ import annotations

import re

# gpt-oss's "harmony" answers: messages on channels, `<|channel|>analysis<|message|>...<|end|>`
# (the reasoning) then `<|start|>assistant<|channel|>final<|message|>...` (the answer). Shown as
# the Qwen3 form the app folds: `<think>reasoning</think>answer`.
HARMONY_MARK = "<|channel|>"
_HARMONY_HEADER = re.compile(r"(?:<\|end\|>)?(?:<\|start\|>[^<]*)?<\|channel\|>(\w+)[^<]*<\|message\|>")
_HARMONY_TOKEN = re.compile(r"<\|[a-z_]+\|>")
# The harmony stop rules: `<|return|>` (the answer is done) and `<|call|>` (a tool call) end the
# answer wherever they come; `<|end|>` ends a message, and the answer only when that message is
# on the final channel (after the analysis it is followed by the final message's header).
HARMONY_STOPS = ("<|return|>", "<|call|>")
HARMONY_END = "<|end|>"


def is_harmony(tokenizer) -> bool:
    """Whether the vocabulary speaks harmony (gpt-oss): its channel tokens are added tokens (the
    small added vocabulary, not the whole one)."""
    return HARMONY_MARK in getattr(tokenizer, "get_added_vocab", dict)()


def harmony_history_message(text: str) -> dict:
    """An earlier answer as harmony's chat template takes it back: the shown form
    `<think>\nanalysis\n</think>\n\nfinal` (harmony_text's) as {"content": final, "thinking":
    analysis}, so the template renders the final message and, as it decides, the analysis;
    otherwise the text is the content."""
    m = re.fullmatch(r"<think>\n(.*?)\n</think>\n\n(.*)", text, flags=re.S)
    if m is None:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": m.group(2), "thinking": m.group(1)}


def harmony_channel(raw: str) -> str | None:
    """The channel of the message `raw` (an answer decoded with its special tokens) is in at its
    end: the last whole header's, None before any."""
    last = None
    for last in _HARMONY_HEADER.finditer(raw):
        pass
    return last.group(1) if last else None


def harmony_text(raw: str, final: bool = False) -> str:
    """Display text of a harmony answer decoded with its special tokens: the analysis channel in
    `<think>...</think>`, the final channel after it, every other special token dropped. While
    streaming, an unfinished header at the end is held back (the text so far never changes)."""
    if not final:  # hold back from the first special token after the last whole header
        last = None
        for last in _HARMONY_HEADER.finditer(raw):
            pass
        cut = raw.find("<|", last.end() if last else 0)
        if cut >= 0:
            raw = raw[:cut]
        elif raw.endswith("<"):  # perhaps the start of one
            raw = raw[:-1]
    out, pos, thinking = [], 0, False
    for m in _HARMONY_HEADER.finditer(raw):
        out.append(raw[pos:m.start()])
        if thinking:
            out.append("\n</think>\n\n")
            thinking = False
        if m.group(1) == "analysis":
            out.append("<think>\n")
            thinking = True
        pos = m.end()
    out.append(raw[pos:])
    return _HARMONY_TOKEN.sub("", "".join(out))


class IncrementalDecoder:
    """Streams text for a growing list of ids without re-decoding the whole answer each round.

    Decodes a short window before the unread tail, so merges across token boundaries are
    right, and holds back text that ends in an incomplete UTF-8 character.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        # A harmony vocabulary (gpt-oss): the channel tokens carry the answer's structure, so the
        # whole answer is decoded with them and rewritten (`harmony_text`) each round.
        self.harmony = is_harmony(tokenizer)
        self.shown = 0  # harmony: characters of the rewritten text already returned

    def _harmony_delta(self, final: bool) -> str:
        text = harmony_text(self.tokenizer.decode(self.ids, skip_special_tokens=False), final)
        if text.endswith("\ufffd") and not final:
            return ""
        delta, self.shown = text[self.shown:], max(self.shown, len(text))
        return delta

    def push(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        if self.harmony:
            return self._harmony_delta(final=False)
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        prefix = decode(self.ids[self.prefix_offset : self.read_offset])
        full = decode(self.ids[self.prefix_offset :])
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            return ""  # wait for the rest of a multi-byte character
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return full[len(prefix) :]

    def flush(self) -> str:
        """Text still held back at the end (e.g. a dangling partial character)."""
        if self.harmony:
            return self._harmony_delta(final=True)
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        prefix = decode(self.ids[self.prefix_offset : self.read_offset])
        full = decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix) :] if len(full) > len(prefix) else ""


class TokenTexts:
    """Raw text of single tokens (for the tree view), cached per id."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            if token_id >= self.vocab_size:  # random models may use ids the tokenizer lacks
                text = f"<{token_id}>"
            else:
                text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._cache[token_id] = text
        return text

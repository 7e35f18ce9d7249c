"""Turning token ids into text, incrementally and per token."""
from __future__ import annotations


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

    def push(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
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

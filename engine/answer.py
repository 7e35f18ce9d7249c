"""The answer being generated and the rules that end it, shared by the engine's decode loop
(engine.py) and the app's scripted fake engine (jetspec_chat/ui/fake_engine.py), so the fake
stops, holds back and trims text exactly as the engine does: stop tokens, max new tokens, stop
strings, cancel, and live tree-shape changes taken at a round boundary.

Torch-free: the UI process imports it (through the fake) and must not load torch.
"""
from __future__ import annotations

import threading
from dataclasses import replace

from .detokenize import HARMONY_END, HARMONY_STOPS, IncrementalDecoder, harmony_channel
from .params import GenerationParams, SpecParams


class Answer:
    """The answer's ids and text, and the stop conditions (stop tokens, max new tokens, stop
    strings). A stop token counts toward max_new_tokens (as in transformers) but is kept out of
    `ids` and `text`. With stop strings, the streamed text lags by len(stop) - 1 characters, so
    text that turns out to begin a stop string is never shown. A harmony vocabulary (gpt-oss) adds
    its stop rules (detokenize.HARMONY_STOPS, and `<|end|>` of a final-channel message).

    Per round: `keep = room_for(new)`, then `add(new[:keep])` (the text to stream), and once
    `finish` is set, `flush()` for the held-back tail."""

    def __init__(self, tokenizer, stop_token_ids: frozenset[int], params: GenerationParams):
        self.tokenizer = tokenizer
        self.stop_ids = stop_token_ids
        self.max_new = params.max_new_tokens
        self.stops = tuple(s for s in params.stop if s)
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.decoder = IncrementalDecoder(tokenizer)
        self.harmony_end: int | None = None  # harmony: `<|end|>`, a stop on the final channel only
        if self.decoder.harmony:
            vocab = tokenizer.get_added_vocab()
            self.stop_ids = frozenset(stop_token_ids) | {vocab[s] for s in HARMONY_STOPS if s in vocab}
            self.harmony_end = vocab.get(HARMONY_END)
        self.ids: list[int] = []
        self.decoded = ""  # everything decoded so far
        self.text = ""  # what has been streamed (a prefix of `decoded`, cut at a stop string)
        self.finish: str | None = None  # "eos" | "stop" | "length" | "context_full" | "cancelled"
        self.stop_token: int | None = None

    def room_for(self, new: list[int]) -> int:
        """How many of `new` the answer takes; sets `finish` when it ends inside them."""
        for i, tok in enumerate(new):
            if len(self.ids) + i >= self.max_new:
                self.finish = "length"
                return i
            if tok in self.stop_ids or (tok == self.harmony_end and self._ends_final_message(new[:i])):
                self.finish, self.stop_token = "eos", tok
                return i + 1
        if len(self.ids) + len(new) >= self.max_new:
            self.finish = "length"
        return len(new)

    def add(self, kept: list[int]) -> str:
        """Append tokens already accepted by room_for; returns the text to stream now (with the
        held-back tail when the answer ended here)."""
        if self.finish == "eos" and kept and kept[-1] == self.stop_token:
            kept = kept[:-1]  # the stop token (a harmony `<|end|>` too: other `<|end|>`s stay)
        visible = [t for t in kept if t not in self.stop_ids]
        n_before = len(self.ids)
        self.ids.extend(visible)
        self.decoded += self.decoder.push(visible) if visible else ""
        hits = [self.decoded.index(s) for s in self.stops if s in self.decoded]
        if hits:
            self.decoded = self.decoded[: min(hits)]
            self._trim_tokens_to_stop(n_before)
            self.finish = "stop"
        if self.finish is not None:
            return self._emit(len(self.decoded)) + self.flush()
        return self._emit(len(self.decoded) - self.hold)

    def _ends_final_message(self, pending: list[int]) -> bool:
        """Harmony: whether an `<|end|>` after the answer's ids and `pending` closes a message on
        the final channel."""
        raw = self.tokenizer.decode(self.ids + pending, skip_special_tokens=False)
        return harmony_channel(raw) == "final"

    def cancelled(self, cancel: threading.Event | None) -> bool:
        """At a round boundary: ends the answer when `cancel` is set."""
        if cancel is not None and cancel.is_set():
            self.finish = "cancelled"
        return self.finish == "cancelled"

    def flush(self) -> str:
        """At the end: the held-back tail (and any dangling partial character)."""
        if self.finish != "stop":
            self.decoded += self.decoder.flush()
        return self._emit(len(self.decoded))

    def _emit(self, end: int) -> str:
        new = self.decoded[len(self.text) : max(end, len(self.text))]
        self.text += new
        return new

    def _trim_tokens_to_stop(self, n_before: int) -> None:
        """Keep only the tokens needed to reach the stop string."""
        for k in range(n_before + 1, len(self.ids) + 1):
            decoded = self.tokenizer.decode(self.ids[:k], skip_special_tokens=True)
            if any(s in decoded for s in self.stops):
                del self.ids[k:]
                return


class LiveSpec:
    """A one-slot mailbox for tree-shape changes during an answer: `put` from any thread (the
    latest wins), `apply` at the top of each round. `clear` when an answer starts, so a change
    made from then on (even during the prefill) applies from its first round."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spec: SpecParams | None = None

    def put(self, spec: SpecParams) -> None:
        with self._lock:
            self._spec = spec

    def clear(self) -> None:
        with self._lock:
            self._spec = None

    def apply(self, params: GenerationParams) -> GenerationParams:
        """`params` with the latest change, if one came since the last call."""
        with self._lock:
            spec, self._spec = self._spec, None
        return params if spec is None else replace(params, spec=spec)

"""What the engine reports while it generates. The UI needs nothing else.

A generation yields: one `PrefillEvent`, then one `RoundEvent` per decode round, then one
`FinishEvent`. Events are immutable and hold plain Python values (no tensors), so they can
cross threads freely.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PhaseTimings:
    """Milliseconds spent per phase of one round (wall clock, device synchronized)."""

    draft_ms: float = 0.0  # draft head forward (0 in plain AR mode)
    tree_ms: float = 0.0  # building the tree from the draft log-probs
    verify_ms: float = 0.0  # target forward over all tree nodes
    accept_ms: float = 0.0  # acceptance + KV commit + draft-context update
    host_ms: float = 0.0  # everything else: python bookkeeping, detokenizing
    total_ms: float = 0.0


@dataclass(frozen=True)
class PrefillEvent:
    """The prompt was (partly) prefilled; `first_token` is the first answer token."""

    new_tokens: int  # prompt tokens computed now
    reused_tokens: int  # prompt tokens whose KV was reused from the previous turn
    first_token: int
    first_text: str
    ms: float


@dataclass(frozen=True)
class RoundEvent:
    """One speculative round (or one plain AR step, with a one-node tree).

    Node 0 of the tree is the root: the anchor token, already part of the answer. Nodes are
    in best-first order, so a parent always comes before its children.
    """

    index: int  # round number within this answer, from 0
    tree_tokens: tuple[int, ...]
    tree_texts: tuple[str, ...]  # each node's token as text (raw; the UI makes whitespace visible)
    tree_parents: tuple[int, ...]  # -1 for the root
    tree_depths: tuple[int, ...]
    tree_scores: tuple[float, ...]  # cumulative draft log-prob; 0.0 at the root
    accepted_nodes: tuple[int, ...]  # path from the root (included) to the deepest accepted node
    bonus_token: int  # the target's own token after the accepted path
    new_tokens: tuple[int, ...]  # appended to the answer this round: accepted drafts, then the bonus
    new_text: str  # text those tokens add to the answer (may be "" mid-character)
    timings: PhaseTimings
    answer_tokens: int  # answer length after this round
    context_tokens: int  # tokens in the conversation after this round
    elapsed_s: float  # since the answer started (prefill included)

    @property
    def accept_length(self) -> int:
        """Tokens this round produced, the bonus counted ("tokens per round", tau)."""
        return len(self.new_tokens)


@dataclass(frozen=True)
class GenerationResult:
    text: str
    token_ids: tuple[int, ...]  # the answer's tokens (stop token excluded)
    finish_reason: str  # "eos" | "stop" | "length" | "context_full" | "cancelled"
    rounds: int
    accept_lengths: tuple[int, ...]
    prefill_tokens: int
    reused_tokens: int
    prefill_seconds: float
    decode_seconds: float
    seconds: float  # prefill + decode
    message: str = ""  # user-facing note, e.g. why the context filled up
    stop_token: int | None = None  # the end-of-sequence token that ended the answer, if any

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def decoded_ids(self) -> list[int]:
        """Every token the model produced: the answer, then the stop token if one ended it
        (what a greedy comparison with another decoder must match)."""
        return list(self.token_ids) + ([self.stop_token] if self.stop_token is not None else [])

    @property
    def mean_accept_length(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Decode throughput: tokens produced by rounds over decode time (prefill excluded)."""
        produced = sum(self.accept_lengths)
        return produced / self.decode_seconds if self.decode_seconds > 0 else 0.0


@dataclass(frozen=True)
class FinishEvent:
    """The answer ended. `result.text` is authoritative: after a cancel it may extend the
    streamed text by a short held-back tail (text held while it could begin a stop string)."""

    result: GenerationResult


Event = PrefillEvent | RoundEvent | FinishEvent

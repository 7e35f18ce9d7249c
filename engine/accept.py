"""Acceptance: which tree path the target keeps, and its own next (bonus) token.

Greedy: a node is accepted if its token is the target's argmax at its parent and its parent
is accepted. Sampling ("sample-and-match"): draw one target sample per node from the
processed distribution and follow the child whose token matches it; when none matches, the
sample itself is the bonus token. The tree was built without looking at those samples, so each
emitted token is distributed exactly as the target's: lossless.

Siblings carry distinct tokens (per-depth top-K), so at most one child of a node can match
and the accepted set is a single path.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .params import SamplingParams
from .tree import Tree


def processed_probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p, on fp32 logits [N, V] -> probabilities [N, V]."""
    logits = logits.float() / sampling.temperature
    if sampling.top_k > 0 and sampling.top_k < logits.shape[-1]:
        kth = logits.topk(sampling.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token if the mass before it already reaches top_p (the top token always stays).
        drop_sorted = probs.cumsum(-1) - probs >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def target_choices(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """The target's token at every node: argmax (greedy) or one sample each. [N] int64."""
    if sampling.greedy:
        return logits.argmax(dim=-1)
    probs = processed_probs(logits, sampling)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@dataclass
class Acceptance:
    """Fixed shapes, no host sync: `path[d]` is the accepted node at depth d for d < count
    (entries past count point at the root and are ignored)."""

    path: torch.Tensor  # [tree.max_depth + 1] node indices
    count: torch.Tensor  # 0-d: accepted nodes including the root = tokens this round, bonus counted
    bonus: torch.Tensor  # 0-d: the target's token after the path


def accept(tree: Tree, choices: torch.Tensor) -> Acceptance:
    """Longest accepted path given the target's choice at every node (vectorized, no loop)."""
    parent_choice = choices[tree.parents.clamp(min=0)]
    match = (tree.tokens == parent_choice) | (tree.parents < 0)
    # Accepted iff every ancestor-or-self matches.
    accepted = ~(tree.ancestors & ~match[None, :]).any(dim=1)
    best = torch.argmax(torch.where(accepted, tree.depths, -1))
    levels = torch.arange(tree.max_depth + 1, device=choices.device)
    on_path = tree.ancestors[best][None, :] & (tree.depths[None, :] == levels[:, None])  # [D+1, N]
    return Acceptance(path=on_path.int().argmax(dim=1), count=tree.depths[best] + 1, bonus=choices[best])

"""Draft trees from per-depth draft log-probs, built with fixed shapes (no host heap).

The draft head gives one distribution per depth (the same for every node at that depth).
`accum_logp` keeps the `budget` best nodes (root included) by cumulative log-prob. Since a
child never scores above its parent, that set is prefix-closed, so per depth it suffices to
keep the best M = budget - 1 candidates among the children of the previous depth's M, then
take the global best M over all depths. Nodes come out best-first (stable sort, shallower
first on ties), which is also a topological order: every parent precedes its children. The
exact order, ties included, is defined by `kernels.reference.accum_tree_ref`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from ..kernels import accum_tree, ancestor_mask_ref

ADAPTIVE_MIN_RATIO = 0.05  # adaptive: drop candidates under 5% of the depth's top-1 probability


@dataclass
class Tree:
    tokens: torch.Tensor  # [N] int64; node 0 is the root (anchor)
    parents: torch.Tensor  # [N] int64; -1 for the root
    depths: torch.Tensor  # [N] int64
    scores: torch.Tensor  # [N] fp32 cumulative draft log-prob; 0 at the root
    ancestors: torch.Tensor  # [N, N] bool: ancestors[i, j] iff j is i or an ancestor of i
    max_depth: int  # static bound on depths (what the tree was built for)

    @property
    def size(self) -> int:
        return self.tokens.shape[0]


def static_tree_size(budget: int, width: int, depth: int) -> int:
    """Node count of an accum_logp tree: fixed by (budget, width, depth) alone."""
    m = budget - 1
    total, level = 1, 1
    for _ in range(depth):
        level = min(level * width, m)
        total += level
        if total >= budget:
            return budget
    return total


def fixed_tree_width(algo: str, width: int, vocab: int) -> int:
    """The per-depth top-k a FIXED_SHAPE_ALGOS builder takes: 1 for `chain`, else the width
    (at most the vocabulary)."""
    return 1 if algo == "chain" else min(width, vocab)


def fixed_tree_size(algo: str, budget: int, width: int, depth: int, vocab: int) -> int:
    """Node count of the tree a FIXED_SHAPE_ALGOS builder returns for these arguments (known
    before building it: the draft graph picks its verify bucket from it)."""
    return static_tree_size(budget, fixed_tree_width(algo, width, vocab), depth) if depth > 0 else 1


def ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """[N, N] ancestor-or-self mask from parent pointers, with fixed shapes and no host values
    (safe inside a CUDA graph)."""
    return ancestor_mask_ref(parents, max_depth)


def build_accum_logp(root: torch.Tensor, logp: torch.Tensor, budget: int, width: int) -> Tree:
    """Best-first tree: the `budget` nodes (root included) of highest cumulative log-prob.

    root: 0-d token id; logp: [D, V] fp32 log-probs for depths 1..D. One topk over the vocab,
    then `build_accum_top`.
    """
    top_lp, top_tok = logp.topk(min(width, logp.shape[1]), dim=-1)  # [D, K], each row descending
    return build_accum_top(root, top_lp, top_tok, budget)


def build_accum_top(root: torch.Tensor, top_lp: torch.Tensor, top_tok: torch.Tensor, budget: int) -> Tree:
    """`build_accum_logp` from each depth's top-K already taken: top_lp [D, K] fp32 log-probs,
    each row descending, and their token ids top_tok [D, K] (the draft graph's
    `top_log_probs`). `accum_tree` (one Triton launch on CUDA; ~2 ops per depth elsewhere),
    whose docstring (kernels/reference.py) defines the node order, ties included."""
    depth, width = top_lp.shape
    n = static_tree_size(budget, width, depth)
    if n == 1 or depth == 0:
        return root_only(root)
    tokens, parents, depths, scores, ancestors = accum_tree(top_lp, top_tok, root, n)
    return Tree(tokens=tokens, parents=parents, depths=depths, scores=scores, ancestors=ancestors, max_depth=depth)


def build_chain(root: torch.Tensor, logp: torch.Tensor, budget: int, width: int) -> Tree:
    """The linear DFlash-style block: the top-1 token at each depth (width ignored)."""
    return build_accum_logp(root, logp, budget, 1)


def build_adaptive(root: torch.Tensor, logp: torch.Tensor, budget: int, width: int) -> Tree:
    """accum_logp whose per-depth fanout shrinks where the draft is confident: a candidate is
    kept only if its probability is at least ADAPTIVE_MIN_RATIO of that depth's top-1. Confident
    depths thus cost one node instead of `width`, and the tree ends up smaller than the budget
    when nothing else is plausible (a cheaper verify)."""
    top1 = logp.max(dim=-1, keepdim=True).values
    pruned = logp.masked_fill(logp < top1 + math.log(ADAPTIVE_MIN_RATIO), float("-inf"))
    tree = build_accum_logp(root, pruned, budget, width)
    valid = torch.isfinite(tree.scores)
    n = int(valid.sum())  # invalid (pruned) nodes sort last and never parent a valid node
    if n == tree.size:
        return tree
    return Tree(tree.tokens[:n], tree.parents[:n], tree.depths[:n], tree.scores[:n], tree.ancestors[:n, :n], tree.max_depth)


def root_only(root: torch.Tensor) -> Tree:
    """A one-node tree: plain autoregressive decoding through the same verify path."""
    device = root.device
    return Tree(
        tokens=root.reshape(1).long(),
        parents=torch.full((1,), -1, dtype=torch.long, device=device),
        depths=torch.zeros(1, dtype=torch.long, device=device),
        scores=torch.zeros(1, device=device),
        ancestors=torch.ones(1, 1, dtype=torch.bool, device=device),
        max_depth=0,
    )


# Built with fixed shapes from (budget, width, depth) alone, so they can live in a CUDA graph;
# `adaptive` trims its tree to a data-dependent size.
FIXED_SHAPE_ALGOS = frozenset({"accum_logp", "chain"})

TreeBuilder = Callable[[torch.Tensor, torch.Tensor, int, int], Tree]

TREE_BUILDERS: dict[str, TreeBuilder] = {
    "accum_logp": build_accum_logp,
    "chain": build_chain,
    "adaptive": build_adaptive,
}

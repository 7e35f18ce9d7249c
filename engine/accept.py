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
from typing import Callable

import torch

from ..kernels import accept_pack_triton, argmax_rows, triton_accepts
from .kv_cache import PagedKVCache
from .params import SamplingParams
from .sampling import sample, uniforms
from .tree import Tree


def target_choices(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """The target's token at every node: argmax (greedy) or one sample each (sampling.sample,
    one uniform per node from `generator`). [N] int64."""
    if sampling.greedy:
        return argmax_rows(logits)
    u = uniforms(logits.shape[0], generator, logits.device)
    return sample(logits, sampling.temperature, sampling.top_p, sampling.top_k, u)


@dataclass
class Acceptance:
    """Fixed shapes, no host sync: `path[d]` is the accepted node at depth d for d < count
    (entries past count point at the root and are ignored)."""

    path: torch.Tensor  # [path_len] node indices
    count: torch.Tensor  # 0-d: accepted nodes including the root = tokens this round, bonus counted
    bonus: torch.Tensor  # 0-d: the target's token after the path


def accept(
    tree: Tree, choices: torch.Tensor, size: int | torch.Tensor | None = None, path_len: int | None = None
) -> Acceptance:
    """Longest accepted path given the target's choice at every node (vectorized, no loop, no
    host sync: safe inside a CUDA graph).

    size: real nodes (a 0-d device tensor in a graph); nodes at index >= size are bucket padding
    and are never accepted. path_len: the path's fixed length (default tree.max_depth + 1); it
    must exceed the depth of every real node.
    """
    device = choices.device
    path_len = tree.max_depth + 1 if path_len is None else path_len
    parent_choice = choices[tree.parents.clamp(min=0)]
    match = (tree.tokens == parent_choice) | (tree.parents < 0)
    # Accepted iff every ancestor-or-self matches.
    accepted = ~(tree.ancestors & ~match[None, :]).any(dim=1)
    if size is not None:
        accepted = accepted & (torch.arange(tree.size, device=device) < size)
    # Index with a 1-element tensor, never a 0-d one: torch reads a 0-d index on the host (.item()).
    best = torch.where(accepted, tree.depths, -1).argmax(dim=0, keepdim=True)  # [1]
    levels = torch.arange(path_len, device=device)
    on_path = tree.ancestors[best] & (tree.depths[None, :] == levels[:, None])  # [path_len, N]
    return Acceptance(path=on_path.int().argmax(dim=1), count=tree.depths[best][0] + 1, bonus=choices[best][0])


@dataclass
class PackedRound:
    """What finish_round leaves on the device for the round's single device->host copy."""

    ints: torch.Tensor  # [2 + P + 4N]: count, bonus, path[P], tokens[N], parents[N], depths[N], scores[N] (fp32 bits)
    path_len: int  # P


def pack_round(tree: Tree, acc: Acceptance) -> torch.Tensor:
    """PackedRound.ints of an accepted tree: int32 [count, bonus, path[P], tokens[N], parents[N],
    depths[N]], then the scores' float32 bits (what unpack_round reads)."""
    ints = torch.cat([acc.count[None], acc.bonus[None], acc.path, tree.tokens, tree.parents, tree.depths]).int()
    return torch.cat([ints, tree.scores.float().view(torch.int32)])


def accept_and_pack(
    tree: Tree, choices: torch.Tensor, size: int | torch.Tensor | None = None, path_len: int | None = None
) -> tuple[Acceptance, torch.Tensor]:
    """`accept` and `pack_round` together: one Triton launch on CUDA (kernels/accept.py, the same
    values bit for bit; count and bonus are 0-d views of its int64 output), the torch code
    elsewhere."""
    path_len = tree.max_depth + 1 if path_len is None else path_len
    if triton_accepts(choices, tree.size):
        head, packed = accept_pack_triton(
            tree.tokens, tree.parents, tree.depths, tree.ancestors, tree.scores, choices, size, path_len
        )
        return Acceptance(path=head[2:], count=head[0], bonus=head[1]), packed
    acc = accept(tree, choices, size, path_len)
    return acc, pack_round(tree, acc)


# append(taps of the path's P nodes [P, taps * hidden], accepted count (0-d)): DraftHead.append_accepted
# on the engine's draft cache, or for a graphed AR round the hold of its row (DraftKVCache.hold).
DraftAppend = Callable[[torch.Tensor, torch.Tensor], None]


def finish_round(
    tree: Tree,
    choices: torch.Tensor,
    kv: PagedKVCache,
    taps: torch.Tensor | None,
    anchor: torch.Tensor,
    draft_append: DraftAppend | None = None,
    size: int | torch.Tensor | None = None,
    path_len: int | None = None,
) -> PackedRound:
    """Everything after the target's choices at the tree nodes: accept, commit the accepted
    nodes' K/V rows down to the committed length, append their taps to the draft context,
    advance the committed length, pack the round's integers, and set the next round's anchor
    (the bonus token). Fixed shapes and device ops only: the CUDA greedy path captures it in
    the verify graph (on a bucket-padded tree, `size` real nodes); the eager paths call the same
    code on the exact tree.

    The tree was verified after `kv.device_length` committed tokens; that length (and the draft
    cache's, through `draft_append`) is advanced here on the device, and the host follows from
    the packed count (TrackedLength.note_advance). anchor: the 0-d device scalar the next
    round's draft and root read.
    """
    acc, packed = accept_and_pack(tree, choices, size, path_len)
    p = acc.path.shape[0]
    base = kv.device_length
    # Rows past the path copy the root into positions past the new length: scratch. A path of one
    # (an AR round's) is the root, whose row the forward wrote in place.
    if p > 1:
        kv.move_rows(base + acc.path, base + torch.arange(p, device=choices.device))
    if getattr(kv, "recurrent", False):  # HybridCache: the state moves to the deepest accepted node's
        kv.commit_path(acc.path, acc.count)
    if draft_append is not None:
        # rows past count: the root's taps, never read; a one-node tree's path is its root (no gather)
        draft_append(taps if taps.shape[0] == 1 else taps[acc.path], acc.count)
    kv.device_length.add_(acc.count)  # after every use of base (the same tensor)
    anchor.copy_(acc.bonus)  # last: a root-only tree's token is a view of the anchor
    return PackedRound(packed, p)


@dataclass
class RoundInts:
    """finish_round's packed integers, read on the host (real nodes only)."""

    count: int
    bonus: int
    path: list[int]
    tokens: list[int]
    parents: list[int]
    depths: list[int]
    scores: list[float]


def unpack_round(packed: torch.Tensor, path_len: int, size: int) -> RoundInts:
    """The host side of finish_round's packing: `packed` is PackedRound.ints on the CPU, `size`
    the tree's real node count (the packed tree may be padded to a bucket)."""
    padded = (packed.shape[0] - 2 - path_len) // 4
    head = packed[: 2 + path_len].tolist()
    count = head[0]
    t = 2 + path_len  # tokens, parents, depths, scores: `padded` entries each
    return RoundInts(
        count=count,
        bonus=head[1],
        path=head[2 : 2 + count],
        tokens=packed[t : t + size].tolist(),
        parents=packed[t + padded : t + padded + size].tolist(),
        depths=packed[t + 2 * padded : t + 2 * padded + size].tolist(),
        scores=packed[t + 3 * padded : t + 3 * padded + size].view(torch.float32).tolist(),
    )

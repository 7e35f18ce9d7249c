"""Greedy/sample-and-match acceptance and the round's integer packing in one Triton launch.

Contract: engine/accept.py's `accept` followed by `pack_round` (the torch code, which stays the
CPU path and the oracle), reproduced bit for bit: from the tree's tokens, parents (-1 at the
root), depths, ancestor-or-self mask and scores, and the target's choice at every node,

- match[j] = tokens[j] == choices[max(parents[j], 0)] or parents[j] < 0;
- accepted[i] = i < size and no j with ancestors[i, j] has not match[j];
- best = the FIRST index of the maximum of where(accepted, depths, -1) (torch's argmax);
- path[l] = the first j with ancestors[best, j] and depths[j] == l, else 0 (l < path_len);
- count = depths[best] + 1, bonus = choices[best];
- packed = int32 [count, bonus, path[P], tokens[N], parents[N], depths[N]] (int64 values
  truncated as `.int()` does), then scores' float32 bits.

Why: issued from torch these are ~25 launches of 1-3 us each, every one a serial step of the
verify graph (the AR step's too: a one-node tree); here one program does them back to back.
It walks the ancestor mask ROWS rows at a time (never [N, N] at once, N <= MAX_NODES) and keeps
the running best (depth, index) as two scalars, so the first index of the maximum wins as in
torch. Fixed shapes, no host sync (`size` may be a 0-d device tensor): safe inside a CUDA graph.
"""
from __future__ import annotations

import torch

from .launch import launch_args, wait_for_previous

try:  # triton is optional: CPU-only installs use the torch code (engine/accept.py).
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None

KERNELS = ("_accept_pack_kernel",)
MAX_NODES = 1024  # the widest tree the kernel takes
TILE = 4096  # mask cells a program holds at once (rows of the ancestor mask, or levels of the path)

if triton is not None:

    @triton.jit
    def _accept_pack_kernel(
        TOKENS, PARENTS, DEPTHS, SCORES, CHOICES,  # [N] int64 x3, [N] fp32, [N] int64
        ANC, anc_s0, anc_s1,  # [N, N] bool as uint8, its strides
        SIZE, size_value,  # real nodes: a 0-d device tensor (SIZE_IN_MEMORY) or the value
        HEAD, PACKED,  # out: [2 + P] int64 (count, bonus, path), [2 + P + 4N] int32
        n, path_len,
        NP: tl.constexpr, ROWS: tl.constexpr, LEVELS: tl.constexpr,
        SIZE_IN_MEMORY: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_for_previous(PDL)
        NONE: tl.constexpr = -(2**63)  # the key of rows past n: below every depth
        j = tl.arange(0, NP)
        real = j < n
        tokens = tl.load(TOKENS + j, mask=real, other=0)
        parents = tl.load(PARENTS + j, mask=real, other=0)
        depths = tl.load(DEPTHS + j, mask=real, other=-1)
        parent_choice = tl.load(CHOICES + tl.maximum(parents, 0), mask=real & (parents < n), other=0)  # never out of bounds
        mismatch = (tokens != parent_choice) & (parents >= 0) & real
        if SIZE_IN_MEMORY:
            size = tl.load(SIZE)
        else:  # an int (Triton passes a 1 as a constant: no tensor methods on it)
            size = size_value
        # Accepted rows, ROWS at a time; best = first index of the largest accepted depth.
        best_depth = tl.sum(depths * 0, 0) + NONE
        best = tl.sum(j * 0, 0)
        r = tl.arange(0, ROWS)
        for r0 in range(0, n, ROWS):
            i = r0 + r
            row_real = i < n
            cells = ANC + i.to(tl.int64)[:, None] * anc_s0 + j.to(tl.int64)[None, :] * anc_s1
            anc = tl.load(cells, mask=row_real[:, None] & real[None, :], other=0)
            rejected = tl.max(((anc != 0) & mismatch[None, :]).to(tl.int32), 1) > 0
            accepted = (~rejected) & (i < size) & row_real
            row_depths = tl.load(DEPTHS + i, mask=row_real, other=0)
            key = tl.where(accepted, row_depths, -1)
            key = tl.where(row_real, key, NONE)  # a block starts below n: a real row ties or beats it
            top = tl.max(key, 0)
            first = tl.min(tl.where(key == top, i, NP), 0)
            better = top > best_depth  # strict: an earlier block keeps a tie
            best = tl.where(better, first, best)
            best_depth = tl.where(better, top, best_depth)
        count = tl.load(DEPTHS + best) + 1
        bonus = tl.load(CHOICES + best)
        tl.store(HEAD, count)
        tl.store(HEAD + 1, bonus)
        tl.store(PACKED, count.to(tl.int32))
        tl.store(PACKED + 1, bonus.to(tl.int32))
        # path[l]: the first node on best's ancestor row at depth l, else 0; LEVELS levels at a time.
        on_row = tl.load(ANC + best.to(tl.int64) * anc_s0 + j.to(tl.int64) * anc_s1, mask=real, other=0) != 0
        on_row = on_row & real
        lv = tl.arange(0, LEVELS)
        for l0 in range(0, path_len, LEVELS):
            level = l0 + lv
            hit = on_row[None, :] & (depths[None, :] == level.to(tl.int64)[:, None])
            first = tl.min(tl.where(hit, j[None, :], NP), 1)
            node = tl.where(first == NP, 0, first)
            inside = level < path_len
            tl.store(HEAD + 2 + level, node.to(tl.int64), mask=inside)
            tl.store(PACKED + 2 + level, node, mask=inside)
        # The tree's tensors, as int32 (scores: their float32 bits).
        out = PACKED + 2 + path_len + j
        tl.store(out, tokens.to(tl.int32), mask=real)
        tl.store(out + n, parents.to(tl.int32), mask=real)
        tl.store(out + 2 * n, depths.to(tl.int32), mask=real)
        scores = tl.load(SCORES + j, mask=real, other=0.0)
        tl.store(out + 3 * n, scores.to(tl.int32, bitcast=True), mask=real)


def _pow2(x: int) -> int:
    return 1 << max(1, x - 1).bit_length()  # at least 2 (tl.arange)


def accept_pack_triton(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depths: torch.Tensor,
    ancestors: torch.Tensor,
    scores: torch.Tensor,
    choices: torch.Tensor,
    size: int | torch.Tensor | None,
    path_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One launch of the module's contract. Returns (head [2 + P] int64: count, bonus, path;
    packed [2 + P + 4N] int32). size: real nodes (None: all N), a python int or a 0-d device
    tensor. Fixed shapes, no host sync."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    n = tokens.shape[0]
    assert 1 <= n <= MAX_NODES, f"trees of 1..{MAX_NODES} nodes, got {n}"
    assert path_len >= 1
    for name, t in (("tokens", tokens), ("parents", parents), ("depths", depths), ("choices", choices)):
        assert t.dtype == torch.long and t.shape == (n,) and t.stride(0) == 1, (name, t.dtype, t.shape, t.stride())
    assert scores.dtype == torch.float32 and scores.shape == (n,) and scores.stride(0) == 1, (scores.dtype, scores.shape)
    assert ancestors.dtype == torch.bool and ancestors.shape == (n, n), (ancestors.dtype, ancestors.shape)
    device = tokens.device
    head = torch.empty(2 + path_len, dtype=torch.long, device=device)
    packed = torch.empty(2 + path_len + 4 * n, dtype=torch.int32, device=device)
    in_memory = isinstance(size, torch.Tensor)
    np_ = _pow2(n)
    _accept_pack_kernel[(1,)](
        tokens, parents, depths, scores, choices,
        ancestors.view(torch.uint8), ancestors.stride(0), ancestors.stride(1),
        size if in_memory else tokens, n if size is None or in_memory else int(size),
        head, packed, n, path_len,
        NP=np_, ROWS=max(1, min(np_, TILE // np_)), LEVELS=max(1, min(_pow2(path_len), TILE // np_)),
        SIZE_IN_MEMORY=in_memory, num_warps=4 if np_ <= 256 else 8, **launch_args(device, 1),
    )
    return head, packed


def triton_accepts(choices: torch.Tensor, n: int) -> bool:
    """Whether the kernel runs for a tree of n nodes whose choices are `choices`: a CUDA tensor,
    Triton installed, n <= MAX_NODES."""
    return choices.is_cuda and triton is not None and n <= MAX_NODES

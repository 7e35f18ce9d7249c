"""The fixed-shape best-first draft tree in one Triton launch (one program).

Contract and node order: `accum_tree_ref` (kernels/reference.py), reproduced bit for bit.
Issued from torch the build is ~2 ops per depth plus ~30; inside the draft's CUDA graph each
costs a launch (~3-5 us), so one program that runs every depth back to back pays.

Per depth the program scores the candidates that can reach the frontier at all, the pairs
(slot i, rank k) with (i+1)(k+1) <= M (about M * ln K of the M * K), and keeps the best M
with a bitonic top-k on int64 keys that hold the score's bits (order-preserving) above the
candidate's flat index (reversed): a unique key per candidate makes the order (score
descending, index ascending) exactly the reference's stable sort. Frontiers go to a global
scratch row, read back after a barrier for the next depth's parent scores. Then a top-M over
all frontier rows (keys re-tagged with depth and slot) gives the tree, and the nodes' tokens,
parents and ancestor mask come from walking parents up the frontier rows.
"""
from __future__ import annotations

import torch

from .launch import launch_args, wait_for_previous
from .reference import accum_tree_ref

try:  # triton is optional: CPU-only installs use the torch reference.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None

KERNELS = ("_accum_tree_kernel",)
SELECT_TILE = 4096  # keys per top-k of the final selection (register budget)

if triton is not None:
    from .sort_keys import key_index, key_value, sort_key

    @triton.jit
    def _accum_tree_kernel(
        TOP_LP, TOP_TOK, ROOT,  # [D, K] fp32, [D, K] int64, 0-d int64
        TOKENS, PARENTS, DEPTHS, SCORES, ANC,  # [n] int64 x3, [n] fp32, [n, n] uint8
        FRONT, NODE_OF,  # scratch: [D, MP] int64 frontier keys, [D * MP] int32 node of grid entry
        depth, m, n_cand,  # runtime: D, M = n - 1, number of candidates (i+1)(k+1) <= M
        K: tl.constexpr, MP: tl.constexpr, CP: tl.constexpr, RP: tl.constexpr, FILL: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_for_previous(PDL)
        NONE: tl.constexpr = -(2**63)  # below every real key (-inf included)
        n = m + 1
        # Candidate lanes, column by column: column k holds slots 0 .. M // (k+1) - 1.
        c = tl.arange(0, CP)
        col = tl.zeros([CP], dtype=tl.int32)
        col_start = tl.zeros([CP], dtype=tl.int32)
        start = m * 0
        for j in tl.static_range(1, K):
            start += m // j  # column j-1 has M // j lanes
            inside = c >= start
            col = tl.where(inside, j, col)
            col_start = tl.where(inside, start, col_start)
        slot = c - col_start
        valid = c < n_cand
        jj = tl.arange(0, MP)
        for d in range(depth):
            if d == 0:  # depth 1: slot 0 is the root (score 0), the other slots -inf padding
                prev = tl.where(slot == 0, 0.0, float("-inf"))
            else:
                prev = key_value(tl.load(FRONT + (d - 1) * MP + slot, mask=valid, other=0))
            lp = tl.load(TOP_LP + d * K + col, mask=valid, other=0.0)
            keys = tl.where(valid, sort_key(prev + lp, slot * K + col), NONE)
            front = tl.topk(keys, MP)  # descending; entries from M on are not in the frontier
            tl.store(FRONT + d * MP + jj, front)
            tl.debug_barrier()  # this depth's frontier row is read by every thread next
        # The tree: the best M frontier entries of all depths, RP depth rows at a time, keys
        # re-tagged with the entry's grid index (depth-major: shallower first on ties).
        best = tl.full([MP], NONE, dtype=tl.int64)
        rr = tl.arange(0, RP)[:, None]
        cols = jj[None, :]
        for d0 in range(0, depth, RP):
            grid = (d0 + rr) * MP + cols
            ok = (d0 + rr < depth) & (cols < m)
            key = tl.load(FRONT + grid, mask=ok, other=0)
            key = tl.where(ok, ((key >> 32) << 32) | (0x7FFFFFFF - grid).to(tl.int64), NONE)
            top = tl.topk(tl.reshape(key, [RP * MP]), MP)
            best = tl.topk(tl.reshape(tl.join(best, top), [2 * MP]), MP)
        # Nodes 1..M are best[0..M-1]: grid entry g = depth_row * MP + slot.
        node = jj + 1
        sel = jj < m
        g = key_index(best)
        row = g // MP
        key = tl.load(FRONT + g, mask=sel, other=0)
        flat = key_index(key)
        pslot, rank = flat // K, flat % K
        tl.store(NODE_OF + g, node, mask=sel)
        tl.store(TOKENS + node, tl.load(TOP_TOK + row * K + rank, mask=sel, other=0), mask=sel)
        tl.store(SCORES + node, key_value(best), mask=sel)
        tl.store(DEPTHS + node, row + 1, mask=sel)
        tl.store(TOKENS, tl.load(ROOT))
        tl.store(PARENTS, -1)
        tl.store(DEPTHS, 0)
        tl.store(SCORES, 0.0)
        # Ancestor mask: zero it, then set self, the root and each ancestor (walking up).
        for off in range(0, n * n, FILL):
            cells = off + tl.arange(0, FILL)
            tl.store(ANC + cells, tl.zeros([FILL], dtype=tl.uint8), mask=cells < n * n)
        tl.debug_barrier()  # NODE_OF and the zeros are visible to every thread
        anc_row = ANC + node.to(tl.int64) * n
        tl.store(ANC, 1)
        tl.store(anc_row + node, 1, mask=sel)
        tl.store(anc_row, 1, mask=sel)
        up = sel & (row > 0)  # this entry's parent is a frontier entry (not the root)
        parent = tl.load(NODE_OF + (row - 1) * MP + pslot, mask=up, other=0)
        tl.store(PARENTS + node, parent, mask=sel)
        for _ in range(depth - 1):
            tl.store(anc_row + parent, 1, mask=up)
            key = tl.load(FRONT + (row - 1) * MP + pslot, mask=up, other=0)
            pslot = key_index(key) // K
            row = row - 1
            up = up & (row > 0)
            parent = tl.load(NODE_OF + (row - 1) * MP + pslot, mask=up, other=0)


def _pow2(x: int) -> int:
    return 1 << max(1, x - 1).bit_length()


def _warps(cp: int) -> int:
    # The program is one CTA: more warps hide the latency of the top-k's exchange rounds and
    # keep the widest shapes (budget 1024) in registers.
    return 4 if cp <= 256 else 8 if cp <= 1024 else 16


def accum_tree_triton(
    top_lp: torch.Tensor, top_tok: torch.Tensor, root: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton `accum_tree_ref` (same contract, same output bit for bit): one launch, fixed
    shapes, no host sync."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    depth, k = top_lp.shape
    m = n - 1
    assert m >= 1 and top_tok.shape == (depth, k) and top_lp.dtype == torch.float32
    top_lp, top_tok = top_lp.contiguous(), top_tok.contiguous().long()
    n_cand = sum(m // (j + 1) for j in range(k))
    mp = _pow2(m)
    cp = max(mp, _pow2(n_cand))
    rp = max(1, min(_pow2(depth), SELECT_TILE // mp))
    device = top_lp.device
    tokens = torch.empty(n, dtype=torch.long, device=device)
    parents = torch.empty(n, dtype=torch.long, device=device)
    depths = torch.empty(n, dtype=torch.long, device=device)
    scores = torch.empty(n, dtype=torch.float32, device=device)
    ancestors = torch.empty(n, n, dtype=torch.bool, device=device)
    front = torch.empty(depth, mp, dtype=torch.long, device=device)
    node_of = torch.empty(depth * mp, dtype=torch.int32, device=device)
    _accum_tree_kernel[(1,)](
        top_lp, top_tok, root, tokens, parents, depths, scores, ancestors.view(torch.uint8), front, node_of,
        depth, m, n_cand, K=k, MP=mp, CP=cp, RP=rp, FILL=8192, num_warps=_warps(cp), enable_fp_fusion=False,
        **launch_args(device, 1),
    )
    return tokens, parents, depths, scores, ancestors


def accum_tree(
    top_lp: torch.Tensor, top_tok: torch.Tensor, root: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The best-first draft tree (`accum_tree_ref`): one Triton launch on CUDA, the torch
    reference elsewhere."""
    if top_lp.is_cuda and triton is not None:
        return accum_tree_triton(top_lp, top_tok, root, n)
    return accum_tree_ref(top_lp, top_tok, root, n)

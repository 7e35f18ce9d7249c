"""The Gated DeltaNet recurrence over a token tree, in one launch per linear layer, without the host.

A tree of T nodes (topological order: every ancestor before its node) follows the committed
state S [H, dk, dv] (fp32). Node i's state is its parent's updated by its own token (the gated
delta rule, kernels/reference.py: delta_step_ref), its output o_i = S_iᵀ q_i.

Kernel: one program per (lane, value head, block of BV value columns). A lane is a leaf of the
tree: it loads the committed state's [dk, BV] tile into registers, walks the leaf's
ancestors-or-self root first (`TreeWalk`: the leaf's row of the attention's `visible_keys`,
i.e. its path) and applies each node's update; each node's output is written by one lane (its
owner, the lowest-index leaf below it). A node on several leaves' paths is updated by each of
them with the same operations on the same operands, so every lane holds the same bits. No per-node state is ever stored: the cost is the sum of the leaves' depths in updates
(at most T × depth) and one read of the committed tile per lane (L2-resident: 2 MB a layer at
Qwen3.6-35B-A3B's shape), against one state per node (T × 2 MB a layer written and read back)
or a depth-first order that the tree's best-first numbering does not give without a sort.

The commit is the same kernel on one lane walking the accepted path, writing the walked state
instead of outputs: the committed state is bitwise the state the accepted nodes were verified
with. Batch invariance: a node's output depends only on its own path's operands and the fixed
tile shape, never on T or the tree's other nodes, so an AR step (T = 1) from the committed state
gives the bits a tree node gives after the same path (fp fusion off, as in fused.py).

The grid is (T, H, dv / BV) for every tree of a size: non-leaf programs return at once, so a
CUDA graph of one tree-size bucket serves every tree shape. Leaves and paths come from the
tree's ancestor mask on the device (`tree_walk`), the commit's path and count from the accept.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .launch import launch_args, triton, tl, wait_for_previous
from .reference import gated_delta_path_ref, gated_delta_tree_ref
from .tree_attention import VisibleKeys, visible_keys

BLOCK_V = 32  # value columns per program: a [dk, 32] fp32 tile (16 KB at dk = 128) in registers
WARPS = 4  # per program (79 registers a thread at dk = 128, no spills: tests/kernels/sm90_gated_delta_compile.py)


class TreeWalk(NamedTuple):
    """The kernel's lanes over one tree: lane i walks order[i, :length[i]] (node indices, root
    first); length 0 for a node that is not a leaf. A node's output is written by one lane, its
    owner (the lowest-index leaf below it); the other lanes through it only update the state.
    Built once a forward for all layers."""

    order: torch.Tensor  # [T, T] int32 (visible_keys(ancestors).order: row i = i's path)
    length: torch.Tensor  # [T] int32
    owner: torch.Tensor  # [T] int32


def tree_walk(ancestors: torch.Tensor, keys: VisibleKeys | None = None) -> TreeWalk:
    """The lanes of a tree from its ancestor-or-self mask (device ops, no host values); `keys`:
    the attention's visible_keys of the same mask, when the forward has them already."""
    keys = keys if keys is not None else visible_keys(ancestors)
    leaf = ancestors.sum(dim=0) == 1  # no node but itself has it as an ancestor
    t = ancestors.shape[0]
    index = torch.arange(t, device=ancestors.device)
    owner = torch.where(ancestors & leaf[:, None], index[:, None], t).amin(dim=0)
    return TreeWalk(keys.order, torch.where(leaf, keys.count, 0).to(torch.int32), owner.to(torch.int32))


if triton is not None:

    # One compiled kernel for every tree size and for both uses (outputs, commit): Triton would
    # otherwise specialise on T == 1, on the flags and on the walk's row stride.
    @triton.jit(do_not_specialize=["T", "walk_row", "emit", "store"])
    def _gated_delta_walk_kernel(
        q_ptr, k_ptr, v_ptr, q_row, k_row, v_row,  # q, k [T, k_heads * DK], v [T, H * DV]: row strides
        g_ptr, beta_ptr,  # [T, H] fp32
        walk_ptr, walk_row, len_ptr,  # lane l walks nodes walk[l, :len[l]] (int32, root first)
        owner_ptr,  # [T] int32: the lane that writes node j's output
        s_in_ptr, s_out_ptr,  # [H, DK, DV] fp32
        o_ptr,  # [T, H, DV] fp32
        T, H, emit, store, scale,
        REP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_for_previous(PDL)
        lane = tl.program_id(0)
        h = tl.program_id(1)
        cols = tl.program_id(2) * BV + tl.arange(0, BV)
        rows = tl.arange(0, DK)
        hk = h // REP
        n = tl.load(len_ptr + lane)
        if n > 0:
            tile = h * DK * DV + rows[:, None] * DV + cols[None, :]
            s = tl.load(s_in_ptr + tile)
            for d in range(0, n):
                j = tl.load(walk_ptr + lane * walk_row + d).to(tl.int64)
                k = tl.load(k_ptr + j * k_row + hk * DK + rows).to(tl.float32)
                k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
                v = tl.load(v_ptr + j * v_row + h * DV + cols).to(tl.float32)
                g = tl.load(g_ptr + j * H + h)
                beta = tl.load(beta_ptr + j * H + h)
                s = s * tl.exp(g)
                mem = tl.sum(s * k[:, None], axis=0)
                delta = (v - mem) * beta
                s = s + k[:, None] * delta[None, :]
                if emit != 0:  # (nested: the commit's owner_ptr is no [T] array)
                    if tl.load(owner_ptr + j) == lane:
                        q = tl.load(q_ptr + j * q_row + hk * DK + rows).to(tl.float32)
                        q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
                        o = tl.sum(s * q[:, None], axis=0)
                        tl.store(o_ptr + (j * H + h) * DV + cols, o)
            if store != 0:
                tl.store(s_out_ptr + tile, s)


def _walk(q, k, v, g, beta, order, length, owner, state_in, state_out, out, emit: bool, block_v: int = BLOCK_V,
          warps: int = WARPS) -> None:
    if triton is None:  # pragma: no cover
        raise RuntimeError("the Triton Gated DeltaNet kernel needs triton")
    t, hk, dk = q.shape
    h, dv = v.shape[1], v.shape[2]
    assert q.stride(2) == k.stride(2) == v.stride(2) == 1 and q.stride(1) == k.stride(1) == dk and v.stride(1) == dv
    assert dk & (dk - 1) == 0 and dv & (dv - 1) == 0, "head dims must be powers of two"
    assert order.dtype == length.dtype == torch.int32 and order.stride(1) == 1
    bv = min(block_v, dv)
    grid = (length.shape[0], h, dv // bv)
    _gated_delta_walk_kernel[grid](
        q, k, v, q.stride(0), k.stride(0), v.stride(0), g.float().contiguous(), beta.float().contiguous(),
        order, order.stride(0), length, owner, state_in, state_out, out, t, h, int(emit), int(not emit), dk**-0.5,
        REP=h // hk, DK=dk, DV=dv, BV=bv, num_warps=warps, enable_fp_fusion=False, **launch_args(q.device, t),
    )


def gated_delta_tree_triton(q, k, v, g, beta, ancestors, state, walk: TreeWalk | None = None,
                            block_v: int = BLOCK_V, warps: int = WARPS) -> torch.Tensor:
    """gated_delta_tree_ref in one launch (see the module docstring); `walk`: tree_walk(ancestors).
    block_v, warps: the program shape (benchmarks only: the reductions' order, hence the bits,
    depend on it, so the engine keeps BLOCK_V and WARPS for every call and for the commit)."""
    walk = walk if walk is not None else tree_walk(ancestors)
    out = torch.empty(q.shape[0], v.shape[1], v.shape[2], dtype=torch.float32, device=q.device)
    _walk(q, k, v, g, beta, walk.order, walk.length, walk.owner, state, state, out, emit=True, block_v=block_v,
          warps=warps)
    return out


def gated_delta_path_triton(q, k, v, g, beta, path, count, state_in, state_out) -> None:
    """gated_delta_path_ref in one launch of one lane."""
    length = torch.as_tensor(count, device=q.device).to(torch.int32).reshape(1)
    # No outputs (emit off): `length` stands in for the owners, never read.
    _walk(q, k, v, g, beta, path.to(torch.int32).reshape(1, -1), length, length, state_in, state_out, state_out,
          emit=False)


def _use_triton(*tensors: torch.Tensor) -> bool:
    return tensors[0].is_cuda and triton is not None


def gated_delta_tree(q, k, v, g, beta, ancestors, state, walk: TreeWalk | None = None) -> torch.Tensor:
    """Outputs [T, H, dv] fp32 of a tree's nodes after the committed state (gated_delta_tree_ref):
    Triton on CUDA tensors (`walk`: the forward's tree_walk, else built here), the torch
    reference elsewhere."""
    if _use_triton(q):
        return gated_delta_tree_triton(q, k, v, g, beta, ancestors, state, walk)
    return gated_delta_tree_ref(q, k, v, g, beta, ancestors, state)


def gated_delta_path(q, k, v, g, beta, path, count, state_in, state_out) -> None:
    """state_out = state_in advanced by the nodes path[:count] (root first; count an int or a
    0-d tensor, >= 1) (gated_delta_path_ref): Triton on CUDA tensors, the reference elsewhere."""
    fn = gated_delta_path_triton if _use_triton(q) else gated_delta_path_ref
    fn(q, k, v, g, beta, path, count, state_in, state_out)

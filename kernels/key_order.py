"""Each row's visible columns of a [T, T] visibility mask, in one Triton launch.

Contract: `visible_keys_ref` (kernels/reference.py), reproduced bit for bit: order[t, :count[t]]
are the columns row t sees, ascending, and order[t, count[t]:] is 0.

Why: every forward turns its mask into attention's key lists (`tree_attention.visible_keys`).
Issued from torch that is ~10 small kernels (cast, sum, cumsum, where, arange, zeros, scatter,
copy), each a serial step of the forward's CUDA graph at 1-3 us; here it is one.

A program per row walks the row in BLOCK-column blocks, carrying the number of visible columns
so far: a visible column's rank is that number plus its inclusive prefix sum in the block, minus
one, and the column index is stored at order[row, rank]. Then the positions from count on are
zeroed. Every entry of the row is written once; fixed shapes, no host sync: safe in a CUDA graph.
"""
from __future__ import annotations

import torch

from .launch import launch_args, wait_for_previous

try:  # triton is optional: CPU-only installs use the torch reference.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None

KERNELS = ("_visible_keys_kernel",)
MAX_BLOCK = 256  # columns a program reads at once: the largest tree bucket in one block
NUM_WARPS = 1  # a row is at most MAX_BLOCK int8s: one warp scans it

if triton is not None:

    @triton.jit
    def _visible_keys_kernel(
        MASK, ORDER, COUNT,  # [T, T] bool viewed as uint8 (any strides), [T, T] int32, [T] int32
        T, stride_row, stride_col,
        BLOCK: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_for_previous(PDL)
        row = tl.program_id(0)
        mask_row = MASK + row.to(tl.int64) * stride_row
        order_row = ORDER + row.to(tl.int64) * T
        cols = tl.arange(0, BLOCK)
        count = row * 0  # visible columns in the blocks before (int32)
        for start in range(0, T, BLOCK):
            col = start + cols
            seen = tl.load(mask_row + col * stride_col, mask=col < T, other=0) != 0
            seen32 = seen.to(tl.int32)
            rank = count + tl.cumsum(seen32, 0) - 1
            tl.store(order_row + rank, col, mask=seen)
            count += tl.sum(seen32, 0)
        # The reference's order starts from zeros: the positions past count hold 0.
        for start in range((count // BLOCK) * BLOCK, T, BLOCK):
            col = start + cols
            tl.store(order_row + col, tl.zeros([BLOCK], dtype=tl.int32), mask=(col >= count) & (col < T))
        tl.store(COUNT + row, count)


def visible_keys_triton(tree_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton `visible_keys_ref`: (order [T, T] int32, count [T] int32), the same values, one launch."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    assert tree_mask.dtype == torch.bool and tree_mask.dim() == 2 and tree_mask.shape[0] == tree_mask.shape[1], (
        f"visible_keys takes a square bool mask, got {tuple(tree_mask.shape)} {tree_mask.dtype}")
    t = tree_mask.shape[0]
    device = tree_mask.device
    order = torch.empty(t, t, dtype=torch.int32, device=device)
    count = torch.empty(t, dtype=torch.int32, device=device)
    if t == 0:
        return order, count
    mask = tree_mask.view(torch.uint8)  # same bytes: Triton reads bools as bytes
    block = min(MAX_BLOCK, triton.next_power_of_2(max(t, 16)))
    _visible_keys_kernel[(t,)](
        mask, order, count, t, mask.stride(0), mask.stride(1),
        BLOCK=block, num_warps=NUM_WARPS, **launch_args(device, t),
    )
    return order, count


__all__ = ["visible_keys_triton"]

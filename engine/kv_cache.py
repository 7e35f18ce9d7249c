"""Paged KV cache for one sequence: one block table for all layers, pool sized from the need.

Layout (see kernels/reference.py): per layer K and V pools [num_blocks, block_size, n_kv, head_dim].
Logical position p of the sequence lives in physical block block_table[p // block_size].
The engine writes new tokens (prefill chunks, tree nodes) at logical positions right after the
committed length, so a rejected tree is simply overwritten by the next round.
"""
from __future__ import annotations

import torch

from ..kernels.reference import logical_to_slots
from .errors import ContextOverflowError

BLOCK_SIZE = 16


class PagedKVCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        device: torch.device,
        dtype: torch.dtype,
        block_size: int = BLOCK_SIZE,
    ):
        self.block_size = block_size
        self.capacity = -(-capacity // block_size) * block_size  # whole blocks
        num_blocks = self.capacity // block_size
        # One allocation for all layers: [layers, 2 (k/v), blocks, block, kv heads, head dim].
        self.pool = torch.empty(
            num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim, device=device, dtype=dtype
        )
        # Physical blocks are handed out from a free list as the sequence grows; the table maps
        # logical -> physical blocks and is shared by all layers.
        self.block_table = torch.zeros(num_blocks, dtype=torch.int32, device=device)
        self._free = list(range(num_blocks - 1, -1, -1))
        self._owned: list[int] = []
        self.length = 0  # committed tokens

    @property
    def nbytes(self) -> int:
        return self.pool.numel() * self.pool.element_size()

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool[i, 0], self.pool[i, 1]

    def reserve(self, total: int) -> None:
        """Make logical positions [0, total) addressable (allocating blocks as needed)."""
        if total > self.capacity:
            raise ContextOverflowError(
                f"the conversation needs {total} tokens of KV cache but the context holds {self.capacity}; "
                "start a new chat or raise --max-context"
            )
        needed = -(-total // self.block_size)
        if needed > len(self._owned):
            new = [self._free.pop() for _ in range(needed - len(self._owned))]
            self.block_table[len(self._owned) : needed] = torch.tensor(new, dtype=torch.int32)
            self._owned.extend(new)

    def slots_of(self, positions: torch.Tensor) -> torch.Tensor:
        """Physical slots of logical positions (device ops only: safe inside CUDA graphs)."""
        return logical_to_slots(self.block_table, positions, self.block_size)

    def truncate(self, length: int) -> None:
        """Roll back to `length` committed tokens, returning unused blocks to the free list."""
        assert 0 <= length <= self.length
        self.length = length
        keep = -(-length // self.block_size)
        while len(self._owned) > keep:
            self._free.append(self._owned.pop())

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy K/V rows of logical positions src to dst in every layer (the accepted-path commit)."""
        flat = self.pool.view(self.pool.shape[0], 2, -1, *self.pool.shape[4:])
        flat[:, :, self.slots_of(dst)] = flat[:, :, self.slots_of(src)]  # gather first, then scatter

"""Paged KV cache for one sequence: an optional block table for all layers, pool sized from the need.

Layout (see kernels/reference.py): per layer K and V pools [num_blocks, block_size, n_kv, head_dim].
Logical position p of the sequence lives in physical block block_table[p // block_size], or in
block p // block_size when there is no table (None, the engine's caches: blocks in logical order).
The engine writes new tokens (prefill chunks, tree nodes) at logical positions right after the
committed length, so a rejected tree is simply overwritten by the next round.
"""
from __future__ import annotations

import torch

from ..kernels.reference import logical_to_slots

BLOCK_SIZE = 16


class TrackedLength:
    """A cache's length, twice: `length` on the host and `device_length` (a 0-d device tensor)
    that the CUDA graphs read and advance themselves (finish_round), so a round fills nothing.
    Setting `length` is for lengths the host decides (prefill, rollback, outside rounds): it
    writes the device copy too. After a round the host follows with `note_advance(count)`."""

    device_length: torch.Tensor
    _length: int

    @property
    def length(self) -> int:
        return self._length

    @length.setter
    def length(self, n: int) -> None:
        self._length = n
        self.device_length.fill_(n)

    def note_advance(self, count: int) -> None:
        """The round already advanced `device_length` by `count` (read back in the round's one
        device->host copy): the host copy follows without touching the device."""
        self._length += count


class PagedKVCache(TrackedLength):
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
        self._allocate([(num_kv_heads, head_dim)] * num_layers, capacity, device, dtype, block_size)

    def _allocate(self, layer_shapes: list[tuple[int, int]], capacity: int, device: torch.device,
                  dtype: torch.dtype, block_size: int) -> None:
        """One pool per distinct (kv heads, head_dim) of the layers, each one allocation
        [its layers, 2 (k/v), blocks, block, kv heads, head dim]; a uniform model has one."""
        self.block_size = block_size
        self.capacity = -(-capacity // block_size) * block_size  # whole blocks
        num_blocks = self.capacity // block_size
        shapes = sorted(set(layer_shapes))
        self.pools = [
            torch.empty(layer_shapes.count(s), 2, num_blocks, block_size, *s, device=device, dtype=dtype)
            for s in shapes
        ]
        # Layer i -> (its pool, its index there).
        self._where = [(shapes.index(s), layer_shapes[:i].count(s)) for i, s in enumerate(layer_shapes)]
        # The table maps logical -> physical blocks for all layers. A single stream has nothing
        # to share blocks with, and CUDA graphs need a fixed table: every block is mapped up
        # front, in order, which is no table at all (None): the attention then computes each
        # tile's address instead of loading its block number first. The kernels accept any
        # permutation too, and the tests set one.
        self.block_table: torch.Tensor | None = None
        self.device_length = torch.zeros((), dtype=torch.long, device=device)
        self._length = 0

    @property
    def pool(self) -> torch.Tensor:
        """The one pool of a cache whose layers share their K/V shape."""
        (pool,) = self.pools
        return pool

    @pool.setter
    def pool(self, pool: torch.Tensor) -> None:
        (_,) = self.pools
        self.pools = [pool]

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.pools)

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        pool, j = self._where[i]
        return self.pools[pool][j, 0], self.pools[pool][j, 1]

    def slots_of(self, positions: torch.Tensor) -> torch.Tensor:
        """Physical slots of logical positions (device ops only: safe inside CUDA graphs)."""
        return logical_to_slots(self.block_table, positions, self.block_size)

    def commit_chunk(self, length: int) -> None:
        """A prefill chunk's rows are committed: the length becomes `length`."""
        self.length = length

    def truncate(self, length: int) -> None:
        """Roll back to `length` committed tokens (later rows become scratch)."""
        assert 0 <= length <= self.length
        self.length = length

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy K/V rows of logical positions src to dst in every layer (the accepted-path commit)."""
        src, dst = self.slots_of(src), self.slots_of(dst)
        for pool in self.pools:
            flat = pool.view(pool.shape[0], 2, -1, *pool.shape[4:])
            flat[:, :, dst] = flat[:, :, src]  # gather first, then scatter


class MixedKVCache(PagedKVCache):
    """A paged cache whose layers differ in KV shape (Gemma 4: sliding-window layers 8 heads x
    256, global layers 2 x 512): one pool per distinct (kv heads, head_dim), sharing the length,
    the block table and so the slots. `layer(i)` is layer i's (K, V) pair as in PagedKVCache."""

    def __init__(
        self,
        layer_shapes: list[tuple[int, int]],
        capacity: int,
        device: torch.device,
        dtype: torch.dtype,
        block_size: int = BLOCK_SIZE,
    ):
        self._allocate(layer_shapes, capacity, device, dtype, block_size)

"""The index of each row's largest value (greedy choices over a vocabulary), in two launches.

Contract: `torch.argmax(x, dim=-1)` on NaN-free rows: the first index of the maximum (-0.0 and
0.0 are equal), int64. The input may be bf16/fp16 (the lm_head's own output): widening to fp32
is exact and keeps the order, so the index is the one torch gives on the fp32 copy.

Why: a greedy round took the target's logits through a whole-vocabulary fp32 copy and then
torch's argmax, a reduction of one CUDA block a row (1.5B, 64 rows of 152k: 30 + 23 µs of a
2.8 ms round on an H200; one row: 9 + 8 µs). Here the first pass reads the bf16 row in chunks on
many SMs at once and keeps each chunk's first maximum as a `sort_key` (value bits above the
reversed index), so the second pass's integer maximum over a row's chunk keys is the maximum
with the lowest index. Fixed shapes, no host sync: safe inside a CUDA graph.
"""
from __future__ import annotations

import torch

from .launch import launch_args, wait_for_previous

try:  # triton is optional: CPU-only installs use torch.argmax.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None

KERNELS = ("_chunk_max_kernel", "_row_max_kernel")
CHUNK = 4096  # values a program of the first pass reads: 38 programs a 152k-token row

if triton is not None:
    from .sort_keys import key_index, sort_key

    @triton.jit
    def _chunk_max_kernel(
        X, KEYS,  # [R, V] values (any float dtype), [R, NC] int64
        V, stride, n_chunks,
        CHUNK: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_for_previous(PDL)
        row = tl.program_id(0)
        c = tl.program_id(1)
        idx = c * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(X + row.to(tl.int64) * stride + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        m = tl.max(x, 0)
        first = tl.min(tl.where(x == m, idx, V), 0)  # the chunk's first maximum (an all -inf chunk: its first)
        tl.store(KEYS + row * n_chunks + c, sort_key(m, first))

    @triton.jit
    def _row_max_kernel(
        KEYS, OUT,  # [R, NC] int64, [R] int64
        n_chunks,
        NCP: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_for_previous(PDL)
        row = tl.program_id(0)
        c = tl.arange(0, NCP)
        keys = tl.load(KEYS + row * n_chunks + c, mask=c < n_chunks, other=-(2**63))
        tl.store(OUT + row, key_index(tl.max(keys, 0)).to(tl.int64))


def argmax_rows_triton(x: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """Triton `torch.argmax(x, dim=-1)` of a 2-D `x` [R, V] (NaN-free rows): [R] int64, two
    launches. `chunk` (a power of two) is the first pass's length."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    assert x.dim() == 2 and x.dtype in (torch.float32, torch.bfloat16, torch.float16), (x.shape, x.dtype)
    rows, vocab = x.shape
    assert vocab < 2**31, "indices must fit the key's 31 bits"
    x = x if x.stride(1) == 1 else x.contiguous()
    n_chunks = triton.cdiv(vocab, chunk)
    keys = torch.empty(rows, n_chunks, dtype=torch.long, device=x.device)
    out = torch.empty(rows, dtype=torch.long, device=x.device)
    _chunk_max_kernel[(rows, n_chunks)](
        x, keys, vocab, x.stride(0), n_chunks, CHUNK=chunk, num_warps=4 if chunk <= 2048 else 8,
        **launch_args(x.device, rows),
    )
    _row_max_kernel[(rows,)](
        keys, out, n_chunks, NCP=1 << max(1, n_chunks - 1).bit_length(), num_warps=1,
        **launch_args(x.device, rows),
    )
    return out


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """`torch.argmax(x, dim=-1)` of `x` [R, V]: the Triton kernels on CUDA, torch elsewhere."""
    if x.is_cuda and triton is not None and x.dim() == 2:
        return argmax_rows_triton(x)
    return x.argmax(dim=-1)

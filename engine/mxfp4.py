"""MXFP4 expert weights (gpt-oss checkpoints), dequantized once at load.

A checkpoint stores each expert matrix W [E, N, K] (transformers' in-memory [E, K, N] transposed)
as `{name}_blocks` [E, N, K/32, 16] uint8 — 32 FP4 (E2M1) values a group, two a byte, the low
nibble first — and `{name}_scales` [E, N, K/32] uint8, one power-of-two scale a group (E8M0,
exponent bias 127). The value is FP4 * 2^(scale - 127); the result is transposed back to [E, K, N].
"""
from __future__ import annotations

import torch

# E2M1 code -> value: sign bit 3, then exponent and mantissa.
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCKS_SUFFIX, SCALES_SUFFIX = "_blocks", "_scales"


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
                     rows_per_chunk: int = 1 << 16) -> torch.Tensor:
    """blocks [E, N, G, 16] uint8, scales [E, N, G] uint8 -> [E, G * 32, N] in dtype (exact: every
    FP4 value times a power of two is representable in bf16 unless it under/overflows)."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} ({blocks.dtype}) and scales {tuple(scales.shape)} "
                         f"({scales.dtype}) do not pair up")
    e, n, g, b = blocks.shape
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    flat_blocks, flat_scales = blocks.reshape(-1, b), scales.reshape(-1, 1).to(torch.int32) - 127
    out = torch.empty(flat_blocks.shape[0], 2 * b, dtype=dtype, device=blocks.device)
    for r in range(0, flat_blocks.shape[0], rows_per_chunk):  # chunks bound the fp32 temporaries
        blk, exp = flat_blocks[r:r + rows_per_chunk], flat_scales[r:r + rows_per_chunk]
        vals = torch.stack([lut[(blk & 0x0F).long()], lut[(blk >> 4).long()]], dim=-1).flatten(1)
        out[r:r + rows_per_chunk] = torch.ldexp(vals, exp).to(dtype)
    return out.view(e, n, g * 2 * b).transpose(1, 2).contiguous()

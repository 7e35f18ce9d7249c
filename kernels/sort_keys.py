"""Sortable int64 keys for Triton top-k selections (kernels/tree_build.py, kernels/top_logprobs.py).

A key holds an fp32 value's order-preserving bits above (2^31 - 1 - index), so one integer
comparison orders by value descending and, among equal values, by index ascending, and
`tl.topk` of keys is a top-k with the lower index first on ties. Every key is unique per index.
"""
from __future__ import annotations

try:  # triton is optional: CPU-only installs use the torch references.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None

if triton is not None:

    @triton.jit
    def sort_key(value, index):
        """int64 key: order-preserving bits of the fp32 value above (2^31 - 1 - index)."""
        bits = value.to(tl.int32, bitcast=True)
        bits = tl.where(value == 0.0, 0, bits)  # -0.0 == 0.0: one key for both
        bits = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: flip the magnitude bits
        return (bits.to(tl.int64) << 32) | (0x7FFFFFFF - index).to(tl.int64)

    @triton.jit
    def key_value(key):
        """The fp32 value a `sort_key` holds."""
        bits = (key >> 32).to(tl.int32)
        bits = bits ^ ((bits >> 31) & 0x7FFFFFFF)
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def key_index(key):
        """The index a `sort_key` holds."""
        return 0x7FFFFFFF - (key & 0x7FFFFFFF)

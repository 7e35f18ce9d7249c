"""Kernels: Triton on CUDA tensors, plain-torch references (reference.py) everywhere else."""
from .fused import (
    add_rms_norm,
    add_rms_norm_triton,
    qk_norm_rope,
    qk_norm_rope_triton,
    rms_norm,
    rms_norm_triton,
    silu_mul,
    silu_mul_triton,
)
from .reference import (
    add_rms_norm_ref,
    logical_to_slots,
    paged_tree_attention_ref,
    qk_norm_rope_ref,
    rms_norm_ref,
    rope_ref,
    silu_mul_ref,
    write_kv_ref,
)
from .tree_attention import (
    pack_tree_mask,
    paged_tree_attention,
    paged_tree_attention_triton,
    unpack_tree_mask,
    write_kv,
    write_kv_triton,
)

__all__ = [
    "add_rms_norm",
    "add_rms_norm_ref",
    "add_rms_norm_triton",
    "logical_to_slots",
    "pack_tree_mask",
    "paged_tree_attention",
    "paged_tree_attention_ref",
    "paged_tree_attention_triton",
    "qk_norm_rope",
    "qk_norm_rope_ref",
    "qk_norm_rope_triton",
    "rms_norm",
    "rms_norm_ref",
    "rms_norm_triton",
    "rope_ref",
    "silu_mul",
    "silu_mul_ref",
    "silu_mul_triton",
    "unpack_tree_mask",
    "write_kv",
    "write_kv_ref",
    "write_kv_triton",
]

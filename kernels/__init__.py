"""Kernels: Triton on CUDA tensors, plain-torch references (reference.py) everywhere else."""
from .reference import logical_to_slots, paged_tree_attention_ref, write_kv_ref
from .tree_attention import (
    pack_tree_mask,
    paged_tree_attention,
    paged_tree_attention_triton,
    unpack_tree_mask,
    write_kv,
    write_kv_triton,
)

__all__ = [
    "logical_to_slots",
    "pack_tree_mask",
    "paged_tree_attention",
    "paged_tree_attention_ref",
    "paged_tree_attention_triton",
    "unpack_tree_mask",
    "write_kv",
    "write_kv_ref",
    "write_kv_triton",
]

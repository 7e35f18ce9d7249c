"""Plain-torch references for the kernels. They are the oracle for the Triton kernels and
the attention the engine uses on the CPU.

Paged KV layout (shared by every kernel and the engine):
  k_pool, v_pool: [num_blocks, block_size, n_kv_heads, head_dim] (one pair per layer)
  block_table:    [max_blocks] int32, logical block -> physical block
  logical position p lives at physical slot block_table[p // block_size] * block_size + p % block_size
"""
from __future__ import annotations

import torch


def logical_to_slots(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Physical slot of each logical KV position."""
    return block_table[positions // block_size].long() * block_size + positions % block_size


def write_kv_ref(
    k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Store k, v ([T, n_kv_heads, head_dim]) at the given physical slots."""
    k_pool.view(-1, *k_pool.shape[2:])[slots] = k.to(k_pool.dtype)
    v_pool.view(-1, *v_pool.shape[2:])[slots] = v.to(v_pool.dtype)


def paged_tree_attention_ref(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor,
    prefix_len: int | torch.Tensor,
    tree_mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attention of T new tokens over a committed prefix plus themselves.

    q:         [T, n_heads, head_dim]
    prefix_len: committed tokens (logical positions 0..prefix_len-1), visible to every query
    tree_mask: [T, T] bool; query i sees new token j iff tree_mask[i, j] (ancestor-or-self for a
               draft tree, lower-triangular for a prefill chunk). The new tokens' K/V must already
               be written at logical positions prefix_len .. prefix_len + T - 1.
    returns    [T, n_heads, head_dim] in q's dtype; softmax in fp32.
    """
    prefix_len = int(prefix_len)
    t, n_heads, head_dim = q.shape
    block_size, n_kv = k_pool.shape[1], k_pool.shape[2]
    total = prefix_len + t
    slots = logical_to_slots(block_table, torch.arange(total, device=q.device), block_size)
    k = k_pool.view(-1, n_kv, head_dim)[slots].float()  # [L, n_kv, d]
    v = v_pool.view(-1, n_kv, head_dim)[slots].float()
    group = n_heads // n_kv
    k = k.repeat_interleave(group, dim=1)  # [L, n_heads, d]
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,lhd->htl", q.float(), k) * scale  # [H, T, L]
    visible = torch.ones(t, total, dtype=torch.bool, device=q.device)
    visible[:, prefix_len:] = tree_mask
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("htl,lhd->thd", probs, v)
    return out.to(q.dtype)


# ----------------------------------------------------------------------------- fused elementwise
# References for kernels/fused.py. Each one is the engine's eager code (engine/layers.py)
# verbatim, so swapping a dispatcher in changes nothing on the CPU.


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """engine.layers.RMSNorm.forward (transformers' arithmetic): normalize in fp32, round to
    x's dtype, then scale by weight (result in promote(x, weight) dtype). x: [..., H]."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm: returns (rms_norm(residual + x), residual + x).

    The engine's `h = h + o; y = norm(h)` with h = residual, o = x.
    """
    h = residual + x
    return rms_norm_ref(h, weight, eps), h


def silu_mul_ref(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The MLP's activation: F.silu(gate) * up (silu rounded to gate's dtype first)."""
    return torch.nn.functional.silu(gate) * up


def rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """engine.layers.Rotary.apply: half-split RoPE, x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def qk_norm_rope_ref(
    q: torch.Tensor | None,
    k: torch.Tensor | None,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Per-head RMSNorm (Qwen3's q_norm / k_norm; skipped where the weight is None) then RoPE.

    q: [T, Hq, D], k: [T, Hk, D] (either may be None: its output is None).
    cos, sin: [T, D] or [T, 1, D] (Rotary.cos_sin's layout) in q's dtype.
    Returns (q_out, k_out) with the shapes of q and k.
    """
    if cos.dim() == 2:
        cos, sin = cos[:, None, :], sin[:, None, :]
    out = []
    for x, w in ((q, q_norm_weight), (k, k_norm_weight)):
        if x is None:
            out.append(None)
            continue
        if w is not None:
            x = rms_norm_ref(x, w, eps)
        out.append(rope_ref(x, cos, sin))
    return out[0], out[1]

"""The training forward: many blocks of one sequence in one attention call.

Per sequence we sample anchors a in [prompt_len - 1, len - 2]: the anchor token is the last
prompt token or an answer token and at least one future token exists. A block is
`[token at a, MASK x D]` at positions a..a+D; its context is the target's tap features of
positions 0..a-1 (strictly before the anchor: the anchor's own features encode its successor).
All blocks of a sequence run in one attention call: keys = [context rows ; all block rows], and
one boolean mask lets each block row see context rows < its anchor plus its own block
(lower-triangular for a causal head), never another block.

The forward reuses the head's own modules (fc, hidden_norm, project_q/project_kv, rotary, norms,
MLP) in the same order as `DraftHead.context_kv` + `DraftHead.block_hidden`, so the trained
function is the inference function; tests check the logits agree to fp32 precision.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..engine.draft_head import DraftHead
from ..engine.layers import Rotary


def block_attention_mask(anchors: torch.Tensor, ctx_len: int, block: int, causal: bool) -> torch.Tensor:
    """[B, M*block, ctx_len + M*block] bool: which keys each block row sees.

    Row (j, i) = position i of the block anchored at anchors[:, j]. It sees context rows c < anchor
    (strictly before the anchor) and rows of its own block only (i' <= i if causal). Padded anchors
    (value 0) see no context but still their own block, so no row is fully masked."""
    b, m = anchors.shape
    dev = anchors.device
    ctx = torch.arange(ctx_len, device=dev)[None, None, :] < anchors[:, :, None]  # [B, M, C]
    ctx = ctx[:, :, None, :].expand(b, m, block, ctx_len).reshape(b, m * block, ctx_len)
    rows = torch.arange(m * block, device=dev)
    own = rows[:, None] // block == rows[None, :] // block
    if causal:
        own &= rows[None, :] <= rows[:, None]
    return torch.cat([ctx, own[None].expand(b, -1, -1)], dim=-1)


def head_forward(
    head: DraftHead, taps: torch.Tensor, anchors: torch.Tensor, block_embeds: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """Normed draft hidden states for all blocks: [B, M*block, hidden].

    taps [B, C, n_taps*hidden]: target features of positions 0..C-1 (row = position);
    anchors [B, M]; block_embeds [B, M*block, hidden] (the target's embeddings of
    [anchor, MASK...]); visible from `block_attention_mask`. Same arithmetic as
    DraftHead.context_kv + DraftHead.block_hidden, batched over blocks."""
    cfg = head.cfg
    bsz, c_len, _ = taps.shape
    q_len = block_embeds.shape[1]
    nkv, hd = cfg.num_kv_heads, cfg.head_dim
    rep = cfg.num_heads // nkv
    ctx = head.hidden_norm(head.fc(taps)).reshape(bsz * c_len, -1)  # no per-layer norm on context
    ctx_cos, ctx_sin = head.rotary.cos_sin(torch.arange(c_len, device=taps.device), ctx.dtype)
    positions = (anchors[:, :, None] + torch.arange(cfg.block_size, device=anchors.device)).reshape(-1)
    h = block_embeds.reshape(bsz * q_len, -1)
    cos, sin = head.rotary.cos_sin(positions, h.dtype)
    mask = visible[:, None]
    for layer in head.layers:
        attn = layer.self_attn
        ck, cv = attn.project_kv(ctx)
        ck = Rotary.apply(ck.view(bsz, c_len, nkv, hd), ctx_cos, ctx_sin)
        x = layer.input_layernorm(h)
        q = Rotary.apply(attn.project_q(x), cos, sin).view(bsz, q_len, cfg.num_heads, hd)
        k, v = attn.project_kv(x)
        k = Rotary.apply(k, cos, sin).view(bsz, q_len, nkv, hd)
        keys = torch.cat([ck.to(k.dtype), k], dim=1).transpose(1, 2)
        values = torch.cat([cv.view(bsz, c_len, nkv, hd).to(v.dtype), v.view(bsz, q_len, nkv, hd)], 1).transpose(1, 2)
        if rep > 1:  # GQA: kv head g serves query heads g*rep..g*rep+rep-1 (as enable_gqa does)
            keys, values = keys.repeat_interleave(rep, dim=1), values.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, scale=hd**-0.5
        ).transpose(1, 2)
        h = h + attn.o_proj(o.reshape(bsz * q_len, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return head.norm(h).view(bsz, q_len, -1)


def block_ids(input_ids: torch.Tensor, anchors: torch.Tensor, block: int, mask_token_id: int) -> torch.Tensor:
    """[B, M*block] token ids: per anchor [token at anchor, MASK x (block-1)]."""
    b, m = anchors.shape
    ids = torch.full((b, m, block), mask_token_id, dtype=torch.long, device=input_ids.device)
    ids[:, :, 0] = input_ids.gather(1, anchors)
    return ids.view(b, m * block)


def context_len(anchors: torch.Tensor, anchor_valid: torch.Tensor, q_len: int) -> int:
    """Context rows the batch needs (max anchor), rounded so keys = C + Q is a multiple of 8
    (aligned masks keep SDPA on its fused kernels)."""
    need = int((anchors * anchor_valid).max()) if anchor_valid.any() else 0
    total = -(-max(need + q_len, 8) // 8) * 8
    return total - q_len

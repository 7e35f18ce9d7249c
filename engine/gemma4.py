"""Gemma 4's text decoder (transformers 5's Gemma4ForCausalLM) over the paged KV cache.

What differs from the Llama-style TargetModel (engine/model.py), each checked against
transformers' gemma4 modeling code:
- two kinds of layers: sliding-window ones (`cfg.num_kv_heads` x `cfg.head_dim`, default RoPE)
  and global ones with their own head_dim and KV head count, "proportional" partial RoPE and,
  with attention_k_eq_v, no v_proj: V is k_proj's output. Their KV rows differ in shape, so the
  cache keeps one pool per shape (MixedKVCache);
- q_norm and k_norm (with weights) and a v_norm (without) on every head; attention scale 1 (the
  norms fix the logits' scale);
- four norms a layer (input, post-attention, pre- and post-feedforward), and with the MoE three
  more: the dense MLP's output is normed, the experts' (fed by their own pre-norm, routed on the
  un-normed stream) too, and their sum goes through the post-feedforward norm;
- a learned per-layer scalar multiplying the whole residual stream after each layer;
- embeddings scaled by sqrt(hidden) (rounded to the model dtype, as transformers does; the
  draft head gets the scaled module too), tied to the output; final logits soft-capped:
  tanh(logits / c) * c.
Everything runs through kernels/ dispatchers (Triton on CUDA, batch-invariant, so bf16
speculative = bf16 AR: the linears, norms, q/k norm + RoPE, the tree attention with its window
and head_dim 512, the MoE's router and experts in kernels/moe.py) or per-element torch code (the
dense MLP's gelu-tanh, the soft-cap, the embedding scale, the layer scalar).
"""
from __future__ import annotations

import torch
from torch import nn

from ..kernels import (
    gelu_tanh_mul_ref,
    moe_block_gemma4,
    paged_tree_attention,
    qk_norm_rope,
    rms_norm,
    write_kv,
)
from .kv_cache import BLOCK_SIZE, MixedKVCache
from .layers import MLP, FusedLinear, Linear, RMSNorm, Rotary, hf_parameters, init_random_, linear
from .model import ForwardBatch, TargetModel
from .model_config import ModelConfig

# Checkpoint prefixes of the multimodal release that are not the text model.
_NOT_TEXT = ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio.")


class UnitRMSNorm(nn.Module):
    """RMSNorm without a weight (Gemma 4's v_norm): rms_norm with a unit weight, which multiplies
    exactly, so the bits are reference.rms_normalize_ref's, through the batch-invariant kernel on
    CUDA (torch's own row reduction changes its order with the row count there). The unit weight
    is a buffer, not in the checkpoint; build_gemma4_target fills it."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.register_buffer("unit", torch.ones(dim), persistent=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.unit, self.eps)


class Gemma4Attention(nn.Module):
    """One attention layer's weights and its paged forward. A global layer with K = V has no
    v_proj; its V is the same projection as K, v-normed instead of k-normed and not rotated."""

    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        g = cfg.gemma4
        self.window = cfg.window(index)
        is_global = self.window == 0
        self.n_heads = cfg.num_heads
        self.n_kv = g.global_kv_heads if is_global else cfg.num_kv_heads
        self.head_dim = g.global_head_dim if is_global else cfg.head_dim
        self.k_eq_v = is_global and g.k_eq_v
        self.eps = cfg.rms_norm_eps
        kv = self.n_kv * self.head_dim
        parts = {"q_proj": self.n_heads * self.head_dim, "k_proj": kv} | ({} if self.k_eq_v else {"v_proj": kv})
        self.qkv_proj = FusedLinear(cfg.hidden_size, parts, bias=cfg.attention_bias)
        self.o_proj = Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.v_norm = UnitRMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
        slots: torch.Tensor, batch: ForwardBatch, block_table: torch.Tensor | None,
    ) -> torch.Tensor:
        t = x.shape[0]
        parts = self.qkv_proj.split(self.qkv_proj(x))
        q = parts[0].view(t, self.n_heads, self.head_dim)
        k = parts[1].view(t, self.n_kv, self.head_dim)
        v = k if self.k_eq_v else parts[2].view(t, self.n_kv, self.head_dim)
        v = self.v_norm(v)
        q, k = qk_norm_rope(q, k, self.q_norm.weight, self.k_norm.weight, cos, sin, self.eps)
        write_kv(k_pool, v_pool, slots, k, v)
        o = paged_tree_attention(q, k_pool, v_pool, block_table, batch.prefix_len, batch.tree_mask, 1.0,
                                 window=self.window)
        return self.o_proj(o.reshape(t, -1))


class Gemma4MLP(MLP):
    """The dense MLP: gate/up fused as in MLP, gelu (tanh approximation) instead of SiLU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.split(self.gate_up_proj(x))
        return self.down_proj(gelu_tanh_mul_ref(gate, up))


class Gemma4Router(nn.Module):
    """transformers' Gemma4TextRouter weights: proj [E, H], scale [H], per_expert_scale [E]."""

    def __init__(self, hidden: int, num_experts: int):
        super().__init__()
        self.proj = nn.Linear(hidden, num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(hidden))
        self.per_expert_scale = nn.Parameter(torch.ones(num_experts))


class Gemma4Experts(nn.Module):
    """The experts stacked as transformers 5 and the released checkpoints keep them:
    gate_up_proj [E, 2I, H] (gate rows, then up rows), down_proj [E, H, I]."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))


class Gemma4DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = Gemma4Attention(cfg, index)
        self.mlp = Gemma4MLP(h, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.pre_feedforward_layernorm = RMSNorm(h, eps)
        self.post_feedforward_layernorm = RMSNorm(h, eps)
        self.layer_scalar = nn.Parameter(torch.ones(1))
        self.top_k, self.eps = cfg.num_experts_per_tok, eps
        self.moe = cfg.is_moe_layer(index)
        if self.moe:
            self.router = Gemma4Router(h, cfg.num_experts)
            self.experts = Gemma4Experts(cfg.num_experts, h, cfg.moe_intermediate_size)
            self.post_feedforward_layernorm_1 = RMSNorm(h, eps)
            self.post_feedforward_layernorm_2 = RMSNorm(h, eps)
            self.pre_feedforward_layernorm_2 = RMSNorm(h, eps)

    def feedforward(self, h: torch.Tensor) -> torch.Tensor:
        """The residual stream h [T, H] -> what the layer adds to it (before the layer scalar)."""
        m = self.mlp(self.pre_feedforward_layernorm(h))
        if self.moe:
            r = self.router
            experts = moe_block_gemma4(self.pre_feedforward_layernorm_2(h), h, r.scale, r.proj.weight,
                                           r.per_expert_scale, self.experts.gate_up_proj, self.experts.down_proj,
                                           self.top_k, self.eps)
            m = self.post_feedforward_layernorm_1(m) + self.post_feedforward_layernorm_2(experts)
        return self.post_feedforward_layernorm(m)


class ScaledEmbedding(nn.Embedding):
    """transformers' Gemma4TextScaledWordEmbedding: the lookup times `scale` (sqrt(hidden)), the
    scale rounded to the weight's dtype first. The draft head embeds through this module too, as
    heads trained on transformers' model (its input embeddings) saw."""

    def __init__(self, num: int, dim: int, scale: float):
        # An explicit (uninitialized) weight skips Embedding's init (see engine/model.py Backbone).
        super().__init__(num, dim, _weight=torch.empty(num, dim))
        self.scale = scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # A Python float of the dtype-rounded scale: the product's bits are those of transformers'
        # multiply by a 0-d tensor of that dtype, and nothing is allocated (CUDA-graph safe).
        return super().forward(ids) * torch.tensor(self.scale, dtype=self.weight.dtype).item()


class Gemma4Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = ScaledEmbedding(cfg.vocab_size, cfg.hidden_size, cfg.hidden_size**0.5)
        self.layers = nn.ModuleList(Gemma4DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


def _global_rotary(cfg: ModelConfig) -> Rotary:
    g = cfg.gemma4
    scaling = {"rope_type": "proportional", "partial_rotary_factor": g.global_rotary_factor,
               "factor": g.global_rope_factor}
    return Rotary(g.global_head_dim, g.global_rope_theta, scaling)


class Gemma4TargetModel(TargetModel):
    """TargetModel's interface (forward, logits, weights) for Gemma 4's decoder."""

    def __init__(self, cfg: ModelConfig):
        nn.Module.__init__(self)
        self.cfg = cfg
        self.model = Gemma4Backbone(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta)  # the sliding-window layers'
        self.global_rotary = _global_rotary(cfg)

    def init_random(self, seed: int, std: float = 0.02) -> None:
        """init_random_, then the per-layer scalars, router scales and the MoE's extra norm
        weights drawn from [0.5, 1.5] (not 1, so the tests see each of them applied)."""
        init_random_(self, seed, std)
        gen = torch.Generator(device=self.model.embed_tokens.weight.device).manual_seed(seed + 1)
        with torch.no_grad():
            for name, p in hf_parameters(self):
                if name.endswith(("layer_scalar", "router.scale", "per_expert_scale")) or "layernorm_" in name:
                    p.uniform_(0.5, 1.5, generator=gen)

    def checkpoint_key(self, key: str) -> str | None:
        """The released checkpoints are multimodal: the text model under `model.language_model.`,
        then the vision and audio towers, which we skip."""
        if key.startswith(_NOT_TEXT):
            return None
        if key.startswith("model.language_model."):
            return "model." + key[len("model.language_model."):]
        return key

    def make_cache(self, capacity: int, device: torch.device, dtype: torch.dtype,
                   block_size: int = BLOCK_SIZE) -> MixedKVCache:
        shapes = [(layer.self_attn.n_kv, layer.self_attn.head_dim) for layer in self.model.layers]
        return MixedKVCache(shapes, capacity, device, dtype, block_size)

    def forward(
        self, batch: ForwardBatch, kv: MixedKVCache, tap_layers: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """TargetModel.forward's contract: the final-normed hidden states [T, hidden] and the
        tapped layers' outputs concatenated (or None)."""
        t = batch.input_ids.shape[0]
        h = self.model.embed_tokens(batch.input_ids)
        sliding_rope = self.rotary.cos_sin(batch.positions, h.dtype)
        global_rope = self.global_rotary.cos_sin(batch.positions, h.dtype)
        slots = kv.slots_of(batch.prefix_len + torch.arange(t, device=h.device))
        taps: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            k_pool, v_pool = kv.layer(i)
            cos, sin = global_rope if attn.window == 0 else sliding_rope
            o = attn(layer.input_layernorm(h), cos, sin, k_pool, v_pool, slots, batch, kv.block_table)
            h = h + layer.post_attention_layernorm(o)
            h = (h + layer.feedforward(h)) * layer.layer_scalar
            if i in tap_layers:
                taps[i] = h
        tapped = torch.cat([taps[i] for i in tap_layers], dim=-1) if tap_layers else None
        return self.model.norm(h), tapped

    def logits(self, hidden: torch.Tensor, upcast: bool = True) -> torch.Tensor:
        """fp32 logits, soft-capped as transformers does (in the model dtype, then fp32; the
        model dtype with `upcast=False`)."""
        logits = linear(hidden, self.lm_head_weight())
        cap = self.cfg.gemma4.final_logit_softcap
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits.float() if upcast else logits


def build_gemma4_target(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> Gemma4TargetModel:
    """build_target's counterpart: allocated in place on the device, no init pass."""
    with torch.device("meta"):
        model = Gemma4TargetModel(cfg).to(dtype)
    model = model.to_empty(device=device)
    for norm in model.modules():
        if isinstance(norm, UnitRMSNorm):
            norm.unit.fill_(1.0)
    model.rotary = Rotary(cfg.head_dim, cfg.rope_theta).to(device)
    model.global_rotary = _global_rotary(cfg).to(device)
    return model.eval().requires_grad_(False)

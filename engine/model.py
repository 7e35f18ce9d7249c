"""The target model: a compact Llama / Qwen2 / Qwen3 / Qwen3-MoE / gpt-oss decoder over the paged KV cache.

Module names mirror transformers', except that q/k/v and gate/up are fused into one weight each
(`qkv_proj`, `gate_up_proj`) and a MoE layer's experts are stacked; `hf_parameters` gives the transformers names (row slices of the
fused weights), so HF safetensors load directly and our weights load into a transformers model
for the parity oracle.
Every forward is "T new tokens after a committed prefix": a prefill chunk (causal mask), a
draft tree (ancestor mask) or one AR step (T = 1) — one code path for all three.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ..kernels import add_rms_norm, argmax_rows, paged_tree_attention, prefix_tensor, visible_keys
from .kv_cache import PagedKVCache
from .layers import (
    MLP,
    AttentionWeights,
    GptOssMoeBlock,
    Linear,
    RMSNorm,
    Rotary,
    SparseMoeBlock,
    hf_parameters,
    init_random_,
    lm_head_logits,
)
from .model_config import ModelConfig
from .mxfp4 import BLOCKS_SUFFIX, SCALES_SUFFIX, dequantize_mxfp4


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        self.self_attn = AttentionWeights(
            cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.attention_bias, cfg.qk_norm, cfg.rms_norm_eps,
            o_bias=cfg.o_proj_bias, sinks=cfg.attention_sinks,
        )
        if cfg.is_moe_layer(index) and cfg.moe_kind == "gpt_oss":
            self.mlp = GptOssMoeBlock(
                cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_experts_per_tok,
                cfg.swiglu_alpha, cfg.swiglu_limit,
            )
        elif cfg.is_moe_layer(index):
            self.mlp = SparseMoeBlock(
                cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_experts_per_tok, cfg.norm_topk_prob
            )
        else:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        # An explicit (uninitialized) weight skips Embedding's normal_() init: on the meta device that
        # init imports torch._dynamo, 3-4 s of every start on a CPU. Weights are loaded or drawn later.
        self.embed_tokens = nn.Embedding(
            cfg.vocab_size, cfg.hidden_size, _weight=torch.empty(cfg.vocab_size, cfg.hidden_size)
        )
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


@dataclass
class ForwardBatch:
    """T new tokens: ids, RoPE positions, and which new tokens each one sees."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64 (tree node: anchor position + depth)
    tree_mask: torch.Tensor  # [T, T] bool
    # Committed KV rows; the new rows are written right after them. A 0-d device tensor in
    # CUDA graphs (so one captured graph serves every context length), else an int.
    prefix_len: int | torch.Tensor
    # tree_mask is causal (a prefill chunk): attention then folds the new tokens' tiles once for
    # all rows instead of a program per token. Speed only (`VisibleKeys.shared`).
    causal: bool = False


class TargetModel(nn.Module):
    # Under tensor parallelism (parallel.shard_target): how this rank's vocabulary rows of the
    # lm_head are gathered into whole logits. None: the rank holds the whole lm_head.
    vocab_split = None

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings)
        self.scale = cfg.head_dim**-0.5

    # -- weights ---------------------------------------------------------------------------
    def lm_head_weight(self) -> torch.Tensor:
        """The lm_head rows this rank computes: all of them, or under tensor parallelism its
        `vocab_split` rows (a tied embedding stays whole for the lookup; its rows are a view)."""
        if self.lm_head is not None:
            return self.lm_head.weight  # already this rank's rows (parallel.shard_target)
        embed = self.model.embed_tokens.weight
        split = self.vocab_split
        return embed if split is None else embed.narrow(0, split.rank * split.rows, split.rows)

    def init_random(self, seed: int, std: float = 0.02, shard=None) -> None:
        """`shard`: see init_random_."""
        init_random_(self, seed, std, shard)

    def checkpoint_key(self, key: str) -> str | None:
        """Our name for a checkpoint tensor's key; None skips it (see HybridTargetModel)."""
        return key

    def load_safetensors(self, directory: Path, shard=None) -> None:
        """`shard` (a parallel.Shard): this model holds one rank's part of each split tensor; only
        that part of the file is read (safetensors slices: the rest never leaves the disk)."""
        from safetensors import safe_open

        directory = Path(directory)
        index = directory / "model.safetensors.index.json"
        if index.is_file():  # sharded (Qwen3-30B-A3B: 16 shards): exactly the files the index names
            files = [directory / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        else:
            files = sorted(directory.glob("*.safetensors"))
        params = dict(hf_parameters(self))  # checkpoint name -> parameter (or rows of a fused one)
        seen: set[str] = set()
        packed: dict[str, torch.Tensor] = {}  # MXFP4 halves (gpt-oss experts) waiting for their pair
        with torch.no_grad():
            for f in files:
                with safe_open(str(f), framework="pt", device="cpu") as st:
                    for stored in st.keys():
                        key = self.checkpoint_key(stored)
                        if key is None:
                            continue
                        if key.endswith((BLOCKS_SUFFIX, SCALES_SUFFIX)) and key[:-len(BLOCKS_SUFFIX)] in params:
                            name = key[:-len(BLOCKS_SUFFIX)]
                            packed[key] = st.get_tensor(stored)
                            pair = (name + BLOCKS_SUFFIX, name + SCALES_SUFFIX)
                            if all(k in packed for k in pair):
                                t = dequantize_mxfp4(packed.pop(pair[0]), packed.pop(pair[1]), params[name].dtype)
                                self._copy_weight(params, name, t, f.name)
                                seen.add(name)
                            continue
                        if key not in params:
                            if key == "lm_head.weight" and self.lm_head is None:
                                continue  # tied checkpoints sometimes still store it
                            if "rotary_emb" in key:
                                continue
                            raise ValueError(f"unexpected weight {key} in {f.name}")
                        dim = shard.take(key) if shard is not None else None
                        t = st.get_tensor(stored) if dim is None else _read_part(st.get_slice(stored), dim, shard)
                        self._copy_weight(params, key, t, f.name)
                        seen.add(key)
        if packed:
            raise ValueError(f"MXFP4 weight {sorted(packed)[0]} in {directory} has no matching blocks/scales half")
        missing = set(params) - seen
        if missing:
            raise ValueError(f"weights missing from {directory}: {', '.join(sorted(missing)[:5])} ...")

    @staticmethod
    def _copy_weight(params: dict[str, torch.Tensor], key: str, t: torch.Tensor, file: str) -> None:
        if t.shape != params[key].shape:
            raise ValueError(f"weight {key} in {file} has shape {tuple(t.shape)}, expected {tuple(params[key].shape)}")
        # copy_ converts dtype and device on the way: no full-size temporary
        # (bf16 -> fp32 on a CPU start: 7.0 -> 3.9 s for the 0.5B).
        params[key].copy_(t)

    # -- forward ---------------------------------------------------------------------------
    def forward(
        self, batch: ForwardBatch, kv: PagedKVCache, tap_layers: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run T new tokens; write their K/V at logical positions prefix_len..prefix_len+T-1.

        Returns the final-normed hidden states [T, hidden] and, if tap_layers is given, the
        concatenated outputs of those decoder layers [T, len(tap_layers) * hidden].
        """
        t = batch.input_ids.shape[0]
        h = self.model.embed_tokens(batch.input_ids)
        cos, sin = self.rotary.cos_sin(batch.positions, h.dtype)
        if t == 1 and isinstance(batch.prefix_len, torch.Tensor):  # an AR round's root: no arange, no add
            slots = kv.slots_of(batch.prefix_len.reshape(1))
        else:
            slots = kv.slots_of(batch.prefix_len + torch.arange(t, device=h.device))
        # The Triton kernel reads each row's keys in its own order and the length as an int32
        # tensor: derive both once for all layers.
        keys = visible_keys(batch.tree_mask, shared=batch.causal) if h.is_cuda else None
        prefix = prefix_tensor(batch.prefix_len, h.device) if h.is_cuda else batch.prefix_len
        layers = self.model.layers
        eps = self.cfg.rms_norm_eps
        taps: dict[int, torch.Tensor] = {}
        x = layers[0].input_layernorm(h)
        for i, layer in enumerate(layers):
            attn = layer.self_attn
            k_pool, v_pool = kv.layer(i)
            q = attn.qkv_rope_write(x, cos, sin, k_pool, v_pool, slots)
            o = paged_tree_attention(q, k_pool, v_pool, kv.block_table, prefix, batch.tree_mask, self.scale, keys,
                                     self.cfg.window(i), attn.sinks)
            # Residual add fused with the next norm: h += o_proj(o); x = norm(h) (same for the MLP,
            # whose add also applies the next layer's input norm, or the final norm). The
            # projections hand over their K-group sums where they split (forward_partials).
            x, h = add_rms_norm(attn.o_proj.forward_partials(o.reshape(t, -1)), h, layer.post_attention_layernorm.weight, eps)
            next_norm = layers[i + 1].input_layernorm if i + 1 < len(layers) else self.model.norm
            x, h = add_rms_norm(layer.mlp.forward_partials(x), h, next_norm.weight, eps)
            if i in tap_layers:
                taps[i] = h
        tapped = torch.cat([taps[i] for i in tap_layers], dim=-1) if tap_layers else None
        return x, tapped

    def logits(self, hidden: torch.Tensor, upcast: bool = True) -> torch.Tensor:
        """fp32 logits [..., V] (layers.lm_head_logits); `upcast=False`: the lm_head's own dtype
        where no gather widens them, for a consumer that only compares them (the greedy argmax)."""
        return lm_head_logits(hidden, self.lm_head_weight(), self.vocab_split, upcast)

    def greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's greedy token for each row of `hidden` [T, H]: [T] int64, the argmax of the
        logits compared in the lm_head's own dtype (widening is exact and keeps the order, so
        the tokens are those of the fp32 logits, without their whole-vocabulary copy)."""
        return argmax_rows(self.logits(hidden, upcast=False))


def _read_part(stored, dim: int, shard) -> torch.Tensor:
    """Rank `shard.rank`'s part along `dim` of a safetensors slice (read from the file alone)."""
    shape = stored.get_shape()
    if shape[dim] % shard.world:
        raise ValueError(f"a weight of shape {tuple(shape)} does not split over {shard.world} ranks")
    n = shape[dim] // shard.world
    return stored[(slice(None),) * dim + (slice(shard.rank * n, (shard.rank + 1) * n),)]


def build_target(
    cfg: ModelConfig, device: torch.device, dtype: torch.dtype, split: Callable[[TargetModel], None] | None = None
) -> TargetModel:
    """Allocate the model directly on the device in its dtype, without a CPU copy, an fp32 copy
    (Qwen3-30B-A3B is 61 GB in bf16, 122 GB in fp32) or an init pass. `split`: reshapes the
    unallocated model to one rank's part (parallel.shard_target) before anything is allocated."""
    with torch.device("meta"):
        model = TargetModel(cfg).to(dtype)
    if split is not None:
        split(model)
    model = model.to_empty(device=device)
    model.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings).to(device)
    return model.eval().requires_grad_(False)

"""The Qwen3.5 hybrid target (`qwen3_5`, `qwen3_5_moe`): Gated DeltaNet layers
(engine/linear_attention.py) beside gated full-attention layers, and their per-sequence cache.

Module and parameter names are transformers' (Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM), so
checkpoints load directly and our random weights load into transformers for the oracle. The
forward is TargetModel's contract: T new tokens after the committed prefix (a prefill chunk, a
draft tree or one AR step), final hidden states and taps out. Plain torch (CPU, fp32 exact).

Full-attention layer: q_proj gives per head [query | gate]; q/k RMSNorm with (1 + w); RoPE on the
first `rotary_dim` dims of each head (partial); attention over the paged cache; output * sigmoid(gate).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import paged_tree_attention
from .kv_cache import PagedKVCache
from .layers import MLP, Linear, SparseMoeBlock, linear
from .linear_attention import GatedDeltaNet, RoundStash, ZeroCenteredRMSNorm, depth_first, tree_parents
from .model import ForwardBatch, TargetModel
from .model_config import ModelConfig

# Turn-boundary state snapshots kept per sequence (each is a full recurrent state of every layer).
MAX_SNAPSHOTS = 4


class HybridCache(PagedKVCache):
    recurrent = True

    """The paged KV cache of the full-attention layers, plus per linear layer the committed conv
    window [conv_dim, K-1] and recurrent state [v_heads, k_dim, v_dim] (fp32).

    Lengths and rollback: the recurrent state exists only at the committed length, so a rollback
    lands on the longest length it can restore exactly: the committed length itself, a length
    inside the last round (the previous committed state is kept and the accepted path replayed
    to that length), or a stored turn boundary (a state copy taken after each prefill, the last
    MAX_SNAPSHOTS kept). `truncate` may therefore land before the length asked for; the engine
    recomputes from `length`."""

    def __init__(self, cfg: ModelConfig, capacity: int, device: torch.device, dtype: torch.dtype):
        hy = cfg.hybrid
        super().__init__(len(hy.full_layers), cfg.num_kv_heads, cfg.head_dim, capacity, device, dtype)
        n = len(hy.linear_layers)
        conv_dim = 2 * hy.linear_k_heads * hy.linear_k_dim + hy.linear_v_heads * hy.linear_v_dim
        self.conv = torch.zeros(n, conv_dim, hy.conv_kernel - 1, device=device, dtype=dtype)
        self.state = torch.zeros(n, hy.linear_v_heads, hy.linear_k_dim, hy.linear_v_dim, device=device, dtype=torch.float32)
        self.stash: RoundStash | None = None  # the last forward's per-node contributions
        self.last_round: tuple[int, torch.Tensor, torch.Tensor, RoundStash, list[int]] | None = None
        self.snapshots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.replay = None  # set by the model: (layer slot, conv, state, stash, path) -> (conv, state)

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.state_nbytes

    @property
    def state_nbytes(self) -> int:
        return self.conv.numel() * self.conv.element_size() + self.state.numel() * 4

    def _replay_all(self, conv: torch.Tensor, state: torch.Tensor, stash: RoundStash, path: list[int]):
        new_conv, new_state = torch.empty_like(conv), torch.empty_like(state)
        for slot, c in stash.layers.items():
            new_conv[slot], new_state[slot] = self.replay(slot, conv[slot], state[slot], c, path)
        return new_conv, new_state

    def commit_path(self, path: list[int]) -> None:
        """The last forward's nodes `path` (root first) are accepted: move the committed state
        to the deepest one's. The previous state is kept for a rollback inside this round."""
        stash = self.stash
        base = self.length
        prev = (self.conv, self.state)
        self.conv, self.state = self._replay_all(self.conv, self.state, stash, path)
        self.last_round = (base, prev[0], prev[1], stash, path)
        self.stash = None

    def commit_chunk(self, length: int) -> None:
        """A prefill chunk (a chain of length - self.length tokens) is committed; take a turn-boundary snapshot."""
        self.commit_path(list(range(length - self.length)))
        self.length = length
        self.snapshots[length] = (self.conv.clone(), self.state.clone())
        while len(self.snapshots) > MAX_SNAPSHOTS:
            del self.snapshots[min(self.snapshots)]

    def truncate(self, length: int) -> None:
        assert 0 <= length <= self.length
        if length == self.length:
            return
        if self.last_round is not None and self.last_round[0] <= length:
            base, conv, state, stash, path = self.last_round
            self.conv, self.state = self._replay_all(conv, state, stash, path[: length - base])
            self.last_round = None
            self.length = length
            return
        best = max((n for n in self.snapshots if n <= length), default=0)
        if best == 0:  # new tensors, not zero_(): the old ones may be inference tensors
            self.conv, self.state = torch.zeros_like(self.conv), torch.zeros_like(self.state)
        else:
            conv, state = self.snapshots[best]
            self.conv, self.state = conv.clone(), state.clone()
        self.snapshots = {n: s for n, s in self.snapshots.items() if n <= best}
        self.last_round = None
        self.length = best


class GatedAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, nh, nkv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim = nh, nkv, hd
        self.q_proj = Linear(h, nh * hd * 2, bias=cfg.attention_bias)  # per head: [query | gate]
        self.k_proj = Linear(h, nkv * hd, bias=cfg.attention_bias)
        self.v_proj = Linear(h, nkv * hd, bias=cfg.attention_bias)
        self.o_proj = Linear(nh * hd, h, bias=cfg.attention_bias)
        self.q_norm = ZeroCenteredRMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(hd, cfg.rms_norm_eps)


class SharedExpertMoe(nn.Module):
    """Qwen3.5-MoE's MLP: the routed experts (SparseMoeBlock's code path) plus a shared expert
    weighted by sigmoid(shared_expert_gate(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h = cfg.hidden_size
        routed = SparseMoeBlock(h, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_experts_per_tok, cfg.norm_topk_prob)
        self.gate, self.experts = routed.gate, routed.experts  # transformers' names: mlp.gate, mlp.experts
        self._routed = [routed]  # not a submodule: its parameters are registered above
        self.shared_expert = MLP(h, cfg.hybrid.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(h, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = torch.sigmoid(linear(x, self.shared_expert_gate.weight)) * self.shared_expert(x)
        return self._routed[0](x) + shared


class HybridDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        hy = cfg.hybrid
        self.is_linear = hy.layer_types[index] == "linear_attention"
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(
                cfg.hidden_size, hy.linear_k_heads, hy.linear_v_heads, hy.linear_k_dim, hy.linear_v_dim,
                hy.conv_kernel, cfg.rms_norm_eps,
            )
        else:
            self.self_attn = GatedAttention(cfg)
        self.mlp = SharedExpertMoe(cfg) if cfg.num_experts else MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = ZeroCenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class HybridBackbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(
            cfg.vocab_size, cfg.hidden_size, _weight=torch.empty(cfg.vocab_size, cfg.hidden_size)
        )
        self.layers = nn.ModuleList(HybridDecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = ZeroCenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class PartialRotary(nn.Module):
    """RoPE on the first `rotary_dim` dims of each head (half-split layout within them). Text
    positions make Qwen3.5's mrope the plain rope (its three position rows are equal)."""

    def __init__(self, rotary_dim: int, theta: float):
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float, device="cpu") / rotary_dim))
        self.register_buffer("inv_freq", inv, persistent=False)
        self.rotary_dim = rotary_dim

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        r = self.rotary_dim
        rot, rest = x[..., :r], x[..., r:]
        half = r // 2
        rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
        return torch.cat([rot * cos + rotated * sin, rest], dim=-1)


class HybridTargetModel(TargetModel):
    def __init__(self, cfg: ModelConfig):
        nn.Module.__init__(self)
        self.cfg = cfg
        self.model = HybridBackbone(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = PartialRotary(cfg.hybrid.rotary_dim, cfg.rope_theta)
        self.scale = cfg.head_dim**-0.5
        hy = cfg.hybrid
        # Decoder layer -> its slot in the KV pool (full attention) or in the state arrays (linear).
        self.slot = {i: j for j, i in enumerate(hy.full_layers)} | {i: j for j, i in enumerate(hy.linear_layers)}

    def checkpoint_key(self, key: str) -> str | None:
        """Qwen3.5-family checkpoints are multimodal: the text model under
        `model.language_model.`, then the vision tower and the MTP layers, which we skip."""
        if key.startswith(("mtp.", "model.visual.", "visual.")):
            return None
        if key.startswith("model.language_model."):
            return "model." + key[len("model.language_model."):]
        return key

    def make_cache(self, capacity: int, device: torch.device, dtype: torch.dtype) -> HybridCache:
        cache = HybridCache(self.cfg, capacity, device, dtype)
        by_slot = {self.slot[i]: layer.linear_attn for i, layer in enumerate(self.model.layers) if layer.is_linear}
        cache.replay = lambda slot, conv, state, c, path: by_slot[slot].replay(conv, state, c, path)
        return cache

    def init_random(self, seed: int, std: float = 0.02, shard=None) -> None:
        super().init_random(seed, std, shard)
        # (1 + w) norms: w = 0 is the identity scale (init_random_ set every norm weight to 1).
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
                    p.zero_()
                if name.endswith("A_log"):
                    p.uniform_(0.0, 1.0)  # decays in a realistic range

    def _attention(self, attn: GatedAttention, x, cos, sin, kv: HybridCache, slot: int, slots, batch: ForwardBatch):
        t = x.shape[0]
        q, gate = attn.q_proj(x).view(t, attn.n_heads, 2 * attn.head_dim).chunk(2, dim=-1)
        k = attn.k_proj(x).view(t, attn.n_kv, attn.head_dim)
        v = attn.v_proj(x).view(t, attn.n_kv, attn.head_dim)
        q = self.rotary.apply(attn.q_norm(q), cos, sin)
        k = self.rotary.apply(attn.k_norm(k), cos, sin)
        k_pool, v_pool = kv.layer(slot)
        k_pool.view(-1, attn.n_kv, attn.head_dim)[slots] = k.to(k_pool.dtype)
        v_pool.view(-1, attn.n_kv, attn.head_dim)[slots] = v.to(v_pool.dtype)
        o = paged_tree_attention(q.contiguous(), k_pool, v_pool, kv.block_table, batch.prefix_len, batch.tree_mask, self.scale)
        o = o.reshape(t, -1) * torch.sigmoid(gate.reshape(t, -1))
        return attn.o_proj(o)

    def forward(self, batch: ForwardBatch, kv: HybridCache, tap_layers: tuple[int, ...] = ()):
        t = batch.input_ids.shape[0]
        h = self.model.embed_tokens(batch.input_ids)
        cos, sin = self.rotary.cos_sin(batch.positions, h.dtype)
        slots = kv.slots_of(batch.prefix_len + torch.arange(t, device=h.device))
        parents, _ = tree_parents(batch.tree_mask)
        order = depth_first(parents)
        stash = RoundStash(parents=parents, layers={})
        taps: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.model.layers):
            x = layer.input_layernorm(h)
            j = self.slot[i]
            if layer.is_linear:
                o, stash.layers[j] = layer.linear_attn(x, kv.conv[j], kv.state[j], parents, order)
            else:
                o = self._attention(layer.self_attn, x, cos, sin, kv, j, slots, batch)
            h = h + o
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            if i in tap_layers:
                taps[i] = h
        kv.stash = stash
        tapped = torch.cat([taps[i] for i in tap_layers], dim=-1) if tap_layers else None
        return self.model.norm(h), tapped


def build_hybrid_target(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> HybridTargetModel:
    """model.build_target for the hybrid models: allocated on the device, no init pass."""
    with torch.device("meta"):
        model = HybridTargetModel(cfg).to(dtype)
    model = model.to_empty(device=device)
    model.rotary = PartialRotary(cfg.hybrid.rotary_dim, cfg.rope_theta).to(device)
    return model.eval().requires_grad_(False)

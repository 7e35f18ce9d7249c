"""The Qwen3.5 hybrid target (`qwen3_5`, `qwen3_5_moe`): Gated DeltaNet layers
(engine/linear_attention.py) beside gated full-attention layers, and their per-sequence cache.

Module and parameter names are transformers' (Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM), so
checkpoints load directly and our random weights load into transformers for the oracle. The
forward is TargetModel's contract: T new tokens after the committed prefix (a prefill chunk, a
draft tree or one AR step), final hidden states and taps out. The recurrence is
kernels/gated_delta.py (Triton on CUDA, its torch reference elsewhere: fp32 exact on the CPU).

Full-attention layer: q_proj gives per head [query | gate]; q/k RMSNorm with (1 + w); RoPE on the
first `rotary_dim` dims of each head (partial); attention over the paged cache; output * sigmoid(gate).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import paged_tree_attention, prefix_tensor, rope_cos_sin, tree_walk, visible_keys, write_kv
from .kv_cache import PagedKVCache
from .layers import MLP, Linear, SparseMoeBlock, linear
from .linear_attention import GatedDeltaNet, RoundStash, ZeroCenteredRMSNorm, conv_window_index
from .model import ForwardBatch, TargetModel
from .model_config import ModelConfig

# Turn-boundary state snapshots kept per sequence (each is a full recurrent state of every layer).
MAX_SNAPSHOTS = 4


class HybridCache(PagedKVCache):
    """The paged KV cache of the full-attention layers, plus per linear layer the committed conv
    window [conv_dim, K-1] and recurrent state [v_heads, k_dim, v_dim] (fp32), and a copy of both
    from before the last commit.

    The commit (`commit_path`) takes the accepted path and count as device tensors and writes
    the state in place: no host sync, so the CUDA graph of a greedy round holds it. Lengths and
    rollback: the recurrent state exists only at the committed length, so a rollback lands on
    the longest length it can restore exactly: the committed length itself, a length inside the
    last round (the state from before it is kept and the accepted path walked again to that
    length), or a stored turn boundary (a state copy taken after each prefill, the last
    MAX_SNAPSHOTS kept). `truncate` may therefore land before the length asked for; the engine
    recomputes from `length`."""

    recurrent = True

    def __init__(self, cfg: ModelConfig, capacity: int, device: torch.device, dtype: torch.dtype):
        hy = cfg.hybrid
        super().__init__(len(hy.full_layers), cfg.num_kv_heads, cfg.head_dim, capacity, device, dtype)
        n = len(hy.linear_layers)
        conv_dim = 2 * hy.linear_k_heads * hy.linear_k_dim + hy.linear_v_heads * hy.linear_v_dim
        # Fixed addresses (CUDA graphs read and write them): every update is in place.
        self.conv = torch.zeros(n, conv_dim, hy.conv_kernel - 1, device=device, dtype=dtype)
        self.state = torch.zeros(n, hy.linear_v_heads, hy.linear_k_dim, hy.linear_v_dim, device=device, dtype=torch.float32)
        self.prev_conv, self.prev_state = torch.zeros_like(self.conv), torch.zeros_like(self.state)
        self.stash: RoundStash | None = None  # the last forward's per-node operands
        # The last commit: (stash, path, count); with round_base, the committed length before it.
        self.last_round: tuple[RoundStash, torch.Tensor, torch.Tensor | int] | None = None
        self.round_base = 0
        self.snapshots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # Set by the model: (slot, conv, state, layer stash, path, count, conv_out, state_out) -> None.
        self.commit_layer = None

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.state_nbytes

    @property
    def state_nbytes(self) -> int:
        """The committed conv windows and states, and their copies from before the last commit."""
        return 2 * self.committed_state_nbytes

    @property
    def committed_state_nbytes(self) -> int:
        """One copy of the committed conv windows and states (what a step reads, then rewrites)."""
        return self.conv.numel() * self.conv.element_size() + self.state.numel() * 4

    def stash_nbytes(self, nodes: int) -> int:
        """What a forward over `nodes` nodes keeps for its commit, all linear layers: per node its
        conv input and output rows (the model dtype) and its g and beta (fp32). No per-node state."""
        layers, conv_dim = self.conv.shape[0], self.conv.shape[1]
        per_node = 2 * conv_dim * self.conv.element_size() + 2 * self.state.shape[1] * 4
        return nodes * layers * per_node

    def _walk(self, stash: RoundStash, path: torch.Tensor, count) -> None:
        """(conv, state) = (prev_conv, prev_state) advanced by the nodes path[:count]."""
        for slot, c in stash.layers.items():
            self.commit_layer(slot, self.prev_conv[slot], self.prev_state[slot], c, path, count, self.conv[slot],
                              self.state[slot])

    @torch.inference_mode()
    def commit_path(self, path: torch.Tensor | list[int], count: torch.Tensor | int | None = None) -> None:
        """The last forward's nodes path[:count] (root first; count >= 1, default all) are
        accepted: move the committed state to the deepest one's. Device ops only. The state
        from before is kept for a rollback inside this round."""
        path = torch.as_tensor(path, device=self.conv.device)
        count = path.shape[0] if count is None else count
        self.prev_conv.copy_(self.conv)
        self.prev_state.copy_(self.state)
        self._walk(self.stash, path, count)
        self.last_round = (self.stash, path, count)
        self.round_base = self.length
        self.stash = None

    def replayed(self, last_round: tuple[RoundStash, torch.Tensor, torch.Tensor]) -> None:
        """A CUDA graph that holds a commit was replayed: its (stash, path, count) tensors are
        this round's (the graph rewrote them), committed after the host's current length."""
        self.last_round, self.round_base, self.stash = last_round, self.length, None

    def commit_chunk(self, length: int) -> None:
        """A prefill chunk (a chain of length - self.length tokens) is committed; take a turn-boundary snapshot."""
        self.commit_path(list(range(length - self.length)))
        self.length = length
        with torch.inference_mode():
            self.snapshots[length] = (self.conv.clone(), self.state.clone())
        while len(self.snapshots) > MAX_SNAPSHOTS:
            del self.snapshots[min(self.snapshots)]

    @torch.inference_mode()
    def truncate(self, length: int) -> None:
        assert 0 <= length <= self.length
        if length == self.length:
            return
        if self.last_round is not None and self.round_base <= length:
            stash, path, _ = self.last_round
            self.conv.copy_(self.prev_conv)
            self.state.copy_(self.prev_state)
            if length > self.round_base:
                self._walk(stash, path, length - self.round_base)
            self.snapshots = {n: s for n, s in self.snapshots.items() if n <= length}  # none of a later sequence
            self.last_round = None
            self.length = length
            return
        best = max((n for n in self.snapshots if n <= length), default=0)
        if best == 0:
            self.conv.zero_()
            self.state.zero_()
        else:
            conv, state = self.snapshots[best]
            self.conv.copy_(conv)
            self.state.copy_(state)
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
        return rope_cos_sin(positions, self.inv_freq, 1.0, dtype)  # [T, 1, rotary_dim] each

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
        cache.commit_layer = lambda slot, *args: by_slot[slot].commit(*args)
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

    def _attention(self, attn: GatedAttention, x, cos, sin, kv: HybridCache, slot: int, slots, batch: ForwardBatch,
                   prefix, keys):
        t = x.shape[0]
        q, gate = attn.q_proj(x).view(t, attn.n_heads, 2 * attn.head_dim).chunk(2, dim=-1)
        k = attn.k_proj(x).view(t, attn.n_kv, attn.head_dim)
        v = attn.v_proj(x).view(t, attn.n_kv, attn.head_dim)
        q = self.rotary.apply(attn.q_norm(q), cos, sin)
        k = self.rotary.apply(attn.k_norm(k), cos, sin)
        k_pool, v_pool = kv.layer(slot)
        write_kv(k_pool, v_pool, slots, k.to(k_pool.dtype), v.to(v_pool.dtype))
        o = paged_tree_attention(q.contiguous(), k_pool, v_pool, kv.block_table, prefix, batch.tree_mask, self.scale, keys)
        o = o.reshape(t, -1) * torch.sigmoid(gate.reshape(t, -1))
        return attn.o_proj(o)

    def forward(self, batch: ForwardBatch, kv: HybridCache, tap_layers: tuple[int, ...] = ()):
        t = batch.input_ids.shape[0]
        h = self.model.embed_tokens(batch.input_ids)
        cos, sin = self.rotary.cos_sin(batch.positions, h.dtype)
        slots = kv.slots_of(batch.prefix_len + torch.arange(t, device=h.device))
        # Derived once for all layers: the conv windows' rows; for the Triton attention each
        # row's keys and the length as an int32 tensor (as TargetModel.forward).
        window = conv_window_index(batch.tree_mask, self.cfg.hybrid.conv_kernel)
        keys = visible_keys(batch.tree_mask, shared=batch.causal) if h.is_cuda else None
        prefix = prefix_tensor(batch.prefix_len, h.device) if h.is_cuda else batch.prefix_len
        walk = tree_walk(batch.tree_mask, keys) if h.is_cuda else None  # the recurrence's lanes (leaves' paths)
        stash = RoundStash(layers={})
        taps: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.model.layers):
            x = layer.input_layernorm(h)
            j = self.slot[i]
            if layer.is_linear:
                o, stash.layers[j] = layer.linear_attn(x, kv.conv[j], kv.state[j], batch.tree_mask, window, walk)
            else:
                o = self._attention(layer.self_attn, x, cos, sin, kv, j, slots, batch, prefix, keys)
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

"""Building blocks shared by the target model and the draft head (HF parameter names)."""
from __future__ import annotations

import math

import torch
from torch import nn

from ..kernels import qk_norm_rope, rms_norm, silu_mul


def init_random_(module: nn.Module, seed: int, std: float = 0.02) -> None:
    """Random weights for benchmarks and tests: norm weights 1, everything else (biases too, so
    tests exercise them) N(0, std^2), drawn on the parameters' device (fast for 8B shapes)."""
    device = next(module.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=gen)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Same arithmetic as transformers (normalize in fp32, scale in the input dtype); one
        # fused kernel on the GPU.
        return rms_norm(x, self.weight, self.eps)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))


class AttentionWeights(nn.Module):
    """Projections of one attention layer; the forward lives with the caller (paged or draft)."""

    def __init__(self, hidden: int, n_heads: int, n_kv: int, head_dim: int, bias: bool, qk_norm: bool, eps: float):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim, self.eps = n_heads, n_kv, head_dim, eps
        self.q_proj = nn.Linear(hidden, n_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, n_kv * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, n_kv * head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * head_dim, hidden, bias=False)
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps)
            self.k_norm = RMSNorm(head_dim, eps)
        else:
            self.q_norm = self.k_norm = None

    def qkv_rope(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v for tokens x: projections, then per-head q/k RMSNorm (Qwen3) and RoPE (one
        fused kernel on the GPU)."""
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.n_kv, self.head_dim)
        v = self.v_proj(x).view(t, self.n_kv, self.head_dim)
        q, k = qk_norm_rope(q, k, self._norm_weight(self.q_norm), self._norm_weight(self.k_norm), cos, sin, self.eps)
        return q, k, v

    def k_rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k (normed, RoPE'd) and v only: the draft head's context rows."""
        t = x.shape[0]
        k = self.k_proj(x).view(t, self.n_kv, self.head_dim)
        _, k = qk_norm_rope(None, k, None, self._norm_weight(self.k_norm), cos, sin, self.eps)
        return k, self.v_proj(x).view(t, self.n_kv, self.head_dim)

    @staticmethod
    def _norm_weight(norm: "RMSNorm | None") -> torch.Tensor | None:
        return norm.weight if norm is not None else None

    def project_q(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(x).view(-1, self.n_heads, self.head_dim)
        return self.q_norm(q) if self.q_norm is not None else q

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.k_proj(x).view(-1, self.n_kv, self.head_dim)
        v = self.v_proj(x).view(-1, self.n_kv, self.head_dim)
        return (self.k_norm(k) if self.k_norm is not None else k), v


class Rotary(nn.Module):
    """Rotary embedding with the half-split layout transformers uses for Llama/Qwen."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None = None):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        if scaling is not None:
            inv_freq = _llama3_inv_freq(inv_freq, scaling)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    factor = s["factor"]
    low, high = s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)

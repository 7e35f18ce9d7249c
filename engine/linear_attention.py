"""Gated DeltaNet (linear attention) for the Qwen3.5 hybrid models, and its tree verify.

A Gated DeltaNet layer keeps, per sequence, a recurrent state S [v_heads, k_dim, v_dim] (fp32)
and a causal conv window (the last K-1 pre-conv projections). One token updates them:

    x_conv = silu(sum_k w[:, k] * window[k])            (4-tap depthwise conv over the qkv rows)
    q, k   = l2norm(q), l2norm(k);  q /= sqrt(k_dim)
    S      = S * exp(g)                                  g = -exp(A_log) * softplus(a + dt_bias)
    S      = S + k ⊗ (beta * (v - S^T k))                beta = sigmoid(b)
    o      = S^T q ;  out = out_proj(rmsnorm(o) * w * silu(z))

Tree verify: a node's conv window is its nearest ancestors, falling back into the committed
window (`conv_window_index`, from the ancestor mask on the device); its state is its parent's
state updated by its own token (kernels/gated_delta.py: one launch per layer, no per-node state
stored, no host values). What each node contributed (its conv input row and its q, k, v, g,
beta) is kept (`RoundStash`); the commit walks the accepted path from the committed state with
the same kernel, so the committed state is bitwise the one each accepted node saw. The
full-attention layers keep using the paged KV cache.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import TreeWalk, gated_delta_path, gated_delta_tree
from .layers import Linear


def zero_centered_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3.5's RMSNorm: normalize in fp32, scale by (1 + w), then cast (transformers' order)."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * (1.0 + weight.float())).type_as(x)


class ZeroCenteredRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return zero_centered_rms_norm(x, self.weight, self.eps)


class GatedRMSNorm(nn.Module):
    """rmsnorm(x) * w * silu(z), per value head (a plain weight, not 1 + w)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * xf.to(dtype)
        return (out * F.silu(z.float())).to(dtype)


class DepthwiseConv(nn.Module):
    """The conv1d's weight under its checkpoint name (`conv1d.weight`, [channels, 1, K])."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel))


def conv_window_index(ancestors: torch.Tensor, kernel: int) -> torch.Tensor:
    """[T, K] row indices into cat(committed window (K-1 rows, oldest first), the T nodes' rows):
    each node's K-1 nearest ancestors, falling back into the committed window, then itself,
    oldest first. From the ancestor-or-self mask on the device (no host values: CUDA-graph safe).
    A prefill chunk's causal mask is a chain."""
    mask = ancestors.bool()
    t = mask.shape[0]
    idx = torch.arange(t, device=mask.device)
    strict = mask & (idx[:, None] != idx[None, :])
    depth = strict.sum(dim=1)
    parent = torch.where(strict.any(dim=1), torch.where(strict, depth[None, :] + 1, 0).argmax(dim=1), -1)
    cols, node = [kernel - 1 + idx], idx
    for h in range(1, kernel):
        node = parent[node.clamp(min=0)]  # the h-th ancestor where h <= depth
        cols.append(torch.where(depth >= h, kernel - 1 + node, kernel - 1 - h + depth))
    return torch.stack(cols[::-1], dim=1)


@dataclass
class LayerStash:
    """One layer's per-node operands in the last forward (what its commit replays)."""

    conv_in: torch.Tensor  # [T, conv_dim] pre-conv projections
    q: torch.Tensor  # [T, k_heads, dk] after the conv (views of one [T, conv_dim] tensor)
    k: torch.Tensor  # [T, k_heads, dk]
    v: torch.Tensor  # [T, v_heads, dv]
    g: torch.Tensor  # [T, v_heads] fp32
    beta: torch.Tensor  # [T, v_heads] fp32


@dataclass
class RoundStash:
    """What the last forward left for its commit: per-layer operands by state slot."""

    layers: dict[int, LayerStash]


class GatedDeltaNet(nn.Module):
    """Weights under transformers' names (`linear_attn.*`); the forward over a RecurrentState."""

    def __init__(self, hidden: int, k_heads: int, v_heads: int, k_dim: int, v_dim: int, conv_kernel: int, eps: float):
        super().__init__()
        self.k_heads, self.v_heads, self.k_dim, self.v_dim = k_heads, v_heads, k_dim, v_dim
        self.key_dim, self.value_dim = k_heads * k_dim, v_heads * v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.kernel = conv_kernel
        # Registration order = transformers' (random init draws the same numbers into the same weights).
        self.conv1d = DepthwiseConv(self.conv_dim, conv_kernel)
        self.dt_bias = nn.Parameter(torch.ones(v_heads))
        self.A_log = nn.Parameter(torch.zeros(v_heads))
        self.norm = GatedRMSNorm(v_dim, eps)
        self.out_proj = Linear(self.value_dim, hidden, bias=False)
        self.in_proj_qkv = Linear(hidden, self.conv_dim, bias=False)
        self.in_proj_z = Linear(hidden, self.value_dim, bias=False)
        self.in_proj_b = Linear(hidden, v_heads, bias=False)
        self.in_proj_a = Linear(hidden, v_heads, bias=False)

    def forward(self, x: torch.Tensor, conv_state: torch.Tensor, state: torch.Tensor, ancestors: torch.Tensor,
                window: torch.Tensor, walk: TreeWalk | None) -> tuple[torch.Tensor, LayerStash]:
        """T new tokens (a tree: ancestor-or-self mask `ancestors`; `window` = conv_window_index;
        `walk` = tree_walk on CUDA) after the committed (conv_state, state); nothing is written.
        Returns the layer output [T, hidden] and the stash the commit replays."""
        t = x.shape[0]
        conv_in = self.in_proj_qkv(x)
        rows = torch.cat([conv_state.t().to(conv_in.dtype), conv_in])  # committed rows, then node i at K-1+i
        w = self.conv1d.weight[:, 0, :].to(conv_in.dtype)  # [C, K]
        # Tap by tap, elementwise: a node's bits never depend on the other rows (batch invariance).
        acc = rows[window[:, 0]] * w[:, 0]
        for j in range(1, self.kernel):
            acc = acc + rows[window[:, j]] * w[:, j]
        mixed = F.silu(acc)
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        c = LayerStash(
            conv_in=conv_in,
            q=q.unflatten(-1, (self.k_heads, self.k_dim)),
            k=k.unflatten(-1, (self.k_heads, self.k_dim)),
            v=v.unflatten(-1, (self.v_heads, self.v_dim)),
            beta=self.in_proj_b(x).sigmoid().float(),
            g=-self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias),
        )
        out = gated_delta_tree(c.q, c.k, c.v, c.g, c.beta, ancestors, state, walk)
        z = self.in_proj_z(x).reshape(t, self.v_heads, self.v_dim)
        o = self.norm(out.to(x.dtype), z).reshape(t, -1)
        return self.out_proj(o), c

    def commit(self, conv_state: torch.Tensor, state: torch.Tensor, c: LayerStash, path: torch.Tensor, count,
               conv_out: torch.Tensor, state_out: torch.Tensor) -> None:
        """Write into (conv_out, state_out) the committed (conv_state, state) advanced by the
        accepted nodes path[:count] (root first; count >= 1, an int or a 0-d device tensor):
        the deepest one's state, walked by the verify's own kernel, and the last K-1 rows."""
        gated_delta_path(c.q, c.k, c.v, c.g, c.beta, path, count, state, state_out)
        rows = torch.cat([conv_state.t().to(c.conv_in.dtype), c.conv_in[path]])
        keep = count + torch.arange(self.kernel - 1, device=rows.device)
        conv_out.copy_(rows[keep].t())

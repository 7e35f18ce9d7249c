"""Gated DeltaNet (linear attention) for the Qwen3.5 hybrid models, and its tree verify.

A Gated DeltaNet layer keeps, per sequence, a recurrent state S [v_heads, k_dim, v_dim] (fp32)
and a causal conv window (the last K-1 pre-conv projections). One token updates them:

    x_conv = silu(sum_k w[:, k] * window[k])            (4-tap depthwise conv over the qkv rows)
    q, k   = l2norm(q), l2norm(k);  q /= sqrt(k_dim)
    S      = S * exp(g)                                  g = -exp(A_log) * softplus(a + dt_bias)
    S      = S + k ⊗ (beta * (v - S^T k))                beta = sigmoid(b)
    o      = S^T q ;  out = out_proj(rmsnorm(o) * w * silu(z))

Tree verify: a node's conv window is its nearest ancestors, falling back into the committed
window; its state is its parent's state updated by its own token. Nodes are visited depth-first
with one state per open branch point (a chain holds one state at a time), so a tree costs at
most (depth + 1) states, never one per node. What each node contributed (its conv input row and
its k, v, g, beta) is kept (`RoundStash`); the commit replays the accepted path from the
committed state with the same per-token arithmetic, so the committed state is bitwise the one
each accepted node saw. The full-attention layers keep using the paged KV cache.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

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


def delta_step(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the gated delta rule, fp32. state [H, dk, dv]; q, k [H, dk]; v [H, dv];
    g, beta [H]. Returns (new state, output [H, dv]). The one arithmetic of every path (prefill,
    tree node, AR step, commit replay), so their states agree bitwise."""
    state = state * g.exp()[:, None, None]
    kv_mem = (state * k[:, :, None]).sum(dim=1)
    delta = (v - kv_mem) * beta[:, None]
    state = state + k[:, :, None] * delta[:, None, :]
    return state, (state * q[:, :, None]).sum(dim=1)


def tree_parents(tree_mask: torch.Tensor) -> tuple[list[int], list[int]]:
    """(parents, depths) of T new tokens from their ancestor-or-self mask (-1: the committed
    prefix). A prefill chunk's causal mask is a chain."""
    mask = tree_mask.bool()
    depths = (mask.sum(dim=1) - 1).tolist()
    t = mask.shape[0]
    strict = mask & ~torch.eye(t, dtype=torch.bool, device=mask.device)
    score = torch.where(strict, torch.tensor(depths, device=mask.device)[None, :] + 1, 0)
    parents = torch.where(strict.any(dim=1), score.argmax(dim=1), -1).tolist()
    return parents, depths


def depth_first(parents: list[int]) -> list[int]:
    """Node order for the state walk: every node right after its parent's subtree began."""
    children: list[list[int]] = [[] for _ in parents]
    roots = []
    for i, p in enumerate(parents):
        (roots if p < 0 else children[p]).append(i)
    order, stack = [], list(reversed(roots))
    while stack:
        i = stack.pop()
        order.append(i)
        stack.extend(reversed(children[i]))
    return order


@dataclass
class LayerStash:
    """One layer's per-node contributions in the last forward (for the commit replay)."""

    conv_in: torch.Tensor  # [T, conv_dim] pre-conv projections
    k: torch.Tensor  # [T, H, dk] normed
    v: torch.Tensor  # [T, H, dv]
    g: torch.Tensor  # [T, H]
    beta: torch.Tensor  # [T, H]
    q: torch.Tensor  # [T, H, dk] normed and scaled (delta_step's output; the replay discards it)


@dataclass
class RoundStash:
    """What the last forward left for its commit: per-layer contributions, the tree's parents."""

    parents: list[int]
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

    def conv_windows(self, conv_in: torch.Tensor, conv_state: torch.Tensor, parents: list[int]) -> torch.Tensor:
        """Each node's K inputs, oldest first: its K-1 nearest ancestors (then the committed
        window, newest last) and itself. conv_state [conv_dim, K-1]. Returns [T, K, conv_dim]."""
        k = self.kernel
        rows = torch.cat([conv_state.t().to(conv_in.dtype), conv_in])  # committed rows 0..K-2, then node i at K-1+i
        index = []
        for i in range(len(parents)):
            chain = [k - 1 + i]
            p, back = parents[i], k - 2
            while len(chain) < k:
                if p >= 0:
                    chain.append(k - 1 + p)
                    p = parents[p]
                else:
                    chain.append(back)
                    back -= 1
            index.append(chain[::-1])
        return rows[torch.tensor(index, device=conv_in.device)]

    def contributions(self, x: torch.Tensor, conv_state: torch.Tensor, parents: list[int]):
        t = x.shape[0]
        conv_in = self.in_proj_qkv(x)
        windows = self.conv_windows(conv_in, conv_state, parents)  # [T, K, C]
        w = self.conv1d.weight[:, 0, :].to(windows.dtype)  # [C, K]
        mixed = F.silu((windows * w.t()[None]).sum(dim=1))
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        rep = self.v_heads // self.k_heads
        q = q.reshape(t, self.k_heads, self.k_dim).repeat_interleave(rep, dim=1).float()
        k = k.reshape(t, self.k_heads, self.k_dim).repeat_interleave(rep, dim=1).float()
        v = v.reshape(t, self.v_heads, self.v_dim).float()
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        q = q / (self.k_dim**0.5)
        beta = self.in_proj_b(x).sigmoid().float()
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)
        return LayerStash(conv_in=conv_in, k=k, v=v, g=g, beta=beta, q=q)

    def forward(self, x: torch.Tensor, conv_state: torch.Tensor, state: torch.Tensor, parents: list[int],
                order: list[int]) -> tuple[torch.Tensor, LayerStash]:
        """T new tokens after the committed (conv_state, state); nothing is written. Returns the
        layer output [T, hidden] and the stash the commit replays."""
        t = x.shape[0]
        c = self.contributions(x, conv_state, parents)
        out = torch.empty(t, self.v_heads, self.v_dim, dtype=torch.float32, device=x.device)
        children = [0] * t
        for p in parents:
            if p >= 0:
                children[p] += 1
        states: dict[int, torch.Tensor] = {}  # open branch points only (depth-first)
        for i in order:
            p = parents[i]
            before = state if p < 0 else states[p]
            if p >= 0:
                children[p] -= 1
                if children[p] == 0:
                    del states[p]  # its last child: the parent's state is no longer needed
            s, out[i] = delta_step(before, c.q[i], c.k[i], c.v[i], c.g[i], c.beta[i])
            if children[i]:
                states[i] = s
        z = self.in_proj_z(x).reshape(t, self.v_heads, self.v_dim)
        o = self.norm(out.to(x.dtype), z).reshape(t, -1)
        return self.out_proj(o), c

    def replay(self, conv_state: torch.Tensor, state: torch.Tensor, c: LayerStash, path: list[int]):
        """The committed (conv_state, state) after the accepted nodes `path` (root first)."""
        for i in path:
            state, _ = delta_step(state, c.q[i], c.k[i], c.v[i], c.g[i], c.beta[i])
        rows = torch.cat([conv_state.t().to(c.conv_in.dtype), c.conv_in[path]])
        return rows[-(self.kernel - 1):].t().to(conv_state.dtype), state

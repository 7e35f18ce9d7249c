"""Building blocks shared by the target model and the draft head.

Projections that read the same input are fused into one weight (q/k/v -> `qkv_proj`,
gate/up -> `gate_up_proj`): batch-1 decoding is launch- and GEMV-bound, so one wide GEMM beats
two or three narrow ones. Checkpoints (transformers', the published draft heads') keep the
separate names; `hf_parameters` maps each onto its rows of the fused weight. A MoE layer's
experts are stacked the same way ([E, 2I, H] gate/up, [E, H, I] down, as transformers 5 keeps
them in memory); checkpoints name each expert's matrices, mapped onto views of the stacks.
"""
from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import (
    Partials,
    linear_partials_triton,
    linear_triton,
    moe_block,
    moe_block_gpt_oss,
    qk_norm_rope,
    qkv_rope_write,
    rms_norm,
    rope_cos_sin,
    silu_mul,
)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias). CUDA bf16/fp16 (no autograd): the batch-invariant Triton GEMM
    (kernels/matmul.py), so a row's result is bitwise the same in a tree verify as in an AR step;
    fp32 on CUDA keeps F.linear (the oracle path against transformers). On the CPU a skinny x
    (1-32 rows: an AR step, a small tree, a draft block) goes through weight @ x.T: on a 2-core
    CPU F.linear took 2-3.5x its 1-row time at 2-16 rows (sgemm packs the weight panels, moving
    it twice), weight @ x.T 1-2.4x. One row is padded to two: with a single column the product
    dispatches to GEMV, which streamed the weights at a third of the GEMM's speed on the AMD
    EPYC of docs/performance.md, "CPU paths" (the AR step 118 -> 61 ms on the 0.5B).
    out: a contiguous [rows, N] destination (the tensor-parallel exchange's buffer), written by
    the GEMM itself on the Triton path, else copied into; the result is then `out`."""
    if out is not None:
        if _batch_invariant(x, weight, bias):
            return linear_triton(x.reshape(-1, x.shape[-1]), weight, bias, out=out)
        return out.copy_(linear(x, weight, bias).reshape(out.shape))
    rows = x.numel() // x.shape[-1]
    if x.device.type == "cpu" and rows <= 32:
        x2 = x.reshape(rows, x.shape[-1])
        if rows == 1:
            x2 = torch.cat([x2, x2.new_zeros(1, x2.shape[1])])
        y = (weight @ x2.T)[:, :rows].T.contiguous().view(*x.shape[:-1], weight.shape[0])
        return y + bias if bias is not None else y
    if _batch_invariant(x, weight, bias):
        y = linear_triton(x.reshape(rows, x.shape[-1]), weight, bias)
        return y.view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)


def lm_head_logits(hidden: torch.Tensor, weight: torch.Tensor, vocab_split=None, upcast: bool = True) -> torch.Tensor:
    """fp32 logits [..., V] of `hidden` through an lm_head `weight` (sampling always happens in
    fp32). Under tensor parallelism `weight` holds this rank's rows of the vocabulary and
    `vocab_split` (a parallel.VocabSplit) gathers every rank's slice into the whole row.
    `upcast=False`: without a gather, the GEMM's own dtype, for a consumer that widens as it
    reads or only compares (the draft graph's top_log_probs, TargetModel.greedy's argmax: bf16
    to fp32 is exact and keeps the order, so the results are the same and the copy is saved)."""
    part = linear(hidden, weight)
    if vocab_split is not None:
        return vocab_split.gather(part)
    return part.float() if upcast else part


def linear_partials(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor | Partials:
    """`linear` for a consumer that also takes `Partials` (add_rms_norm, qkv_rope_write): where
    the Triton GEMM takes its split launch (AR, small trees) the K-group sums come back unsummed
    and the consumer adds them as it loads, one launch fewer, the same bits; else `linear`."""
    if x.dim() == 2 and _batch_invariant(x, weight, bias):
        return linear_partials_triton(x, weight, bias)
    return linear(x, weight, bias)


def _batch_invariant(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """The Triton GEMM applies: CUDA, one 16-bit dtype throughout, and no backward needed (it has
    none; training runs the head in fp32 under autocast, which stays on F.linear)."""
    return (
        x.is_cuda
        and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == x.dtype
        and (bias is None or bias.dtype == x.dtype)
        and not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)))
    )


class Linear(nn.Linear):
    """nn.Linear through `linear` (the batch-invariant GEMM on CUDA, the CPU skinny-matrix path)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

    def forward_partials(self, x: torch.Tensor) -> torch.Tensor | Partials:
        """x [T, in] -> the output, or its `Partials` (`linear_partials`)."""
        return linear_partials(x, self.weight, self.bias)


class FusedLinear(Linear):
    """One Linear holding several projections of the same input, stacked by output rows in
    the order of `parts` (checkpoint name -> rows)."""

    def __init__(self, in_features: int, parts: dict[str, int], bias: bool):
        super().__init__(in_features, sum(parts.values()), bias=bias)
        self.parts = dict(parts)

    def rows(self, first: str, last: str | None = None) -> slice:
        """Output rows of the parts first..last (consecutive in `parts`)."""
        names = list(self.parts)
        sizes = list(self.parts.values())
        i, j = names.index(first), names.index(last or first)
        return slice(sum(sizes[:i]), sum(sizes[: j + 1]))

    def forward_parts(self, x: torch.Tensor, first: str, last: str | None = None) -> torch.Tensor:
        """Only the parts first..last: one GEMM over those rows of the weight (a view)."""
        r = self.rows(first, last)
        return linear(x, self.weight[r], self.bias[r] if self.bias is not None else None)

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The parts of an output y [..., out] as views."""
        return y.split(list(self.parts.values()), dim=-1)


def hf_parameters(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor) for every parameter in the unfused transformers / published
    layout: a FusedLinear yields one row slice (a view) of its weight and bias per part, named
    as that part next to the fused module; MoEExperts one view per expert and matrix
    (`experts.{e}.gate_proj.weight`, ...). The order is that of the unfused modules' own
    registration (so random init draws the same numbers into the same weights)."""
    for prefix, mod in module.named_modules():
        if isinstance(mod, MoEExperts):
            yield from mod.checkpoint_parameters(prefix)
            continue
        if isinstance(mod, FusedLinear):
            parent = prefix.rpartition(".")[0]
            parent = parent + "." if parent else ""
            for part in mod.parts:
                r = mod.rows(part)
                yield f"{parent}{part}.weight", mod.weight[r]
                if mod.bias is not None:
                    yield f"{parent}{part}.bias", mod.bias[r]
            continue
        yield from mod.named_parameters(prefix=prefix, recurse=False)


def init_random_(module: nn.Module, seed: int, std: float = 0.02, shard=None) -> None:
    """Random weights for benchmarks and tests: norm weights 1, everything else (biases too, so
    tests exercise them) N(0, std^2), drawn on the parameters' device (fast for 8B shapes).
    `shard` (a parallel.Shard): `module` holds one rank's part of each split tensor; the whole
    tensor is drawn (one at a time) and the part kept, so a rank's weights are exactly its part
    of the unsplit model's."""
    device = next(module.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in hf_parameters(module):
            dim = shard.take(name) if shard is not None else None
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif dim is None:
                p.normal_(0.0, std, generator=gen)
            else:
                shape = list(p.shape)
                shape[dim] *= shard.world
                p.copy_(shard.part(p.new_empty(shape).normal_(0.0, std, generator=gen), dim))


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
        self.gate_up_proj = FusedLinear(hidden, {"gate_proj": intermediate, "up_proj": intermediate}, bias=False)
        self.down_proj = Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (A gate_up GEMM with SiLU*up in its epilogue measured slower on an H200 at every M:
        # 33.2 vs 22.7 us for the 1.5B at M=1, two weight streams per program; docs/performance.md.)
        gate, up = self.gate_up_proj.split(self.gate_up_proj(x))  # strided views: silu_mul reads them in place
        return self.down_proj(silu_mul(gate, up))

    def forward_partials(self, x: torch.Tensor) -> torch.Tensor | Partials:
        """forward, for add_rms_norm: down's `Partials` where it splits (x: [T, hidden])."""
        gate, up = self.gate_up_proj.split(self.gate_up_proj(x))
        return self.down_proj.forward_partials(silu_mul(gate, up))


class MoEExperts(nn.Module):
    """The experts of one sparse MoE layer, stacked for the grouped GEMMs: gate_up_proj
    [E, 2I, H] (each expert's gate rows, then its up rows) and down_proj [E, H, I]. The
    parameter names and layout are transformers 5's Qwen3MoeExperts."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int):
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))

    def checkpoint_parameters(self, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
        """Checkpoint names (`{prefix}.{e}.gate_proj.weight`, up_proj, down_proj) -> views."""
        i = self.intermediate
        for e in range(self.gate_up_proj.shape[0]):
            yield f"{prefix}.{e}.gate_proj.weight", self.gate_up_proj[e, :i]
            yield f"{prefix}.{e}.up_proj.weight", self.gate_up_proj[e, i:]
            yield f"{prefix}.{e}.down_proj.weight", self.down_proj[e]


class SparseMoeBlock(nn.Module):
    """Qwen3 MoE's MLP: a router (`gate`, [E, H]) picks top_k experts per token; their SwiGLU
    outputs, weighted by the (renormalised) router probabilities, are summed. One fused Triton
    path on CUDA (kernels/moe.py), the plain-torch reference elsewhere."""

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int, norm_topk_prob: bool):
        super().__init__()
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.experts = MoEExperts(num_experts, hidden, intermediate)
        self.gate = nn.Linear(hidden, num_experts, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])  # tokens [..., H] -> [T, H], as the MLP takes any leading dims
        out = moe_block(rows, self.gate.weight, self.experts.gate_up_proj, self.experts.down_proj, self.top_k, self.norm_topk_prob)
        return out.view(x.shape)

    def forward_partials(self, x: torch.Tensor) -> torch.Tensor:
        """MLP.forward_partials' counterpart: the output itself (the combine kernel sums it)."""
        return self(x)


class GptOssExperts(nn.Module):
    """gpt-oss's experts in transformers 5's GptOssExperts layout (also its checkpoint names once
    dequantized): gate_up_proj [E, H, 2I] with gate and up columns interleaved, down_proj [E, I, H],
    and a bias for each.

    The two matrices are stored K-contiguous (each a transposed view of an [E, out, in] tensor):
    the MoE kernels walk them by their strides, and reading each output column's K run from
    contiguous memory takes gpt-oss-20b's MoE block from 7-17x its bytes bound to 1.0-1.5x
    (benchmarks/moe_gpt_oss.py, H200, 2026-11-27). Loads and random init write through the views."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden).transpose(1, 2))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, 2 * intermediate))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate).transpose(1, 2))
        self.down_proj_bias = nn.Parameter(torch.empty(num_experts, hidden))


class GptOssMoeBlock(nn.Module):
    """gpt-oss's MLP: a router with a bias picks top_k experts, softmax over the chosen logits;
    each runs the clamped SwiGLU ((up + 1) * gate * sigmoid(alpha * gate)) with biases. The
    fused Triton path on CUDA (kernels/moe.py, gpt-oss's options), the plain-torch reference
    elsewhere."""

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int, alpha: float, limit: float):
        super().__init__()
        self.top_k, self.alpha, self.limit = top_k, alpha, limit
        self.router = nn.Linear(hidden, num_experts, bias=True)
        self.experts = GptOssExperts(num_experts, hidden, intermediate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        e = self.experts
        out = moe_block_gpt_oss(rows, self.router.weight, self.router.bias, e.gate_up_proj, e.gate_up_proj_bias,
                                e.down_proj, e.down_proj_bias, self.top_k, self.alpha, self.limit)
        return out.view(x.shape)

    def forward_partials(self, x: torch.Tensor) -> torch.Tensor:
        return self(x)


class AttentionWeights(nn.Module):
    """Projections of one attention layer; the forward lives with the caller (paged or draft).
    gpt-oss adds an o_proj bias and per-head attention sinks (`sinks`, [n_heads] logits)."""

    def __init__(self, hidden: int, n_heads: int, n_kv: int, head_dim: int, bias: bool, qk_norm: bool, eps: float,
                 o_bias: bool = False, sinks: bool = False):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim, self.eps = n_heads, n_kv, head_dim, eps
        parts = {"q_proj": n_heads * head_dim, "k_proj": n_kv * head_dim, "v_proj": n_kv * head_dim}
        self.qkv_proj = FusedLinear(hidden, parts, bias=bias)
        self.o_proj = Linear(n_heads * head_dim, hidden, bias=o_bias)
        self.sinks = nn.Parameter(torch.empty(n_heads)) if sinks else None
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps)
            self.k_norm = RMSNorm(head_dim, eps)
        else:
            self.q_norm = self.k_norm = None

    def qkv_rope(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v for tokens x: one projection GEMM, then per-head q/k RMSNorm (Qwen3) and RoPE
        (one fused kernel on the GPU, reading q and k as strided views of the GEMM's output)."""
        t = x.shape[0]
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        q = q.view(t, self.n_heads, self.head_dim)
        k = k.view(t, self.n_kv, self.head_dim)
        v = v.view(t, self.n_kv, self.head_dim)
        q, k = qk_norm_rope(q, k, self._norm_weight(self.q_norm), self._norm_weight(self.k_norm), cos, sin, self.eps)
        return q, k, v

    def qkv_rope_write(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
        slots: torch.Tensor,
    ) -> torch.Tensor:
        """qkv_rope, with k and v stored at the pools' `slots` (write_kv) rather than returned:
        one projection GEMM and, on the GPU, one kernel that also adds the GEMM's K-group sums
        where it split (kernels/fused.py). Returns q [T, heads, head_dim]."""
        qkv = self.qkv_proj.forward_partials(x)
        return qkv_rope_write(qkv, self.n_heads, self.n_kv, self._norm_weight(self.q_norm), self._norm_weight(self.k_norm),
                              cos, sin, self.eps, k_pool, v_pool, slots)

    def k_rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k (normed, RoPE'd) and v only: the draft head's context rows."""
        k, v = self._kv(x)
        _, k = qk_norm_rope(None, k, None, self._norm_weight(self.k_norm), cos, sin, self.eps)
        return k, v

    def _kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # One GEMM over the k and v rows only (the q rows are most of the weight).
        k, v = self.qkv_proj.forward_parts(x, "k_proj", "v_proj").split(self.n_kv * self.head_dim, dim=-1)
        return k.view(-1, self.n_kv, self.head_dim), v.view(-1, self.n_kv, self.head_dim)

    @staticmethod
    def _norm_weight(norm: "RMSNorm | None") -> torch.Tensor | None:
        return norm.weight if norm is not None else None

    def project_q(self, x: torch.Tensor) -> torch.Tensor:
        q = self.qkv_proj.forward_parts(x, "q_proj").view(-1, self.n_heads, self.head_dim)
        return self.q_norm(q) if self.q_norm is not None else q

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self._kv(x)
        return (self.k_norm(k) if self.k_norm is not None else k), v


class Rotary(nn.Module):
    """Rotary embedding with the half-split layout transformers uses for Llama/Qwen."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None = None, max_positions: int = 0):
        super().__init__()
        # On the CPU even inside torch.device("meta") (build_target): a meta arange imports
        # torch._dynamo, seconds of every start. The buffer is moved where the model lives.
        self.attention_factor = 1.0  # YaRN scales cos and sin by it
        if scaling is not None and scaling.get("rope_type", scaling.get("type")) == "yarn":
            inv_freq, self.attention_factor = _yarn_inv_freq(head_dim, theta, scaling, max_positions)
        elif scaling is not None and scaling.get("rope_type") == "proportional":
            inv_freq = _proportional_inv_freq(head_dim, theta, scaling)
        else:
            inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device="cpu") / head_dim))
            if scaling is not None:
                inv_freq = _llama3_inv_freq(inv_freq, scaling)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) at `positions` [T], each [T, 1, head_dim] in `dtype` (kernels.rope_cos_sin:
        one launch on CUDA)."""
        return rope_cos_sin(positions, self.inv_freq, self.attention_factor, dtype)

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


def _proportional_inv_freq(head_dim: int, theta: float, s: dict) -> torch.Tensor:
    """Gemma 4's "proportional" partial RoPE: the first partial_rotary_factor * head_dim / 2
    frequencies are the usual ones of a head_dim-wide head, the rest 0 (cos 1, sin 0: those dims
    pass unrotated); all divided by `factor`. transformers' fp32 arithmetic."""
    angles = int(s.get("partial_rotary_factor", 1.0) * head_dim // 2)
    turned = 1.0 / (theta ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64, device="cpu").float() / head_dim))
    inv_freq = torch.cat([turned, torch.zeros(head_dim // 2 - angles, device="cpu")])
    return inv_freq / s.get("factor", 1.0)


def _yarn_inv_freq(head_dim: int, theta: float, s: dict, max_positions: int) -> tuple[torch.Tensor, float]:
    """YaRN (gpt-oss): per-frequency blend of interpolated (/ factor) and original frequencies
    over a linear ramp between the beta_fast and beta_slow correction dims, and the cos/sin
    scale 0.1 ln(factor) + 1. transformers' fp32 arithmetic, step for step."""
    original = s["original_max_position_embeddings"]
    factor = s.get("factor") or max_positions / original
    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all = s.get("mscale"), s.get("mscale_all_dim")

        def get_mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all) if mscale and mscale_all else get_mscale(factor)
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (head_dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)

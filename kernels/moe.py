"""Fused sparse MoE block (Qwen3 MoE) for CUDA: routing, rows grouped by expert, two grouped GEMMs.

    logits  = x @ router.T                      (cuBLAS, x's dtype, as transformers)
    route   : per token softmax (fp32), top-k, renormalised; weights rounded to x's dtype
    group   : the T*k (token, slot) assignments sorted by expert, each expert's run padded to a
              multiple of BLOCK_M rows; a block of BLOCK_M rows belongs to one expert
    gate_up : per block, rows of x gathered by token, times that expert's [2I, H] weight,
              silu(gate) * up fused into the epilogue -> one intermediate row per assignment
    down    : per block, intermediate rows times the expert's [H, I] weight, times the routing
              weight, written to the assignment's own row [T*k, H]
    combine : out[t] = sum over the k slots of row t*k + j, a fixed-order sum (no atomics), so
              the result is deterministic

Every shape (grids included) depends on T, k and E only: the number of blocks is bounded by
ceil(T*k / BLOCK_M) + min(E, T*k), and blocks past the real count see 0 valid rows and return.
No host sync anywhere, so the whole block lives in a CUDA graph.

Numerics follow transformers' Qwen3MoeExperts: gate/up and down GEMM outputs rounded to x's
dtype, silu in fp32 rounded, then * up, * weight (each rounded). What differs is the sum over
the k experts: transformers adds each expert's rows into a buffer in x's dtype (index_add_,
in expert order); here the k rows are summed in fp32 in slot order and rounded once. In fp32
the two agree to rounding; in bf16 ours is the more accurate one.

The plain-torch reference is kernels/reference.py::moe_ref (the CPU path and the tests' oracle).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .reference import moe_ref

try:  # triton is optional: CPU-only installs use the torch reference.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None

GROUP_CHUNK = 64  # assignments per step of the single-program grouping kernel
GATE_UP_BLOCK_N = 32  # intermediate columns per gate/up program (two accumulators: gate and up)
DOWN_BLOCK_N = 64  # hidden columns per down program
BLOCK_K = 64


def choose_block_m(assignments: int, num_experts: int) -> int:
    """Rows per expert block: ~2x the mean rows per expert, 16..64 (tl.dot needs >= 16). Small
    trees and AR steps pad each expert's few rows to 16; big ones read each expert's weights
    about once per column tile."""
    mean = max(1, 2 * assignments // num_experts)
    return min(64, max(16, triton.next_power_of_2(mean) if triton is not None else 16))


def max_blocks(assignments: int, num_experts: int, block_m: int) -> int:
    """Upper bound on the padded blocks: each used expert adds at most one partial block."""
    return -(-assignments // block_m) + min(num_experts, assignments)


if triton is not None:

    @triton.jit
    def _route_kernel(
        LOGITS, IDS, W, n_experts, stride_l,
        TOP_K: tl.constexpr, NORM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_TOP: tl.constexpr,
    ):
        """One token per program: softmax over the experts in fp32, then top-k by repeated
        argmax (lowest id on ties), renormalised; ids (int32) and weights (W's dtype)."""
        t = tl.program_id(0).to(tl.int64)
        e = tl.arange(0, BLOCK_E)
        logits = tl.load(LOGITS + t * stride_l + e, mask=e < n_experts, other=float("-inf")).to(tl.float32)
        p = tl.exp(logits - tl.max(logits, 0))
        p = p / tl.sum(p, 0)
        p = tl.where(e < n_experts, p, -1.0)
        slots = tl.arange(0, BLOCK_TOP)
        top_w = tl.zeros([BLOCK_TOP], dtype=tl.float32)
        top_i = tl.zeros([BLOCK_TOP], dtype=tl.int32)
        for j in tl.static_range(TOP_K):
            best = tl.max(p, 0)
            idx = tl.min(tl.where(p == best, e, BLOCK_E), 0)
            top_w = tl.where(slots == j, best, top_w)
            top_i = tl.where(slots == j, idx, top_i)
            p = tl.where(e == idx, -1.0, p)
        if NORM:
            top_w = top_w / tl.sum(top_w, 0)
        tl.store(IDS + t * TOP_K + slots, top_i, mask=slots < TOP_K)
        tl.store(W + t * TOP_K + slots, top_w.to(W.dtype.element_ty), mask=slots < TOP_K)

    @triton.jit
    def _group_kernel(
        IDS, BLOCK_EXPERT, BLOCK_ROWS, ROW_ASSIGN, n_assign, n_blocks, n_experts,
        BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr,
    ):
        """A single program. Counts rows per expert, pads each expert's run to BLOCK_M rows and
        writes, per block, its expert (n_experts past the last real block) and valid rows, and
        per assignment its padded row (ROW_ASSIGN[row] = assignment). Within an expert the
        assignments keep their order (token, then slot)."""
        experts = tl.arange(0, BLOCK_E)
        counts = tl.zeros([BLOCK_E], dtype=tl.int32)
        for start in range(0, n_assign, CHUNK):
            a = start + tl.arange(0, CHUNK)
            ids = tl.load(IDS + a, mask=a < n_assign, other=-1)
            counts += tl.sum((ids[:, None] == experts[None, :]).to(tl.int32), 0)
        blocks = (counts + BLOCK_M - 1) // BLOCK_M
        block_end = tl.cumsum(blocks, 0)
        block_start = block_end - blocks
        for start in range(0, n_blocks, CHUNK):
            b = start + tl.arange(0, CHUNK)
            # The expert holding block b: how many experts' runs end at or before it.
            e = tl.sum((block_end[None, :] <= b[:, None]).to(tl.int32), 1)
            own = (experts[None, :] == e[:, None]).to(tl.int32)
            first = tl.sum(own * block_start[None, :], 1)
            count = tl.sum(own * counts[None, :], 1)
            rows = tl.where(e < n_experts, tl.minimum(count - (b - first) * BLOCK_M, BLOCK_M), 0)
            tl.store(BLOCK_EXPERT + b, tl.minimum(e, n_experts), mask=b < n_blocks)
            tl.store(BLOCK_ROWS + b, rows, mask=b < n_blocks)
        seen = tl.zeros([BLOCK_E], dtype=tl.int32)
        for start in range(0, n_assign, CHUNK):
            a = start + tl.arange(0, CHUNK)
            ids = tl.load(IDS + a, mask=a < n_assign, other=-1)
            onehot = (ids[:, None] == experts[None, :]).to(tl.int32)
            rank = tl.cumsum(onehot, 0) - 1 + seen[None, :]
            row = tl.sum(onehot * (block_start[None, :] * BLOCK_M + rank), 1)
            tl.store(ROW_ASSIGN + row, a.to(tl.int32), mask=a < n_assign)
            seen += tl.sum(onehot, 0)

    @triton.jit
    def _gate_up_kernel(
        X, WGU, INTER, BLOCK_EXPERT, BLOCK_ROWS, ROW_ASSIGN, hidden, inter_size,
        stride_x, stride_we, stride_wn, stride_i,
        TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        IEEE: tl.constexpr,
    ):
        """grid (blocks, I / BLOCK_N): INTER[row] = silu(x[token] @ gate.T) * (x[token] @ up.T)."""
        blk = tl.program_id(0)
        rows = tl.load(BLOCK_ROWS + blk)
        if rows > 0:
            e = tl.load(BLOCK_EXPERT + blk).to(tl.int64)
            m = tl.arange(0, BLOCK_M)
            valid = m < rows
            assign = tl.load(ROW_ASSIGN + blk * BLOCK_M + m, mask=valid, other=0)
            token = tl.where(valid, assign // TOP_K, 0).to(tl.int64)
            n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = n < inter_size
            w_gate = WGU + e * stride_we + n[None, :] * stride_wn
            w_up = w_gate + inter_size * stride_wn
            acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k0 in range(0, hidden, BLOCK_K):
                k = k0 + tl.arange(0, BLOCK_K)
                k_ok = k < hidden
                a = tl.load(X + token[:, None] * stride_x + k[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
                wg = tl.load(w_gate + k[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                wu = tl.load(w_up + k[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                if IEEE:
                    acc_g = tl.dot(a, wg, acc_g, input_precision="ieee")
                    acc_u = tl.dot(a, wu, acc_u, input_precision="ieee")
                else:
                    acc_g = tl.dot(a, wg, acc_g)
                    acc_u = tl.dot(a, wu, acc_u)
            dt = INTER.dtype.element_ty
            g = acc_g.to(dt).to(tl.float32)
            u = acc_u.to(dt).to(tl.float32)
            s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
            out = (s * u).to(dt)
            r = (blk * BLOCK_M + m).to(tl.int64)
            tl.store(INTER + r[:, None] * stride_i + n[None, :], out, mask=valid[:, None] & n_ok[None, :])

    @triton.jit
    def _down_kernel(
        INTER, WD, RW, OUT, BLOCK_EXPERT, BLOCK_ROWS, ROW_ASSIGN, hidden, inter_size,
        stride_i, stride_we, stride_wn, stride_o,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
    ):
        """grid (blocks, H / BLOCK_N): OUT[assignment] = (INTER[row] @ down.T) * weight."""
        blk = tl.program_id(0)
        rows = tl.load(BLOCK_ROWS + blk)
        if rows > 0:
            e = tl.load(BLOCK_EXPERT + blk).to(tl.int64)
            m = tl.arange(0, BLOCK_M)
            valid = m < rows
            assign = tl.where(valid, tl.load(ROW_ASSIGN + blk * BLOCK_M + m, mask=valid, other=0), 0).to(tl.int64)
            n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = n < hidden
            r = (blk * BLOCK_M + m).to(tl.int64)
            w = WD + e * stride_we + n[None, :] * stride_wn
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k0 in range(0, inter_size, BLOCK_K):
                k = k0 + tl.arange(0, BLOCK_K)
                k_ok = k < inter_size
                a = tl.load(INTER + r[:, None] * stride_i + k[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
                b = tl.load(w + k[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                if IEEE:
                    acc = tl.dot(a, b, acc, input_precision="ieee")
                else:
                    acc = tl.dot(a, b, acc)
            dt = OUT.dtype.element_ty
            weight = tl.load(RW + assign, mask=valid, other=0.0).to(tl.float32)
            y = (acc.to(dt).to(tl.float32) * weight[:, None]).to(dt)
            tl.store(OUT + assign[:, None] * stride_o + n[None, :], y, mask=valid[:, None] & n_ok[None, :])


# ----------------------------------------------------------------------------- wrappers


def _check_triton() -> None:
    if triton is None:
        raise RuntimeError("triton is not installed")


def moe_route_triton(logits: torch.Tensor, top_k: int, norm_topk_prob: bool, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (weights [T, top_k] in dtype, expert ids [T, top_k] int32), best first."""
    _check_triton()
    t, e = logits.shape
    ids = torch.empty(t, top_k, dtype=torch.int32, device=logits.device)
    weights = torch.empty(t, top_k, dtype=dtype, device=logits.device)
    _route_kernel[(t,)](
        logits, ids, weights, e, logits.stride(0), TOP_K=top_k, NORM=norm_topk_prob,
        BLOCK_E=triton.next_power_of_2(e), BLOCK_TOP=triton.next_power_of_2(top_k),
    )
    return weights, ids


def moe_group_triton(
    ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Expert ids [T, k] -> (block_expert [B], block_rows [B], row_assign [B * block_m]) for
    B = max_blocks(T*k, E, block_m). Entries of row_assign past a block's valid rows are unset."""
    _check_triton()
    n_assign = ids.numel()
    n_blocks = max_blocks(n_assign, num_experts, block_m)
    dev = ids.device
    block_expert = torch.empty(n_blocks, dtype=torch.int32, device=dev)
    block_rows = torch.empty(n_blocks, dtype=torch.int32, device=dev)
    row_assign = torch.empty(n_blocks * block_m, dtype=torch.int32, device=dev)
    # An AR step (8 assignments, 9 blocks) takes one 16-row step, not a 64-row one.
    chunk = min(GROUP_CHUNK, max(16, triton.next_power_of_2(max(n_assign, n_blocks))))
    _group_kernel[(1,)](
        ids.reshape(-1), block_expert, block_rows, row_assign, n_assign, n_blocks, num_experts,
        BLOCK_M=block_m, BLOCK_E=triton.next_power_of_2(num_experts), CHUNK=chunk,
    )
    return block_expert, block_rows, row_assign


def moe_triton(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    norm_topk_prob: bool,
    *,
    block_m: int | None = None,
) -> torch.Tensor:
    """The sparse MoE block (same contract as reference.moe_ref) on x [T, H]."""
    _check_triton()
    t, hidden = x.shape
    num_experts, two_i, _ = gate_up.shape
    inter_size = two_i // 2
    x = x if x.stride(-1) == 1 else x.contiguous()
    weights, ids = moe_route_triton(F.linear(x, router_weight), top_k, norm_topk_prob, x.dtype)
    n_assign = t * top_k
    bm = block_m or choose_block_m(n_assign, num_experts)
    block_expert, block_rows, row_assign = moe_group_triton(ids, num_experts, bm)
    n_blocks = block_expert.numel()
    ieee = x.dtype == torch.float32
    inter = torch.empty(n_blocks * bm, inter_size, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(n_blocks, triton.cdiv(inter_size, GATE_UP_BLOCK_N))](
        x, gate_up, inter, block_expert, block_rows, row_assign, hidden, inter_size,
        x.stride(0), gate_up.stride(0), gate_up.stride(1), inter.stride(0),
        TOP_K=top_k, BLOCK_M=bm, BLOCK_N=GATE_UP_BLOCK_N, BLOCK_K=BLOCK_K, IEEE=ieee,
    )
    per_slot = torch.empty(n_assign, hidden, dtype=x.dtype, device=x.device)
    _down_kernel[(n_blocks, triton.cdiv(hidden, DOWN_BLOCK_N))](
        inter, down, weights, per_slot, block_expert, block_rows, row_assign, hidden, inter_size,
        inter.stride(0), down.stride(0), down.stride(1), per_slot.stride(0),
        BLOCK_M=bm, BLOCK_N=DOWN_BLOCK_N, BLOCK_K=BLOCK_K, IEEE=ieee,
    )
    # Fixed-order sum over the k slots (fp32 accumulation, one rounding): deterministic.
    return per_slot.view(t, top_k, hidden).sum(dim=1)


def moe(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    norm_topk_prob: bool,
) -> torch.Tensor:
    """Sparse MoE block: the fused Triton path on CUDA tensors, the torch reference elsewhere."""
    if x.is_cuda and triton is not None and not x.requires_grad:
        return moe_triton(x, router_weight, gate_up, down, top_k, norm_topk_prob)
    return moe_ref(x, router_weight, gate_up, down, top_k, norm_topk_prob)


__all__ = ["choose_block_m", "max_blocks", "moe", "moe_group_triton", "moe_route_triton", "moe_triton"]

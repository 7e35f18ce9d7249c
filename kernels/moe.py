"""Fused sparse MoE block (Qwen3 MoE) for CUDA: routing, rows grouped by expert, two grouped GEMMs.

    logits  = x @ router.T                      (cuBLAS, x's dtype, as transformers)
    route   : per token softmax (fp32), top-k, renormalised; weights rounded to x's dtype
    group   : the T*k (token, slot) assignments sorted by expert, each expert's run padded to a
              multiple of BLOCK_M rows; a block of BLOCK_M rows belongs to one expert. Two
              launches of E programs: count per expert, then place (prefix sum over E counts)
    gate_up : per block, rows of x gathered by token, times that expert's [2I, H] weight,
              silu(gate) * up fused into the epilogue -> one intermediate row per assignment
    down    : per block, intermediate rows times the expert's [H, I] weight, times the routing
              weight, written to the assignment's own row [T*k, H]
    combine : out[t] = sum over the k slots of row t*k + j, a fixed-order sum (no atomics), so
              the result is deterministic

The GEMMs' launch shape (MoeTile) comes from a small table by assignment count (TILES): in AR
steps and small trees an expert holds 1-4 rows and the block only streams weights, so it runs as
a CUDA-core GEMV (no padding to 16 rows); larger trees use tensor-core tiles.

Every shape (grids included) depends on T, k and E only: the number of blocks is bounded by
ceil(T*k / BLOCK_M) + min(E, T*k), and blocks past the real count see 0 valid rows and return.
No host sync anywhere, so the whole block lives in a CUDA graph.

Numerics follow transformers' Qwen3MoeExperts: gate/up and down GEMM outputs rounded to x's
dtype, silu in fp32 rounded, then * up, * weight (each rounded). What differs is the sum over
the k experts: transformers adds each expert's rows into a buffer in x's dtype (index_add_,
in expert order); here the k rows are summed in fp32 in slot order and rounded once. In fp32
the two agree to rounding; in bf16 ours is the more accurate one.

The plain-torch reference is kernels/reference.py::moe_block_ref (the CPU path and the tests' oracle).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .fused import _interpreting
from .reference import moe_block_ref

try:  # triton is optional: CPU-only installs use the torch reference.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None

GROUP_CHUNK = 256  # assignments (or blocks) per step of a grouping program


@dataclass(frozen=True)
class MoeTile:
    """One launch shape for the two grouped GEMMs. dot: tensor-core tiles (block_m >= 16) or a
    CUDA-core GEMV (block_m 1-4: an expert's few rows in AR steps and small trees, where the
    weights are all that is read and padding to 16 rows would only add MMA work)."""

    dot: bool
    block_m: int  # rows per expert block (each expert's run is padded to a multiple)
    gate_up_n: int  # intermediate columns per gate/up program (two accumulators: gate and up)
    down_n: int  # hidden columns per down program
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


# Tiles by size class: the first entry whose bound >= T*k assignments. The bounds are the
# assignments of 1, 20, 80, 160 rows at top-8 (AR, budget-16 trees, budget-64 trees, 128-row
# verifies); the last one takes the rest (256-row verifies, prefill chunks). The GEMV tiles keep
# the product tile small per thread (sm_90 cubins: 72-127 registers, no spills), so many programs
# per SM keep enough loads in flight to stream the weights; the tensor-core ones are the shapes
# measured before the table. To re-tune (H200, Qwen3-30B-A3B shapes):
#     python scripts/gpu-lease/moe_kernel_bench.py --sweep   (prints the table to paste here)
TILES: tuple[tuple[int, MoeTile], ...] = (
    (8, MoeTile(dot=False, block_m=1, gate_up_n=8, down_n=16, block_k=256, num_warps=4, num_stages=3)),
    (160, MoeTile(dot=False, block_m=4, gate_up_n=8, down_n=16, block_k=128, num_warps=8, num_stages=3)),
    (640, MoeTile(dot=True, block_m=16, gate_up_n=32, down_n=64, block_k=64, num_warps=4, num_stages=3)),
    (1280, MoeTile(dot=True, block_m=16, gate_up_n=32, down_n=64, block_k=64, num_warps=4, num_stages=3)),
    (1 << 62, MoeTile(dot=True, block_m=32, gate_up_n=32, down_n=64, block_k=64, num_warps=4, num_stages=3)),
)


def choose_tile(assignments: int) -> MoeTile:
    """The tile of the smallest size class holding this many (token, slot) assignments."""
    return next(tile for bound, tile in TILES if assignments <= bound)


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
    def _count_kernel(IDS, COUNTS, n_assign, CHUNK: tl.constexpr):
        """grid (E,): COUNTS[e] = how many assignments route to expert e."""
        e = tl.program_id(0)
        hits = tl.zeros([CHUNK], dtype=tl.int32)
        for start in range(0, n_assign, CHUNK):
            a = start + tl.arange(0, CHUNK)
            ids = tl.load(IDS + a, mask=a < n_assign, other=-1)
            hits += (ids == e).to(tl.int32)
        tl.store(COUNTS + e, tl.sum(hits, 0))

    @triton.jit
    def _place_kernel(
        IDS, COUNTS, BLOCK_EXPERT, BLOCK_ROWS, ROW_ASSIGN, n_assign, n_blocks, n_experts,
        BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr,
    ):
        """grid (E,): expert e's run starts after the padded runs of experts < e (a prefix sum over
        the E counts, redone by each program: E <= 128 values). Writes, per block of e, its expert
        and valid rows, and per assignment of e its padded row (ROW_ASSIGN[row] = assignment), in
        assignment order (token, then slot). The last program also marks the unused tail blocks
        (expert n_experts, 0 rows)."""
        e = tl.program_id(0)
        experts = tl.arange(0, BLOCK_E)
        counts = tl.load(COUNTS + experts, mask=experts < n_experts, other=0)
        blocks = (counts + BLOCK_M - 1) // BLOCK_M
        first = tl.sum(tl.where(experts < e, blocks, 0), 0)
        count = tl.sum(tl.where(experts == e, counts, 0), 0)
        own = (count + BLOCK_M - 1) // BLOCK_M
        for b0 in range(0, own, CHUNK):
            j = b0 + tl.arange(0, CHUNK)
            tl.store(BLOCK_EXPERT + first + j, (j * 0 + e).to(tl.int32), mask=j < own)
            tl.store(BLOCK_ROWS + first + j, tl.minimum(count - j * BLOCK_M, BLOCK_M), mask=j < own)
        seen = count * 0
        for start in range(0, n_assign, CHUNK):
            a = start + tl.arange(0, CHUNK)
            hit = (tl.load(IDS + a, mask=a < n_assign, other=-1) == e).to(tl.int32)
            rank = tl.cumsum(hit, 0) - 1 + seen
            tl.store(ROW_ASSIGN + first * BLOCK_M + rank, a.to(tl.int32), mask=hit > 0)
            seen += tl.sum(hit, 0)
        if e == n_experts - 1:
            used = tl.sum(blocks, 0)
            for b0 in range(used, n_blocks, CHUNK):
                b = b0 + tl.arange(0, CHUNK)
                tl.store(BLOCK_EXPERT + b, (b * 0 + n_experts).to(tl.int32), mask=b < n_blocks)
                tl.store(BLOCK_ROWS + b, b * 0, mask=b < n_blocks)

    @triton.jit
    def _gate_up_kernel(
        X, WGU, INTER, BLOCK_EXPERT, BLOCK_ROWS, ROW_ASSIGN, hidden, inter_size,
        stride_x, stride_we, stride_wn, stride_i,
        TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        DOT: tl.constexpr, FP32_DOT: tl.constexpr,
    ):
        """grid (blocks, I / BLOCK_N): INTER[row] = silu(x[token] @ gate.T) * (x[token] @ up.T).
        DOT: tensor-core tiles (BLOCK_M >= 16); else a CUDA-core GEMV (sum of fp32 products over
        [BLOCK_M, BLOCK_N, BLOCK_K]) for the 1-4 rows an expert holds in small trees."""
        blk = tl.program_id(0)
        rows = tl.load(BLOCK_ROWS + blk)
        if rows > 0:
            e = tl.load(BLOCK_EXPERT + blk).to(tl.int64)
            m = tl.arange(0, BLOCK_M)
            valid = m < rows
            assign = tl.load(ROW_ASSIGN + blk * BLOCK_M + m, mask=valid, other=0)
            token = tl.where(valid, assign // TOP_K, 0)
            n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = n < inter_size
            # 64-bit scalar bases, 32-bit tile offsets (the wrapper checks they fit): 64-bit
            # pointer tiles cost ~40 registers more, and registers decide the streaming speed
            w_gate = WGU + e * stride_we
            w_up = w_gate + inter_size * stride_wn
            n_off = n * stride_wn
            acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k0 in range(0, hidden, BLOCK_K):
                k = k0 + tl.arange(0, BLOCK_K)
                k_ok = k < hidden
                if DOT:
                    a = tl.load(X + token[:, None] * stride_x + k[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
                    offs = n_off[None, :] + k[:, None]
                    wg = tl.load(w_gate + offs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                    wu = tl.load(w_up + offs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                    if FP32_DOT:
                        a = a.to(tl.float32)
                        acc_g = tl.dot(a, wg.to(tl.float32), acc_g, input_precision="ieee")
                        acc_u = tl.dot(a, wu.to(tl.float32), acc_u, input_precision="ieee")
                    else:
                        acc_g = tl.dot(a, wg, acc_g)
                        acc_u = tl.dot(a, wu, acc_u)
                else:  # weights loaded as [1, BLOCK_N, BLOCK_K] (K contiguous, coalesced), x as
                    # [BLOCK_M, 1, BLOCK_K]: the product is laid out as the loads, no conversion
                    a3 = tl.load(X + token[:, None, None] * stride_x + k[None, None, :],
                                 mask=valid[:, None, None] & k_ok[None, None, :], other=0.0).to(tl.float32)
                    w_mask = n_ok[None, :, None] & k_ok[None, None, :]
                    offs = n_off[None, :, None] + k[None, None, :]
                    wg = tl.load(w_gate + offs, mask=w_mask, other=0.0)
                    wu = tl.load(w_up + offs, mask=w_mask, other=0.0)
                    acc_g += tl.sum(a3 * wg.to(tl.float32), 2)
                    acc_u += tl.sum(a3 * wu.to(tl.float32), 2)
            dt = INTER.dtype.element_ty
            g = acc_g.to(dt).to(tl.float32)
            u = acc_u.to(dt).to(tl.float32)
            s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
            out = (s * u).to(dt)
            r = blk * BLOCK_M + m
            tl.store(INTER + r[:, None] * stride_i + n[None, :], out, mask=valid[:, None] & n_ok[None, :])

    @triton.jit
    def _down_kernel(
        INTER, WD, RW, OUT, BLOCK_EXPERT, BLOCK_ROWS, ROW_ASSIGN, hidden, inter_size,
        stride_i, stride_we, stride_wn, stride_o,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr,
        FP32_DOT: tl.constexpr,
    ):
        """grid (blocks, H / BLOCK_N): OUT[assignment] = (INTER[row] @ down.T) * weight (DOT as in
        _gate_up_kernel)."""
        blk = tl.program_id(0)
        rows = tl.load(BLOCK_ROWS + blk)
        if rows > 0:
            e = tl.load(BLOCK_EXPERT + blk).to(tl.int64)
            m = tl.arange(0, BLOCK_M)
            valid = m < rows
            assign = tl.where(valid, tl.load(ROW_ASSIGN + blk * BLOCK_M + m, mask=valid, other=0), 0)
            n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = n < hidden
            r = blk * BLOCK_M + m
            w = WD + e * stride_we  # scalar base, 32-bit offsets as in _gate_up_kernel
            n_off = n * stride_wn
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k0 in range(0, inter_size, BLOCK_K):
                k = k0 + tl.arange(0, BLOCK_K)
                k_ok = k < inter_size
                if DOT:
                    a = tl.load(INTER + r[:, None] * stride_i + k[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
                    b = tl.load(w + n_off[None, :] + k[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                    if FP32_DOT:
                        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
                    else:
                        acc = tl.dot(a, b, acc)
                else:  # as in _gate_up_kernel: 3-D loads, [BLOCK_M, 1, K] x [1, BLOCK_N, K]
                    a3 = tl.load(INTER + r[:, None, None] * stride_i + k[None, None, :],
                                 mask=valid[:, None, None] & k_ok[None, None, :], other=0.0).to(tl.float32)
                    b = tl.load(w + n_off[None, :, None] + k[None, None, :], mask=n_ok[None, :, None] & k_ok[None, None, :], other=0.0)
                    acc += tl.sum(a3 * b.to(tl.float32), 2)
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
    B = max_blocks(T*k, E, block_m). Entries of row_assign past a block's valid rows are unset.
    Two launches of E programs each (count, then place): no single-program pass over the rows."""
    _check_triton()
    n_assign = ids.numel()
    n_blocks = max_blocks(n_assign, num_experts, block_m)
    dev = ids.device
    flat = ids.reshape(-1)
    counts = torch.empty(num_experts, dtype=torch.int32, device=dev)
    block_expert = torch.empty(n_blocks, dtype=torch.int32, device=dev)
    block_rows = torch.empty(n_blocks, dtype=torch.int32, device=dev)
    row_assign = torch.empty(n_blocks * block_m, dtype=torch.int32, device=dev)
    # An AR step (8 assignments) takes one 16-wide step, a 256-row tree 8 steps of 256.
    chunk = min(GROUP_CHUNK, max(16, triton.next_power_of_2(max(n_assign, n_blocks))))
    _count_kernel[(num_experts,)](flat, counts, n_assign, CHUNK=chunk)
    _place_kernel[(num_experts,)](
        flat, counts, block_expert, block_rows, row_assign, n_assign, n_blocks, num_experts,
        BLOCK_M=block_m, BLOCK_E=triton.next_power_of_2(num_experts), CHUNK=chunk,
    )
    return block_expert, block_rows, row_assign


def moe_block_triton(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    norm_topk_prob: bool,
    *,
    tile: MoeTile | None = None,
) -> torch.Tensor:
    """The sparse MoE block (same contract as reference.moe_block_ref) on x [T, H]; tile defaults
    to the size class's (choose_tile)."""
    _check_triton()
    t, hidden = x.shape
    num_experts, two_i, _ = gate_up.shape
    inter_size = two_i // 2
    x = x if x.stride(-1) == 1 else x.contiguous()
    n_assign = t * top_k
    tile = tile or choose_tile(n_assign)
    bm = tile.block_m
    # The GEMM kernels index rows with 32-bit offsets (x, the intermediate rows, the per-slot rows,
    # within one expert's weights); a shape check on the host, no device read.
    spans = (t * x.stride(0), max_blocks(n_assign, num_experts, bm) * bm * inter_size, n_assign * hidden, two_i * hidden)
    if max(spans) >= 2**31:
        raise ValueError(f"{t} tokens are too many for one MoE call (32-bit offsets): split the chunk")
    weights, ids = moe_route_triton(F.linear(x, router_weight), top_k, norm_topk_prob, x.dtype)
    block_expert, block_rows, row_assign = moe_group_triton(ids, num_experts, bm)
    n_blocks = block_expert.numel()
    # Products in full fp32 (no TF32) for fp32 inputs. Under the interpreter bf16/fp16 operands are
    # upcast first: its low-precision tl.dot returns garbage (triton 3.9), and bf16 x bf16 products
    # are exact in fp32 anyway, so the result is the tensor-core one.
    fp32_dot = x.dtype == torch.float32 or _interpreting()
    launch = dict(num_warps=tile.num_warps, num_stages=tile.num_stages)
    inter = torch.empty(n_blocks * bm, inter_size, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(n_blocks, triton.cdiv(inter_size, tile.gate_up_n))](
        x, gate_up, inter, block_expert, block_rows, row_assign, hidden, inter_size,
        x.stride(0), gate_up.stride(0), gate_up.stride(1), inter.stride(0),
        TOP_K=top_k, BLOCK_M=bm, BLOCK_N=tile.gate_up_n, BLOCK_K=tile.block_k, DOT=tile.dot,
        FP32_DOT=fp32_dot, **launch,
    )
    per_slot = torch.empty(n_assign, hidden, dtype=x.dtype, device=x.device)
    _down_kernel[(n_blocks, triton.cdiv(hidden, tile.down_n))](
        inter, down, weights, per_slot, block_expert, block_rows, row_assign, hidden, inter_size,
        inter.stride(0), down.stride(0), down.stride(1), per_slot.stride(0),
        BLOCK_M=bm, BLOCK_N=tile.down_n, BLOCK_K=tile.block_k, DOT=tile.dot, FP32_DOT=fp32_dot, **launch,
    )
    # Fixed-order sum over the k slots (fp32 accumulation, one rounding): deterministic.
    return per_slot.view(t, top_k, hidden).sum(dim=1)


def moe_block(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    norm_topk_prob: bool,
) -> torch.Tensor:
    """Sparse MoE block: the fused Triton path on CUDA tensors, the torch reference elsewhere."""
    if x.is_cuda and triton is not None and not x.requires_grad:
        return moe_block_triton(x, router_weight, gate_up, down, top_k, norm_topk_prob)
    return moe_block_ref(x, router_weight, gate_up, down, top_k, norm_topk_prob)


__all__ = ["MoeTile", "TILES", "choose_tile", "max_blocks", "moe_block", "moe_block_triton", "moe_group_triton", "moe_route_triton"]

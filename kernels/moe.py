"""Fused sparse MoE block (Qwen3 MoE) for CUDA: router, routing + grouping, two grouped GEMMs, combine.

    logits  = x @ router.T        bf16/fp16: kernels/matmul.py's batch-invariant linear_triton
                                  (fp32: F.linear, the oracle path, as engine/layers.py::linear)
    route   : one launch of ceil(T / ROUTE_TOKENS) programs, each routing ROUTE_TOKENS tokens
              (fp32 softmax, top-k by repeated argmax, lowest id on ties, renormalised; weights
              rounded to x's dtype) and counting its (token, slot) assignments per expert. With
              one program (T <= ROUTE_TOKENS: AR steps, small trees) that program also groups
              the rows; otherwise a second launch (`_place_kernel`, same program count) does.
    group   : the T*k assignments sorted by expert (tokens in order within one), each expert's
              run padded to a multiple of BLOCK_M rows; a block of BLOCK_M rows is one expert's
    gate_up : per block, rows of x gathered by token, times that expert's [2I, H] weight,
              silu(gate) * up fused into the epilogue -> one intermediate row per assignment
    down    : per block, intermediate rows times the expert's [H, I] weight, times the routing
              weight, written to the assignment's own row [T*k, H]
    combine : out[t] = the k slot rows of t summed in slot order in fp32, rounded once (no atomics)

Batch-invariant: a token's output bits do not depend on how many tokens share the call or on
what they route to, so a tree node verified among N rows computes bitwise what the AR step for
the same token computes (issue 13; docs/DESIGN.md). What fixes a row's arithmetic:
  * the router logits: linear_triton (one reduction order per weight shape, never from M);
  * routing: per token, on a [ROUTE_TOKENS, E] tile whose rows do not interact;
  * the expert GEMMs: one tile (`TILE`: BLOCK_M = 16 rows, tensor cores, K walked in BLOCK_K
    steps from a zero fp32 accumulator, no split-K) for every row count. An expert's 1 row in
    an AR step sits in a 16-row tile with 15 masked rows (zeros, no memory requests): the MMA
    work is wasted, but at few rows the block only streams weights. A row's result does not
    depend on its place in the tile (each MMA output element comes from its own row and
    column), nor on the tile's other rows. BLOCK_M = 16 keeps Triton on mma.sync (wgmma needs
    64-row tiles, and may round differently);
  * the epilogues (roundings, SiLU, routing weight) are per element; the combine is per token.
The previous kernel picked CUDA-core GEMV tiles for 1-4 rows an expert and tensor-core tiles
beyond, so a token's bits depended on the call's size; scripts/gpu-lease/moe_kernel_bench.py
--old FILE times it beside this one.

Every shape (grids included) depends on T, k and E only: the number of blocks is bounded by
ceil(T*k / BLOCK_M) + min(E, T*k), and blocks past the real count see 0 valid rows and return.
No host sync anywhere, so the whole block lives in a CUDA graph. Launches: linear_triton's one
or two (two when it splits K, as at T = 1), route (+ place when T > ROUTE_TOKENS), gate_up,
down, combine: 6 at T = 1 (the previous kernel: 7).

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
from .matmul import linear_triton
from .reference import moe_block_ref

try:  # triton is optional: CPU-only installs use the torch reference.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None

BLOCK_M = 16  # rows per expert block, for every row count (module docstring: batch invariance)
ROUTE_TOKENS = 16  # tokens per routing program; one program (routing + grouping) up to this many
COUNT_CHUNK = 32  # routing programs' counts read per step of the layout pass
BLOCK_CHUNK = 128  # blocks of the block table written per step
COMBINE_BLOCK = 1024  # hidden columns per combine program


@dataclass(frozen=True)
class MoeTile:
    """Launch shape of the two grouped GEMMs (BLOCK_M rows each). block_k sets where the K walk
    splits into tl.dot calls; the N widths, warps and stages only split the same per-element MMA
    steps differently. One tile for every row count (module docstring)."""

    gate_up_n: int  # intermediate columns per gate/up program (two accumulators: gate and up)
    down_n: int  # hidden columns per down program
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


# At T = 1 (Qwen3-30B-A3B: 8 experts of 2x768x2048 gate/up and 2048x768 down): 9 blocks x 24
# gate/up programs (192 with a row, each streaming 2 x 32 x 2048 weights) and 9 x 32 down
# programs, each with 3 stages of 128-deep K steps in flight. Picked by the sweep on an H200
# (session 8; mean 1.43x the expert-bytes bound over 1-256 rows, 1.45x for down_n 32; every
# candidate 2.3-2.7x at one row). Re-tune with
#     python scripts/gpu-lease/moe_kernel_bench.py --sweep   (prints the TILE line to paste here)
TILE = MoeTile(gate_up_n=32, down_n=64, block_k=128, num_warps=4, num_stages=3)


def max_blocks(assignments: int, num_experts: int, block_m: int = BLOCK_M) -> int:
    """Upper bound on the padded blocks: each used expert adds at most one partial block."""
    return -(-assignments // block_m) + min(num_experts, assignments)


@dataclass(frozen=True)
class MoeRouting:
    """Routing and grouping of T tokens over E experts (all on the device, fixed shapes).

    weights / ids: [T, k], best first (x's dtype / int32). block_expert / block_rows: [B] for
    B = max_blocks(T*k, E): the expert of each block and its valid rows (used blocks first,
    experts ascending; the unused tail has expert E and 0 rows). row_assign: [B * BLOCK_M], the
    assignment t*k + slot in each valid row (unset past a block's valid rows)."""

    weights: torch.Tensor
    ids: torch.Tensor
    block_expert: torch.Tensor
    block_rows: torch.Tensor
    row_assign: torch.Tensor


if triton is not None:

    @triton.jit
    def _route_tile(LOGITS, IDS, W, t0, n_tokens, n_experts, stride_l,
                    TOP_K: tl.constexpr, NORM: tl.constexpr, RT: tl.constexpr, BLOCK_E: tl.constexpr,
                    BLOCK_TOP: tl.constexpr):
        """Tokens t0..t0+RT: fp32 softmax over the experts, top-k by repeated argmax (lowest id
        on ties), renormalised; stores ids (int32) and weights (W's dtype). Returns sel [RT, E]:
        slot + 1 where a token picked an expert, else 0 (0 for rows past n_tokens)."""
        t = t0 + tl.arange(0, RT)
        t_ok = t < n_tokens
        e = tl.arange(0, BLOCK_E)
        e_ok = e < n_experts
        logits = tl.load(LOGITS + t[:, None].to(tl.int64) * stride_l + e[None, :],
                         mask=t_ok[:, None] & e_ok[None, :], other=0.0).to(tl.float32)
        logits = tl.where(e_ok[None, :], logits, float("-inf"))
        p = tl.exp(logits - tl.max(logits, 1)[:, None])
        p = p / tl.sum(p, 1)[:, None]
        p = tl.where(e_ok[None, :], p, -1.0)
        slots = tl.arange(0, BLOCK_TOP)
        top_w = tl.zeros([RT, BLOCK_TOP], dtype=tl.float32)
        top_i = tl.zeros([RT, BLOCK_TOP], dtype=tl.int32)
        sel = tl.zeros([RT, BLOCK_E], dtype=tl.int32)
        for j in tl.static_range(TOP_K):
            best = tl.max(p, 1)
            idx = tl.min(tl.where(p == best[:, None], e[None, :], BLOCK_E), 1)
            top_w = tl.where(slots[None, :] == j, best[:, None], top_w)
            top_i = tl.where(slots[None, :] == j, idx[:, None], top_i)
            picked = e[None, :] == idx[:, None]
            sel = tl.where(picked, j + 1, sel)
            p = tl.where(picked, -1.0, p)
        if NORM:
            top_w = top_w / tl.sum(top_w, 1)[:, None]
        out = t[:, None] * TOP_K + slots[None, :]
        ok = t_ok[:, None] & (slots[None, :] < TOP_K)
        tl.store(IDS + out, top_i, mask=ok)
        tl.store(W + out, top_w.to(W.dtype.element_ty), mask=ok)
        return tl.where(t_ok[:, None], sel, 0)

    @triton.jit
    def _place_tile(ROW_ASSIGN, sel, t0, before, first, TOP_K: tl.constexpr, RT: tl.constexpr, BLOCK_M: tl.constexpr):
        """Padded rows of the tile's assignments: expert e's run starts at block first[e]; the tile's
        rows of e follow the `before[e]` rows of e in earlier tiles, tokens in order."""
        hit = (sel > 0).to(tl.int32)
        rank = tl.cumsum(hit, 0) - hit  # earlier tokens of this tile on the same expert
        row = first[None, :] * BLOCK_M + before[None, :] + rank
        t = t0 + tl.arange(0, RT)
        tl.store(ROW_ASSIGN + row, t[:, None] * TOP_K + sel - 1, mask=hit > 0)

    @triton.jit
    def _write_blocks(BLOCK_EXPERT, BLOCK_ROWS, total, first, b_start, b_end, n_experts,
                      BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr):
        """Blocks b_start..b_end of the table: each block's expert and valid rows, from the
        experts' row totals and first blocks (ascending); blocks past the used ones get expert
        n_experts and 0 rows."""
        blocks = (total + BLOCK_M - 1) // BLOCK_M
        end = first + blocks
        used = tl.sum(blocks, 0)
        e = tl.arange(0, BLOCK_E)
        for b0 in range(b_start, b_end, CHUNK):
            b = b0 + tl.arange(0, CHUNK)
            owner = tl.sum((end[None, :] <= b[:, None]).to(tl.int32), 1)  # experts ending before b
            mine = e[None, :] == owner[:, None]
            rows = tl.sum(tl.where(mine, total[None, :], 0), 1) - (b - tl.sum(tl.where(mine, first[None, :], 0), 1)) * BLOCK_M
            live = b < used
            b_ok = b < b_end
            tl.store(BLOCK_EXPERT + b, tl.where(live, owner, n_experts), mask=b_ok)
            tl.store(BLOCK_ROWS + b, tl.where(live, tl.minimum(rows, BLOCK_M), 0), mask=b_ok)

    @triton.jit
    def _route_kernel(
        LOGITS, IDS, W, COUNTS, BLOCK_EXPERT, BLOCK_ROWS, ROW_ASSIGN, n_tokens, n_experts, n_blocks, stride_l,
        TOP_K: tl.constexpr, NORM: tl.constexpr, RT: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_TOP: tl.constexpr,
        BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, PLACE: tl.constexpr,
    ):
        """grid (ceil(T / RT),): route RT tokens. PLACE (a single program holds every token): also
        lay out the blocks and rows. Else store this tile's counts per expert, COUNTS[p, E], for
        _place_kernel."""
        p = tl.program_id(0)
        sel = _route_tile(LOGITS, IDS, W, p * RT, n_tokens, n_experts, stride_l, TOP_K, NORM, RT, BLOCK_E, BLOCK_TOP)
        counts = tl.sum((sel > 0).to(tl.int32), 0)
        if PLACE:
            blocks = (counts + BLOCK_M - 1) // BLOCK_M
            first = tl.cumsum(blocks, 0) - blocks
            _place_tile(ROW_ASSIGN, sel, 0, counts * 0, first, TOP_K, RT, BLOCK_M)
            _write_blocks(BLOCK_EXPERT, BLOCK_ROWS, counts, first, 0, n_blocks, n_experts, BLOCK_E, BLOCK_M, CHUNK)
        else:
            e = tl.arange(0, BLOCK_E)
            tl.store(COUNTS + p * BLOCK_E + e, counts)

    @triton.jit
    def _place_kernel(
        IDS, COUNTS, BLOCK_EXPERT, BLOCK_ROWS, ROW_ASSIGN, n_tokens, n_experts, n_blocks, blocks_per_program,
        TOP_K: tl.constexpr, RT: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_TOP: tl.constexpr,
        BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, COUNT_CHUNK: tl.constexpr,
    ):
        """grid (ceil(T / RT),), after _route_kernel: program p sums the tiles' counts (each
        expert's rows, and its rows in tiles before p), places tile p's assignments and writes
        its share of the block table."""
        p = tl.program_id(0)
        n_tiles = tl.num_programs(0)
        e = tl.arange(0, BLOCK_E)
        total = tl.zeros([BLOCK_E], dtype=tl.int32)
        before = tl.zeros([BLOCK_E], dtype=tl.int32)
        for q0 in range(0, n_tiles, COUNT_CHUNK):
            q = q0 + tl.arange(0, COUNT_CHUNK)
            c = tl.load(COUNTS + q[:, None] * BLOCK_E + e[None, :], mask=(q < n_tiles)[:, None], other=0)
            total += tl.sum(c, 0)
            before += tl.sum(tl.where((q < p)[:, None], c, 0), 0)
        blocks = (total + BLOCK_M - 1) // BLOCK_M
        first = tl.cumsum(blocks, 0) - blocks
        # tile p's picks, as _route_tile returned them: slot + 1 per (token, expert)
        t = p * RT + tl.arange(0, RT)
        slots = tl.arange(0, BLOCK_TOP)
        ids = tl.load(IDS + t[:, None] * TOP_K + slots[None, :], mask=(t < n_tokens)[:, None] & (slots < TOP_K)[None, :], other=-1)
        sel = tl.max(tl.where(ids[:, :, None] == e[None, None, :], slots[None, :, None] + 1, 0), 1)
        _place_tile(ROW_ASSIGN, sel, p * RT, before, first, TOP_K, RT, BLOCK_M)
        b_start = p * blocks_per_program
        _write_blocks(BLOCK_EXPERT, BLOCK_ROWS, total, first, b_start, tl.minimum(b_start + blocks_per_program, n_blocks),
                      n_experts, BLOCK_E, BLOCK_M, CHUNK)

    @triton.jit
    def _gate_up_kernel(
        X, WGU, INTER, BLOCK_EXPERT, BLOCK_ROWS, ROW_ASSIGN, hidden, inter_size,
        stride_x, stride_we, stride_wn, stride_i,
        TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
    ):
        """grid (blocks, I / BLOCK_N): INTER[row] = silu(x[token] @ gate.T) * (x[token] @ up.T)."""
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
                # padding rows are masked out of the x loads: zeros, no memory requests
                a = tl.load(X + token[:, None] * stride_x + k[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
                offs = n_off[None, :] + k[:, None]
                wg = tl.load(w_gate + offs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                wu = tl.load(w_up + offs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                if UPCAST:
                    a = a.to(tl.float32)
                    acc_g = tl.dot(a, wg.to(tl.float32), acc_g, input_precision="ieee")
                    acc_u = tl.dot(a, wu.to(tl.float32), acc_u, input_precision="ieee")
                else:
                    acc_g = tl.dot(a, wg, acc_g)
                    acc_u = tl.dot(a, wu, acc_u)
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
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
    ):
        """grid (blocks, H / BLOCK_N): OUT[assignment] = (INTER[row] @ down.T) * weight."""
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
                a = tl.load(INTER + r[:, None] * stride_i + k[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
                b = tl.load(w + n_off[None, :] + k[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                if UPCAST:
                    acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
                else:
                    acc = tl.dot(a, b, acc)
            dt = OUT.dtype.element_ty
            weight = tl.load(RW + assign, mask=valid, other=0.0).to(tl.float32)
            y = (acc.to(dt).to(tl.float32) * weight[:, None]).to(dt)
            tl.store(OUT + assign[:, None] * stride_o + n[None, :], y, mask=valid[:, None] & n_ok[None, :])

    @triton.jit
    def _combine_kernel(PER_SLOT, OUT, hidden, stride_o, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
        """grid (T, H / BLOCK): out[t] = per_slot rows t*k .. t*k+k-1 added in slot order in fp32
        (from zero), rounded once."""
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = h < hidden
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for j in tl.static_range(TOP_K):
            acc += tl.load(PER_SLOT + (t * TOP_K + j) * hidden + h, mask=ok, other=0.0).to(tl.float32)
        tl.store(OUT + t * stride_o + h, acc.to(OUT.dtype.element_ty), mask=ok)


# ----------------------------------------------------------------------------- wrappers


def _check_triton() -> None:
    if triton is None:
        raise RuntimeError("triton is not installed")


def router_logits(x: torch.Tensor, router_weight: torch.Tensor) -> torch.Tensor:
    """x [T, H] @ router [E, H].T in x's dtype: the batch-invariant linear_triton for bf16/fp16
    (CUDA, or the interpreter), F.linear for fp32 (as engine/layers.py::linear)."""
    if x.dtype in (torch.bfloat16, torch.float16):
        return linear_triton(x, router_weight)
    return F.linear(x, router_weight)


def moe_route_triton(logits: torch.Tensor, top_k: int, norm_topk_prob: bool, dtype: torch.dtype) -> MoeRouting:
    """Router logits [T, E] -> MoeRouting: the top-k experts and weights (in dtype) of every token
    and the rows grouped by expert. One launch for T <= ROUTE_TOKENS, else two."""
    _check_triton()
    t, num_experts = logits.shape
    dev = logits.device
    n_blocks = max_blocks(t * top_k, num_experts)
    ids = torch.empty(t, top_k, dtype=torch.int32, device=dev)
    weights = torch.empty(t, top_k, dtype=dtype, device=dev)
    block_expert = torch.empty(n_blocks, dtype=torch.int32, device=dev)
    block_rows = torch.empty(n_blocks, dtype=torch.int32, device=dev)
    row_assign = torch.empty(n_blocks * BLOCK_M, dtype=torch.int32, device=dev)
    tiles = triton.cdiv(t, ROUTE_TOKENS)
    block_e, block_top = triton.next_power_of_2(num_experts), triton.next_power_of_2(top_k)
    counts = torch.empty(tiles, block_e, dtype=torch.int32, device=dev)
    shape = dict(TOP_K=top_k, RT=ROUTE_TOKENS, BLOCK_E=block_e, BLOCK_TOP=block_top, BLOCK_M=BLOCK_M, CHUNK=BLOCK_CHUNK)
    _route_kernel[(tiles,)](
        logits, ids, weights, counts, block_expert, block_rows, row_assign, t, num_experts, n_blocks, logits.stride(0),
        NORM=norm_topk_prob, PLACE=tiles == 1, **shape,
    )
    if tiles > 1:
        _place_kernel[(tiles,)](
            ids, counts, block_expert, block_rows, row_assign, t, num_experts, n_blocks, triton.cdiv(n_blocks, tiles),
            COUNT_CHUNK=COUNT_CHUNK, **shape,
        )
    return MoeRouting(weights, ids, block_expert, block_rows, row_assign)


def moe_block_triton(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    norm_topk_prob: bool,
    *,
    tile: MoeTile = TILE,
) -> torch.Tensor:
    """The sparse MoE block (same contract as reference.moe_block_ref) on x [T, H]. tile: for
    benchmarks and tests; the engine always runs TILE."""
    _check_triton()
    t, hidden = x.shape
    num_experts, two_i, _ = gate_up.shape
    inter_size = two_i // 2
    x = x if x.stride(-1) == 1 else x.contiguous()
    n_assign = t * top_k
    # The GEMM kernels index rows with 32-bit offsets (x, the intermediate rows, the per-slot rows,
    # within one expert's weights); a shape check on the host, no device read.
    spans = (t * x.stride(0), max_blocks(n_assign, num_experts) * BLOCK_M * inter_size, n_assign * hidden, two_i * hidden)
    if max(spans) >= 2**31:
        raise ValueError(f"{t} tokens are too many for one MoE call (32-bit offsets): split the chunk")
    routing = moe_route_triton(router_logits(x, router_weight), top_k, norm_topk_prob, x.dtype)
    n_blocks = routing.block_expert.numel()
    # Products in full fp32 (no TF32) for fp32 inputs. Under the interpreter bf16/fp16 operands are
    # upcast first: its low-precision tl.dot returns garbage (triton 3.9), and bf16 x bf16 products
    # are exact in fp32 anyway, so the result is the tensor-core one.
    upcast = x.dtype == torch.float32 or _interpreting()
    launch = dict(num_warps=tile.num_warps, num_stages=tile.num_stages)
    groups = (routing.block_expert, routing.block_rows, routing.row_assign)
    inter = torch.empty(n_blocks * BLOCK_M, inter_size, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(n_blocks, triton.cdiv(inter_size, tile.gate_up_n))](
        x, gate_up, inter, *groups, hidden, inter_size, x.stride(0), gate_up.stride(0), gate_up.stride(1), inter.stride(0),
        TOP_K=top_k, BLOCK_M=BLOCK_M, BLOCK_N=tile.gate_up_n, BLOCK_K=tile.block_k, UPCAST=upcast, **launch,
    )
    per_slot = torch.empty(n_assign, hidden, dtype=x.dtype, device=x.device)
    _down_kernel[(n_blocks, triton.cdiv(hidden, tile.down_n))](
        inter, down, routing.weights, per_slot, *groups, hidden, inter_size,
        inter.stride(0), down.stride(0), down.stride(1), per_slot.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=tile.down_n, BLOCK_K=tile.block_k, UPCAST=upcast, **launch,
    )
    out = torch.empty(t, hidden, dtype=x.dtype, device=x.device)
    _combine_kernel[(t, triton.cdiv(hidden, COMBINE_BLOCK))](per_slot, out, hidden, out.stride(0), TOP_K=top_k, BLOCK=COMBINE_BLOCK)
    return out


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


__all__ = ["BLOCK_M", "MoeRouting", "MoeTile", "ROUTE_TOKENS", "TILE", "max_blocks", "moe_block", "moe_block_triton",
           "moe_route_triton", "router_logits"]

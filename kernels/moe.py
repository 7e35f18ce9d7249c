"""Fused sparse MoE block (Qwen3 MoE, gpt-oss) for CUDA: router, routing + grouping, two expert GEMMs, combine.

    router  : bf16/fp16: kernels/matmul.py's linear_partials, the batch-invariant linear_triton's
              split launch alone: fp32 sums of its K groups [G, T, E] (fp32 x: F.linear, the
              oracle path, as engine/layers.py::linear)
    route   : one launch, a program per token: its K-group sums added in group order and
              rounded (linear_triton's group-sum pass: the same logits bits, one launch fewer),
              then fp32 softmax, top-k by repeated argmax (lowest id on ties), renormalised;
              weights rounded to x's dtype. To group, each program also writes its picks (slot
              + 1 per expert) and a second launch (`_place_kernel`, a program per PLACE_TOKENS
              tokens or PLACE_BLOCKS blocks of the table) lays the rows out. The per-token
              path (T <= tile.token_rows) groups nothing.
    group   : the T*k assignments sorted by expert (tokens in order within one), each expert's
              run padded to a multiple of BLOCK_M rows; a block of BLOCK_M rows is one expert's
              (row_assign: row -> assignment)
    gate_up : per block, rows of x gathered by token, times that expert's [2I, H] weight,
              silu(gate) * up fused into the epilogue -> one intermediate row per assignment.
              Per-token path: a program per (assignment, gate_up_n columns), its expert read
              from the routing, one row in the tile -> intermediate row t*k + slot
    down    : T > tile.token_rows: per block, intermediate rows times the expert's [H, I]
              weight, times the routing weight, written to the assignment's own row [T*k, H];
    combine : out[t] = the k slot rows of t summed in slot order in fp32, rounded once (no atomics)
    down + combine, T <= tile.token_rows (AR steps, tiny trees): one launch, a program per
              (token, token_n hidden columns); one tl.dot a K step holds all k slots: row j of
              the 16-row A tile is slot j's intermediate row, columns j*token_n.. of B are slot
              j's expert's down rows, and slot j's result is the diagonal block (row j, its own
              columns). Then the same epilogue and the same slot-order fp32 sum as above.

Batch-invariant: a token's output bits do not depend on how many tokens share the call or on
what they route to, so a tree node verified among N rows computes bitwise what the AR step for
the same token computes (docs/DESIGN.md). What fixes a row's arithmetic:
  * the router logits: linear_triton's (one K-group split per weight shape, never from M; the
    groups added in order from zero in fp32 and rounded, here inside the routing programs);
  * routing: one token a program, the same [E] layout and warps at every T;
  * the expert GEMMs: BLOCK_M = 16 row tiles on tensor cores, K walked in tile.block_k steps
    from a zero fp32 accumulator, no split-K, for every row count and both down launches. An
    expert's 1 row in an AR step sits in a 16-row tile with 15 masked rows (zeros, no memory
    requests): the MMA work is wasted, but at few rows the block only streams weights. An MMA
    output element's bits depend on its own row of A and column of B only: not on the row's
    place in the tile, the other rows, the tile's width or the warps
    (tests/kernels/test_moe_kernel.py::test_gpu_mma_bits_ignore_row_place_and_tile_width checks
    it at the real shapes), which is what lets the per-token down compute a slot's row at row j
    of a tile k * token_n wide and get the grouped tile's bits. BLOCK_M = 16 keeps Triton on
    mma.sync (wgmma needs 64-row tiles, and may round differently);
  * the epilogues (roundings, SiLU, routing weight) are per element; the combine is per token,
    and the per-token down picks its diagonal out with a sum over -0.0 (x + -0.0 == x for
    every x), exactly.
tile.token_rows and the N widths, warps and stages are speed only; tile.block_k is part of the
numerics (the same at every row count). An earlier kernel picked CUDA-core GEMV tiles for 1-4
rows an expert and tensor-core tiles beyond, so a token's bits depended on the call's size.

Every shape (grids included) depends on T, k and E only: the number of blocks is bounded by
ceil(T*k / BLOCK_M) + min(E, T*k), and blocks past the real count see 0 valid rows and return.
No host sync anywhere, so the whole block lives in a CUDA graph. Launches: router, route,
gate_up, down + combine at T <= token_rows (4, AR steps: no grouping pass, no block table);
router, route, place, gate_up, down, combine past it (6).
benchmarks/moe_block.py times it against --old FILE (a previous kernels/moe.py) and
against its own grouped path at every row count.

Numerics follow transformers' Qwen3MoeExperts: gate/up and down GEMM outputs rounded to x's
dtype, silu in fp32 rounded, then * up, * weight (each rounded). What differs is the sum over
the k experts: transformers adds each expert's rows into a buffer in x's dtype (index_add_,
in expert order); here the k rows are summed in fp32 in slot order and rounded once. In fp32
the two agree to rounding; in bf16 ours is the more accurate one.

The plain-torch reference is kernels/reference.py::moe_block_ref (the CPU path and the tests' oracle).

gpt-oss (`moe_block_gpt_oss_triton`, oracle reference.py::moe_block_gpt_oss_ref, transformers'
GptOssTopKRouter / GptOssExperts) runs the same launches with constexpr options, each per element
or per token, so the invariance above holds unchanged: the router bias added to the fp32 logits
before their rounding (HAS_BIAS), the top-k logits then the fp32 softmax over those k
(TOPK_SOFTMAX); gate/up biases and the clamped SwiGLU in the gate/up epilogue (ACT = SWIGLU), every
step rounded to x's dtype as transformers computes it; the down bias added to the rounded down
result before the routing weight (HAS_BIAS). The GEMMs read the weights through their strides,
so gpt-oss's [E, H, 2I] interleaved gate/up and [E, I, H] down are used as stored.

Gemma 4 (`moe_block_gemma4_triton`, oracle reference.py::moe_block_gemma4_ref, transformers'
Gemma4TextRouter / Gemma4TextExperts) likewise: its router reads the residual stream, not the
experts' input: RMS-normalized times its `scale` (fused.py's batch-invariant rms_norm, one row a
program) times H^-0.5, then router_partials as above; Qwen3's softmax routing renormalised, each
weight times its expert's per_expert_scale in fp32 (EXPERT_SCALE; the weights stay fp32 as
transformers keeps them, the down epilogue multiplies by them unrounded); gelu-tanh times up in
the gate/up epilogue (ACT = GELU_TANH, rounded as torch's gelu in x's dtype). Qwen3's weight
layout, so the GEMMs are Qwen3's. Every option is per element or per token: invariant as above.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .fused import rms_norm
from .launch import interpreting, launch_args, wait_for_previous
from .matmul import linear_partials, linear_triton
from .reference import moe_block_gemma4_ref, moe_block_gpt_oss_ref, moe_block_ref

try:  # triton is optional: CPU-only installs use the torch reference.
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None
    libdevice = None

BLOCK_M = 16  # rows per expert block, for every row count (module docstring: batch invariance)
PLACE_TOKENS = 16  # tokens a grouping program places
# Tokens' pick rows (int8) read per step of the grouping pass: every grouping program reads all
# T rows. (H200, T = 256: 8 warps and 128-row steps made the pass 16 us, from 7 with 4 and 32.)
COUNT_CHUNK = 64
# Blocks of the block table a grouping program writes, at most: more programs than tokens need
# when the table is long (T = 16, Qwen3-30B-A3B: 136 blocks, 9 programs), each one [16, E] step.
PLACE_BLOCKS = 16
# The routing programs' warps: a program routes one token, ~20 dependent reductions over [E].
# With one warp (E = 128: 4 experts a thread) every reduction stays in warp shuffles; the earlier
# 16-token tiles needed 8 warps (9.0 us at one token on the H200: 64 values a thread with 1 warp
# spilled). The float sums (softmax, renormalisation) follow the layout, so one value for all T.
ROUTE_WARPS = 1
COMBINE_BLOCK = 1024  # hidden columns per combine program
SILU, SWIGLU, GELU_TANH = 0, 1, 2  # the gate/up epilogue's activation (_gate_up_kernel's ACT)


@dataclass(frozen=True)
class MoeTile:
    """Launch shape of the expert GEMMs (BLOCK_M rows each). block_k sets where the K walk
    splits into tl.dot calls; the N widths, warps, stages and token_rows only split the same
    per-element MMA steps differently. One block_k for every row count (module docstring)."""

    gate_up_n: int  # intermediate columns per gate/up program (two accumulators: gate and up)
    down_n: int  # hidden columns per grouped down program
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    # Up to token_rows tokens, down and combine are one launch (`_down_combine_kernel`): a program
    # per (token, token_n hidden columns) runs all k slots in one tl.dot, token_n columns each,
    # with its own warps and pipeline depth. 0: the grouped down + combine at every row count.
    token_rows: int = 4
    token_n: int = 16
    token_warps: int = 4
    token_stages: int = 3


# At T = 1 (Qwen3-30B-A3B: 8 experts of 2x768x2048 gate/up and 2048x768 down): 9 blocks x 24
# gate/up programs (192 with a row, each streaming 2 x 32 x 2048 weights), then 128 per-token
# down programs, each streaming 8 experts x 16 rows x 768 (one [128, 128] weight tile a K step,
# 2 in flight). Picked by the sweep on an H200 (`bf16_exact.sh moe-tune`): of 8
# per-token knob sets the first guess (16 columns, 4 warps, 3 stages) was best at rows 1-4;
# per-token beats grouped up to 4 rows (token_rows); of 8 grouped tiles, 4 stages (mean 1.38x the
# expert-bytes bound over 1-256 rows) beat the earlier 3 (1.40x): per layer 0.94-0.98x at rows
# 1-4, 1.00x from 16, bitwise equal. Re-tune with
#     python benchmarks/moe_block.py --sweep   (prints the TILE line to paste here)
TILE = MoeTile(gate_up_n=32, down_n=64, block_k=128, num_warps=4, num_stages=4,
               token_rows=4, token_n=16, token_warps=4, token_stages=3)


def max_blocks(assignments: int, num_experts: int, block_m: int = BLOCK_M) -> int:
    """Upper bound on the padded blocks: each used expert adds at most one partial block."""
    return -(-assignments // block_m) + min(num_experts, assignments)


@dataclass(frozen=True)
class MoeRouting:
    """Routing and grouping of T tokens over E experts (all on the device, fixed shapes).

    weights / ids: [T, k], best first (x's dtype / int32). The grouping (None when not asked for:
    the per-token path needs none): block_expert / block_rows: [B] for B = max_blocks(T*k, E), the
    expert of each block and its valid rows (used blocks first, experts ascending; the unused tail
    has expert E and 0 rows); row_assign: [B * BLOCK_M], the assignment t*k + slot in each valid
    row (unset past a block's valid rows)."""

    weights: torch.Tensor
    ids: torch.Tensor
    block_expert: torch.Tensor | None = None
    block_rows: torch.Tensor | None = None
    row_assign: torch.Tensor | None = None


if triton is not None:

    @triton.jit
    def _token_logits(LOGITS, BIAS, t, e, e_ok, n_tokens, stride_l, DT: tl.constexpr, GROUPS: tl.constexpr,
                      HAS_BIAS: tl.constexpr):
        """Token t's [E] router logits in fp32. GROUPS = 0: LOGITS is [T, E]. Else it is
        linear_partials' [GROUPS, T, E] fp32 K-group sums, added here in group order from zero and
        rounded to DT: linear_triton's group-sum pass, the same adds, so the same logits bits (one
        launch fewer). HAS_BIAS (gpt-oss): the router bias [E] added once to the fp32 total before
        the rounding, as linear_triton adds a bias."""
        row = t.to(tl.int64)
        if GROUPS == 0:
            total = tl.load(LOGITS + row * stride_l + e, mask=e_ok, other=0.0).to(tl.float32)
        else:
            total = tl.zeros(e.shape, dtype=tl.float32)
            for g in tl.static_range(GROUPS):
                total += tl.load(LOGITS + (g * n_tokens + row) * stride_l + e, mask=e_ok, other=0.0)
        if HAS_BIAS:
            total += tl.load(BIAS + e, mask=e_ok, other=0.0).to(tl.float32)
        return total.to(DT).to(tl.float32)

    @triton.jit
    def _route_kernel(
        LOGITS, BIAS, SCALE, IDS, W, PICKS, n_tokens, n_experts, stride_l,
        TOP_K: tl.constexpr, NORM: tl.constexpr, GROUPS: tl.constexpr, BLOCK_E: tl.constexpr,
        BLOCK_TOP: tl.constexpr, GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, TOPK_SOFTMAX: tl.constexpr,
        EXPERT_SCALE: tl.constexpr, DT: tl.constexpr, PDL: tl.constexpr,
    ):
        """grid (T,): token t = program_id. fp32 softmax over the experts, top-k by repeated argmax
        (lowest id on ties), renormalised; stores ids (int32) and weights (W's dtype).
        TOPK_SOFTMAX (gpt-oss): the top-k of the logits themselves, then the fp32 softmax over
        those k only (NORM unused). EXPERT_SCALE (Gemma 4): each kept weight times its expert's
        SCALE[e] in fp32 after the renormalisation. DT: the logits' dtype (x's); W may be wider
        (Gemma 4 keeps its weights in fp32, as transformers does). GROUP: also the token's picks as an int8 row PICKS[t, :BLOCK_E],
        slot + 1 per picked expert, else 0, for _place_kernel. Every program routes one token on
        the same [BLOCK_E] layout at every T, so a token's bits never depend on the call."""
        wait_for_previous(PDL)
        t = tl.program_id(0)
        e = tl.arange(0, BLOCK_E)
        e_ok = e < n_experts
        logits = _token_logits(LOGITS, BIAS, t, e, e_ok, n_tokens, stride_l, DT, GROUPS, HAS_BIAS)
        slots = tl.arange(0, BLOCK_TOP)
        ok = slots < TOP_K
        top_w = tl.zeros([BLOCK_TOP], dtype=tl.float32)
        top_i = tl.zeros([BLOCK_TOP], dtype=tl.int32)
        sel = tl.zeros([BLOCK_E], dtype=tl.int32)
        if TOPK_SOFTMAX:
            # NaN logits rank first (+inf), as torch.topk ranks NaN first: TOP_K real experts
            # whatever the token holds (the weights then come out NaN, as the reference's).
            score = tl.where(logits == logits, logits, float("inf"))
            free = e_ok
            for j in tl.static_range(TOP_K):
                best = tl.max(tl.where(free, score, float("-inf")), 0)
                idx = tl.min(tl.where(free & (score == best), e, BLOCK_E), 0)
                top_w = tl.where(slots == j, best, top_w)
                top_i = tl.where(slots == j, idx, top_i)
                picked = e == idx
                sel = tl.where(picked, j + 1, sel)
                free = free & (e != idx)
            top_w = tl.where(ok, top_w, float("-inf"))
            top_w = tl.exp(top_w - tl.max(top_w, 0))
            top_w = top_w / tl.sum(top_w, 0)
        else:
            logits = tl.where(e_ok, logits, float("-inf"))
            p = tl.exp(logits - tl.max(logits, 0))
            p = p / tl.sum(p, 0)
            # A token gone NaN upstream has NaN probabilities: rank them first (2.0 beats every
            # probability, lowest id on ties) so it still picks TOP_K real experts, as torch.topk
            # ranks NaN first. Unranked, `p == best` matched nothing and the id was BLOCK_E, past
            # the experts: the down kernels then read rows no one wrote (a benchmark fault found it).
            p = tl.where(p == p, p, 2.0)
            p = tl.where(e_ok, p, -1.0)
            for j in tl.static_range(TOP_K):
                best = tl.max(p, 0)
                idx = tl.min(tl.where(p == best, e, BLOCK_E), 0)
                top_w = tl.where(slots == j, tl.where(best > 1.0, float("nan"), best), top_w)
                top_i = tl.where(slots == j, idx, top_i)
                picked = e == idx
                sel = tl.where(picked, j + 1, sel)
                p = tl.where(picked, -1.0, p)
            if NORM:
                top_w = top_w / tl.sum(top_w, 0)
            if EXPERT_SCALE:
                top_w = top_w * tl.load(SCALE + top_i, mask=ok, other=0.0).to(tl.float32)
        out = t * TOP_K + slots
        tl.store(IDS + out, top_i, mask=ok)
        tl.store(W + out, top_w.to(W.dtype.element_ty), mask=ok)
        if GROUP:
            tl.store(PICKS + t * BLOCK_E + e, sel.to(tl.int8))

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
    def _place_kernel(
        PICKS, BLOCK_EXPERT, BLOCK_ROWS, ROW_ASSIGN, n_tokens, n_experts, n_blocks, blocks_per_program,
        TOP_K: tl.constexpr, PT: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr,
        CHUNK: tl.constexpr, COUNT_CHUNK: tl.constexpr, PDL: tl.constexpr,
    ):
        """grid (at least ceil(T / PT),), after _route_kernel: program p adds up the tokens' picks
        (each expert's rows, and its rows among the tokens before its own PT), places its tokens'
        assignments, if any (expert e's run starts at block first[e], tokens in order within it),
        and writes its share of the block table. Integers only: the layout is the same whatever
        the program count."""
        wait_for_previous(PDL)
        p = tl.program_id(0)
        t0 = p * PT
        e = tl.arange(0, BLOCK_E)
        total = tl.zeros([BLOCK_E], dtype=tl.int32)
        before = tl.zeros([BLOCK_E], dtype=tl.int32)
        for q0 in range(0, n_tokens, COUNT_CHUNK):
            q = q0 + tl.arange(0, COUNT_CHUNK)
            c = (tl.load(PICKS + q[:, None] * BLOCK_E + e[None, :], mask=(q < n_tokens)[:, None], other=0) > 0).to(tl.int32)
            total += tl.sum(c, 0)
            before += tl.sum(tl.where((q < t0)[:, None], c, 0), 0)
        blocks = (total + BLOCK_M - 1) // BLOCK_M
        first = tl.cumsum(blocks, 0) - blocks
        # this program's tokens' picks: slot + 1 per (token, expert), else 0
        t = t0 + tl.arange(0, PT)
        sel = tl.load(PICKS + t[:, None] * BLOCK_E + e[None, :], mask=(t < n_tokens)[:, None], other=0).to(tl.int32)
        hit = (sel > 0).to(tl.int32)
        rank = tl.cumsum(hit, 0) - hit  # this program's earlier tokens on the same expert
        row = first[None, :] * BLOCK_M + before[None, :] + rank
        tl.store(ROW_ASSIGN + row, t[:, None] * TOP_K + sel - 1, mask=hit > 0)
        b_start = p * blocks_per_program
        _write_blocks(BLOCK_EXPERT, BLOCK_ROWS, total, first, b_start, tl.minimum(b_start + blocks_per_program, n_blocks),
                      n_experts, BLOCK_E, BLOCK_M, CHUNK)

    @triton.jit
    def _mma(a, b, acc, UPCAST: tl.constexpr):
        """acc + a @ b: the one tl.dot form of every expert GEMM here (bits: module docstring).
        UPCAST: full-fp32 products (fp32 inputs; bf16/fp16 under the interpreter)."""
        if UPCAST:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            return tl.dot(a, b, acc)

    @triton.jit
    def _scale_round(acc, bias, weight, dt: tl.constexpr, HAS_BIAS: tl.constexpr):
        """A down result's epilogue: rounded to dt, plus the expert's bias (HAS_BIAS, gpt-oss;
        rounded), times the routing weight (fp32), rounded."""
        y = acc.to(dt).to(tl.float32)
        if HAS_BIAS:
            y = (y + bias).to(dt).to(tl.float32)
        return (y * weight).to(dt)

    @triton.jit
    def _clamped_swiglu(g, u, alpha, limit, dt: tl.constexpr):
        """gpt-oss's activation on the rounded gate and up (fp32 holding dt values), each step
        rounded to dt as transformers' GptOssExperts computes it in dt: gate clamped above at
        limit, up to [-limit, limit], (up + 1) * (gate * sigmoid(gate * alpha)). A NaN stays NaN
        (the comparisons are false for it), as under torch.clamp."""
        g = tl.where(g > limit, limit, g)
        u = tl.where(u > limit, limit, tl.where(u < -limit, -limit, u))
        ga = (g * alpha).to(dt).to(tl.float32)
        sig = (1.0 / (1.0 + tl.exp(-ga))).to(dt).to(tl.float32)
        glu = (g * sig).to(dt).to(tl.float32)
        return ((u + 1.0).to(dt).to(tl.float32) * glu).to(dt)

    @triton.jit
    def _gelu_tanh_mul(g, u, dt: tl.constexpr, LIBDEVICE: tl.constexpr):
        """Gemma 4's activation on the rounded gate and up (fp32 holding dt values), as torch
        computes gelu(gate, approximate="tanh") in dt (fp32 arithmetic, rounded once), then the
        product with up rounded to dt. LIBDEVICE: CUDA's tanhf (torch's); the interpreter has
        none, so tanh there is 1 - 2 / (exp(2z) + 1) (fp32, a few ulp from it)."""
        z = 0.7978845608028654 * (g + 0.044715 * (g * g * g))
        if LIBDEVICE:
            th = libdevice.tanh(z)
        else:  # |z| > 20: tanh is +-1 in fp32; the bound keeps exp finite (NaN passes through)
            zc = tl.where(z > 20.0, 20.0, tl.where(z < -20.0, -20.0, z))
            th = 1.0 - 2.0 / (tl.exp(2.0 * zc) + 1.0)
        gelu = (0.5 * g * (1.0 + th)).to(dt).to(tl.float32)
        return (gelu * u).to(dt)

    @triton.jit
    def _gate_up_kernel(
        X, WGU, BGU, INTER, IDS, BLOCK_EXPERT, BLOCK_ROWS, ROW_ASSIGN, hidden, inter_size,
        stride_x, stride_we, stride_wn, stride_wk, up_offset, stride_i, alpha, limit,
        TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
        TOKEN: tl.constexpr, ACT: tl.constexpr, LIBDEVICE: tl.constexpr, PDL: tl.constexpr,
    ):
        """grid (blocks, I / BLOCK_N): INTER[row] = act(x[token] @ gate.T, x[token] @ up.T), the
        activation ACT: SILU (Qwen3: silu(gate) * up), SWIGLU (gpt-oss) or GELU_TANH (Gemma 4).
        Gate column n of expert e is at WGU + e*stride_we + n*stride_wn + k*stride_wk, its up
        column up_offset further (Qwen3: [E, 2I, H] rows; gpt-oss: [E, H, 2I] interleaved).
        SWIGLU: the biases BGU [E, 2I] (interleaved, contiguous) added to the rounded gate and
        up, then _clamped_swiglu. GELU_TANH: _gelu_tanh_mul.
        TOKEN (the per-token path, no grouping): grid (T * k, I / BLOCK_N), program_id(0) is the
        assignment t*k + slot, one row (row 0 of the tile), its expert IDS[t*k + slot], written to
        INTER row t*k + slot: the grouped tile's bits (module docstring)."""
        wait_for_previous(PDL)
        blk = tl.program_id(0)
        m = tl.arange(0, BLOCK_M)
        if TOKEN:
            rows = 1
            e = tl.load(IDS + blk).to(tl.int64)
            valid = m < 1
            token = tl.where(valid, blk // TOP_K, 0)
            r = blk + m
        else:
            rows = tl.load(BLOCK_ROWS + blk)
            e = tl.load(BLOCK_EXPERT + blk).to(tl.int64)
            valid = m < rows
            assign = tl.load(ROW_ASSIGN + blk * BLOCK_M + m, mask=valid, other=0)
            token = tl.where(valid, assign // TOP_K, 0)
            r = blk * BLOCK_M + m
        if rows > 0:
            n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = n < inter_size
            # 64-bit scalar bases, 32-bit tile offsets (the wrapper checks they fit): 64-bit
            # pointer tiles cost ~40 registers more, and registers decide the streaming speed
            w_gate = WGU + e * stride_we
            w_up = w_gate + up_offset
            n_off = n * stride_wn
            acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k0 in range(0, hidden, BLOCK_K):
                k = k0 + tl.arange(0, BLOCK_K)
                k_ok = k < hidden
                # padding rows are masked out of the x loads: zeros, no memory requests
                a = tl.load(X + token[:, None] * stride_x + k[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
                offs = n_off[None, :] + k[:, None] * stride_wk
                wg = tl.load(w_gate + offs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                wu = tl.load(w_up + offs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                acc_g = _mma(a, wg, acc_g, UPCAST)
                acc_u = _mma(a, wu, acc_u, UPCAST)
            dt = INTER.dtype.element_ty
            g = acc_g.to(dt).to(tl.float32)
            u = acc_u.to(dt).to(tl.float32)
            if ACT == 1:  # SWIGLU
                b = BGU + e * (2 * inter_size) + 2 * n
                g = (g + tl.load(b, mask=n_ok, other=0.0).to(tl.float32)[None, :]).to(dt).to(tl.float32)
                u = (u + tl.load(b + 1, mask=n_ok, other=0.0).to(tl.float32)[None, :]).to(dt).to(tl.float32)
                out = _clamped_swiglu(g, u, alpha, limit, dt)
            elif ACT == 2:  # GELU_TANH
                out = _gelu_tanh_mul(g, u, dt, LIBDEVICE)
            else:
                s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
                out = (s * u).to(dt)
            tl.store(INTER + r[:, None] * stride_i + n[None, :], out, mask=valid[:, None] & n_ok[None, :])

    @triton.jit
    def _down_kernel(
        INTER, WD, BD, RW, OUT, BLOCK_EXPERT, BLOCK_ROWS, ROW_ASSIGN, hidden, inter_size,
        stride_i, stride_we, stride_wn, stride_wk, stride_o,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
        HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
    ):
        """grid (blocks, H / BLOCK_N): OUT[assignment] = (INTER[row] @ down.T (+ BD[e])) * weight.
        Down's hidden column n, K index k of expert e: WD + e*stride_we + n*stride_wn + k*stride_wk
        (Qwen3: [E, H, I]; gpt-oss: [E, I, H]). BD: the down biases [E, H] (HAS_BIAS)."""
        wait_for_previous(PDL)
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
                b = tl.load(w + n_off[None, :] + k[:, None] * stride_wk, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                acc = _mma(a, b, acc, UPCAST)
            weight = tl.load(RW + assign, mask=valid, other=0.0).to(tl.float32)
            bias = 0.0
            if HAS_BIAS:
                bias = tl.load(BD + e * hidden + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            y = _scale_round(acc, bias, weight[:, None], OUT.dtype.element_ty, HAS_BIAS)
            tl.store(OUT + assign[:, None] * stride_o + n[None, :], y, mask=valid[:, None] & n_ok[None, :])

    @triton.jit
    def _down_combine_kernel(
        INTER, WD, BD, RW, IDS, OUT, hidden, inter_size, stride_i, stride_we, stride_wn, stride_wk, stride_o,
        TOP_K: tl.constexpr, BLOCK_TOP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, UPCAST: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
    ):
        """grid (T, H / BLOCK_N), for few tokens: _down_kernel then _combine_kernel for token t's
        BLOCK_N hidden columns, in one program. One tl.dot per K step covers all k slots: row j
        of the 16-row A tile is slot j's intermediate row, columns j*BLOCK_N .. of B are slot j's
        expert's down rows, and slot j's result is the diagonal block (row j, its own columns),
        the same MMA steps on the same operands as the grouped tile. The other (row, column)
        pairs are wasted MMA work (free: the k experts' weights are streamed once either way)."""
        wait_for_previous(PDL)
        t = tl.program_id(0)
        m = tl.arange(0, BLOCK_M)
        m_ok = m < TOP_K  # row j <- slot j
        a_row = t * TOP_K + m  # the token path's INTER rows: one per assignment
        c = tl.arange(0, BLOCK_TOP * BLOCK_N)  # column c <- slot c // BLOCK_N, hidden n0 + c % BLOCK_N
        c_slot = c // BLOCK_N
        n = tl.program_id(1) * BLOCK_N + c % BLOCK_N
        c_ok = (c_slot < TOP_K) & (n < hidden)
        expert = tl.load(IDS + t * TOP_K + c_slot, mask=c_slot < TOP_K, other=0)
        # 32-bit offsets over the whole [E, H, I] weight (the wrapper checks it fits): one expert
        # per column, so no scalar base as in _down_kernel
        col_off = expert * stride_we + n * stride_wn
        acc = tl.zeros([BLOCK_M, BLOCK_TOP * BLOCK_N], dtype=tl.float32)
        for k0 in range(0, inter_size, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < inter_size
            a = tl.load(INTER + a_row[:, None] * stride_i + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(WD + col_off[None, :] + k[:, None] * stride_wk, mask=k_ok[:, None] & c_ok[None, :], other=0.0)
            acc = _mma(a, b, acc, UPCAST)
        # slot j's result: acc[j, j*BLOCK_N + i]. The other rows are masked to -0.0, the identity
        # of fp32 addition (x + -0.0 == x for every x, +0.0 included), so the sum is exact.
        slot = tl.arange(0, BLOCK_TOP)
        own = m[:, None, None] == slot[None, :, None]
        diag = tl.sum(tl.where(own, tl.reshape(acc, [BLOCK_M, BLOCK_TOP, BLOCK_N]), -0.0), 0)  # [BLOCK_TOP, BLOCK_N]
        dt = OUT.dtype.element_ty
        weight = tl.load(RW + t * TOP_K + slot, mask=slot < TOP_K, other=0.0).to(tl.float32)
        h = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        bias = 0.0
        if HAS_BIAS:  # slot j's expert's down bias on these columns
            slot_expert = tl.load(IDS + t * TOP_K + slot, mask=slot < TOP_K, other=0)
            bias_ok = (slot < TOP_K)[:, None] & (h < hidden)[None, :]
            bias = tl.load(BD + slot_expert[:, None] * hidden + h[None, :], mask=bias_ok, other=0.0).to(tl.float32)
        y = _scale_round(diag, bias, weight[:, None], dt, HAS_BIAS).to(tl.float32)  # _down_kernel's per-slot rows
        # _combine_kernel: the k slot rows added in slot order to a zero fp32 total, rounded once
        total = tl.zeros([BLOCK_N], dtype=tl.float32)
        for j in tl.static_range(TOP_K):
            total += tl.sum(tl.where(slot[:, None] == j, y, -0.0), 0)
        tl.store(OUT + t.to(tl.int64) * stride_o + h, total.to(dt), mask=h < hidden)

    @triton.jit
    def _combine_kernel(PER_SLOT, OUT, hidden, stride_o, TOP_K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
        """grid (T, H / BLOCK): out[t] = per_slot rows t*k .. t*k+k-1 added in slot order in fp32
        (from zero), rounded once."""
        wait_for_previous(PDL)
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


def router_partials(x: torch.Tensor, router_weight: torch.Tensor) -> torch.Tensor:
    """What moe_route_triton routes from: for bf16/fp16, linear_partials' fp32 K-group sums [G, T, E]
    (routing adds them as linear_triton would: router_logits' bits, without its group-sum launch);
    for fp32, router_logits [T, E]."""
    if x.dtype in (torch.bfloat16, torch.float16):
        return linear_partials(x, router_weight)
    return router_logits(x, router_weight)


def moe_route_triton(logits: torch.Tensor, top_k: int, norm_topk_prob: bool, dtype: torch.dtype, *,
                     group: bool = True, bias: torch.Tensor | None = None, topk_softmax: bool = False,
                     expert_scale: torch.Tensor | None = None) -> MoeRouting:
    """Router logits -> MoeRouting: the top-k experts and weights (in dtype) of every token and, with
    group, the rows grouped by expert. logits: [T, E], or router_partials' [G, T, E] fp32 K-group
    sums (added in group order, rounded to dtype: the logits linear_triton gives). bias [E]: added
    to the fp32 logits before that rounding (gpt-oss's router). topk_softmax: gpt-oss's routing
    (the top-k logits, softmax over those k; norm_topk_prob unused) instead of Qwen3's (softmax
    over all experts, the top-k probabilities, renormalised if norm_topk_prob). expert_scale [E]
    (Gemma 4): each weight times its expert's scale after that, and the weights kept in fp32
    (dtype then only rounds the logits). One launch (a
    program per token), and a second (_place_kernel) to group."""
    _check_triton()
    groups = logits.shape[0] if logits.dim() == 3 else 0
    assert groups == 0 or logits.dtype == torch.float32, "K-group sums are fp32"
    t, num_experts = logits.shape[-2:]
    if groups or logits.stride(-1) != 1:
        logits = logits.contiguous()  # with groups: group g's rows start at g * T * E (_token_logits)
    dev = logits.device
    ids = torch.empty(t, top_k, dtype=torch.int32, device=dev)
    weights = torch.empty(t, top_k, dtype=dtype if expert_scale is None else torch.float32, device=dev)
    block_e, block_top = triton.next_power_of_2(num_experts), triton.next_power_of_2(top_k)
    picks = torch.empty(t if group else 1, block_e, dtype=torch.int8, device=dev)
    _route_kernel[(t,)](
        logits, logits if bias is None else bias, logits if expert_scale is None else expert_scale, ids, weights, picks,
        t, num_experts, logits.stride(-2), TOP_K=top_k, NORM=norm_topk_prob, GROUPS=groups, BLOCK_E=block_e,
        BLOCK_TOP=block_top, GROUP=group, HAS_BIAS=bias is not None, TOPK_SOFTMAX=topk_softmax,
        EXPERT_SCALE=expert_scale is not None, DT=_TL_DTYPES[dtype], num_warps=ROUTE_WARPS, **launch_args(dev, t),
    )
    if not group:
        return MoeRouting(weights, ids)
    n_blocks = max_blocks(t * top_k, num_experts)
    block_expert = torch.empty(n_blocks, dtype=torch.int32, device=dev)
    block_rows = torch.empty(n_blocks, dtype=torch.int32, device=dev)
    row_assign = torch.empty(n_blocks * BLOCK_M, dtype=torch.int32, device=dev)
    programs = max(triton.cdiv(t, PLACE_TOKENS), triton.cdiv(n_blocks, PLACE_BLOCKS))
    per_program = triton.cdiv(n_blocks, programs)  # each program's share of the block table
    _place_kernel[(programs,)](
        picks, block_expert, block_rows, row_assign, t, num_experts, n_blocks, per_program,
        TOP_K=top_k, PT=PLACE_TOKENS, BLOCK_E=block_e, BLOCK_M=BLOCK_M,
        CHUNK=triton.next_power_of_2(per_program), COUNT_CHUNK=COUNT_CHUNK, **launch_args(dev, t),
    )
    return MoeRouting(weights, ids, block_expert, block_rows, row_assign)


_TL_DTYPES = {} if triton is None else {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def uses_token_path(t: int, top_k: int, down: torch.Tensor, tile: MoeTile = TILE) -> bool:
    """Whether T tokens take _down_combine_kernel (speed only: the bits are the grouped path's).
    It needs the k slots in one 16-row tile and 32-bit offsets over the whole down weight."""
    return t <= tile.token_rows and top_k <= BLOCK_M and down.shape[0] * down.stride(0) < 2**31


@dataclass(frozen=True)
class _Experts:
    """One MoE family's expert weights as the GEMM kernels walk them: gate column n / K index k
    of expert e at gate_up + e*gu_we + n*gu_wn + k*gu_wk, its up column up_offset further; down's
    hidden column n / K index k at down + e*d_we + n*d_wn + k*d_wk. swiglu: gpt-oss's (alpha,
    limit) with the biases gate_up_bias [E, 2I] and down_bias [E, H], or None. act: the
    gate/up epilogue's activation (SILU, SWIGLU with swiglu set, GELU_TANH)."""

    gate_up: torch.Tensor
    down: torch.Tensor
    inter_size: int
    gu_strides: tuple[int, int, int, int]  # we, wn, wk, up_offset
    d_strides: tuple[int, int, int]  # we, wn, wk
    gate_up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None
    swiglu: tuple[float, float] | None = None
    act: int = SILU


def _rows_experts(gate_up: torch.Tensor, down: torch.Tensor, act: int) -> _Experts:
    """Qwen3's and Gemma 4's layout: gate_up [E, 2I, H] (gate rows, then up rows), down [E, H, I]."""
    inter = gate_up.shape[1] // 2
    return _Experts(gate_up, down, inter, (gate_up.stride(0), gate_up.stride(1), gate_up.stride(2),
                                           inter * gate_up.stride(1)),
                    (down.stride(0), down.stride(1), down.stride(2)), act=act)


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
    """The sparse MoE block (same contract as reference.moe_block_ref) on x [T, H]: Qwen3 MoE's
    gate_up [E, 2I, H] (gate rows, then up rows), down [E, H, I]. tile: for benchmarks and tests;
    the engine always runs TILE."""
    return _moe_triton(x, router_weight, None, _rows_experts(gate_up, down, SILU), top_k, norm_topk_prob, False, tile)


def moe_block_gpt_oss_triton(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    router_bias: torch.Tensor,
    gate_up: torch.Tensor,
    gate_up_bias: torch.Tensor,
    down: torch.Tensor,
    down_bias: torch.Tensor,
    top_k: int,
    alpha: float,
    limit: float,
    *,
    tile: MoeTile = TILE,
) -> torch.Tensor:
    """gpt-oss's sparse MoE block (same contract as reference.moe_block_gpt_oss_ref) on x [T, H]:
    the same kernels as moe_block_triton with gpt-oss's options: the router bias and the softmax
    over the chosen top-k logits, gate_up [E, H, 2I] with gate and up columns interleaved plus
    its bias, the clamped SwiGLU, down [E, I, H] plus its bias. Any strides of the weights (a
    K-contiguous copy streams the same bits); the biases are read contiguous."""
    inter = gate_up.shape[2] // 2
    experts = _Experts(gate_up, down, inter, (gate_up.stride(0), 2 * gate_up.stride(2), gate_up.stride(1),
                                              gate_up.stride(2)),
                       (down.stride(0), down.stride(2), down.stride(1)),
                       gate_up_bias.contiguous(), down_bias.contiguous(), (float(alpha), float(limit)), SWIGLU)
    return _moe_triton(x, router_weight, router_bias.contiguous(), experts, top_k, False, True, tile)


def gemma4_router_input(residual: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """What Gemma 4's router projects: the residual stream [T, H] RMS-normalized (no weight),
    times `scale` [H], times H^-0.5, each step rounded to residual's dtype as in
    reference.moe_route_gemma4_ref. The norm is kernels/fused.py's rms_norm with `scale` as its
    weight (normalize in fp32, round, times the weight, round: the reference's first two steps
    in one batch-invariant launch on CUDA); the last multiply is elementwise."""
    return rms_norm(residual, scale, eps) * residual.shape[-1] ** -0.5


def moe_block_gemma4_triton(
    x: torch.Tensor,
    residual: torch.Tensor,
    scale: torch.Tensor,
    proj: torch.Tensor,
    per_expert_scale: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    eps: float,
    *,
    tile: MoeTile = TILE,
) -> torch.Tensor:
    """Gemma 4's sparse experts (same contract as reference.moe_block_gemma4_ref) on x [T, H],
    routed on `residual` [T, H]: the same kernels as moe_block_triton with Gemma 4's options: the
    router reads gemma4_router_input, softmax over all experts, top-k renormalised, each weight
    times its per_expert_scale (weights kept in fp32, as transformers keeps them); gate_up
    [E, 2I, H], down [E, H, I] as Qwen3's, gelu-tanh instead of SiLU."""
    router_x = gemma4_router_input(residual, scale, eps)
    return _moe_triton(x, proj, None, _rows_experts(gate_up, down, GELU_TANH), top_k, True, False, tile,
                       router_x=router_x, expert_scale=per_expert_scale.contiguous())


def _moe_triton(x: torch.Tensor, router_weight: torch.Tensor, router_bias: torch.Tensor | None, experts: _Experts,
                top_k: int, norm_topk_prob: bool, topk_softmax: bool, tile: MoeTile, *,
                router_x: torch.Tensor | None = None, expert_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The launches of every MoE family (module docstring); the family's options are constexprs.
    router_x: what the router reads, if not x (Gemma 4); expert_scale: per-expert weight scales."""
    _check_triton()
    t, hidden = x.shape
    gate_up, down, inter_size = experts.gate_up, experts.down, experts.inter_size
    num_experts = gate_up.shape[0]
    two_i = 2 * inter_size
    x = x if x.stride(-1) == 1 else x.contiguous()
    n_assign = t * top_k
    # The GEMM kernels index rows with 32-bit offsets (x, the intermediate rows, the per-slot rows,
    # within one expert's weights); a shape check on the host, no device read.
    spans = (t * x.stride(0), max_blocks(n_assign, num_experts) * BLOCK_M * inter_size, n_assign * hidden, two_i * hidden)
    if max(spans) >= 2**31:
        raise ValueError(f"{t} tokens are too many for one MoE call (32-bit offsets): split the chunk")
    token_path = uses_token_path(t, top_k, down, tile)
    routing = moe_route_triton(router_partials(x if router_x is None else router_x, router_weight), top_k,
                               norm_topk_prob, x.dtype, group=not token_path, bias=router_bias,
                               topk_softmax=topk_softmax, expert_scale=expert_scale)
    # Products in full fp32 (no TF32) for fp32 inputs. Under the interpreter bf16/fp16 operands are
    # upcast first: its low-precision tl.dot returns garbage (triton 3.9), and bf16 x bf16 products
    # are exact in fp32 anyway, so the result is the tensor-core one.
    upcast = x.dtype == torch.float32 or interpreting()
    gpt_oss = experts.swiglu is not None
    alpha, limit = experts.swiglu or (0.0, 0.0)
    gu_bias = experts.gate_up_bias if gpt_oss else gate_up  # an unread pointer without biases
    d_bias = experts.down_bias if gpt_oss else down
    launch = dict(num_warps=tile.num_warps, num_stages=tile.num_stages)
    out = torch.empty(t, hidden, dtype=x.dtype, device=x.device)
    gate_up_args = (hidden, inter_size, x.stride(0), *experts.gu_strides)
    gate_up_shape = dict(TOP_K=top_k, BLOCK_M=BLOCK_M, BLOCK_N=tile.gate_up_n, BLOCK_K=tile.block_k, UPCAST=upcast,
                         ACT=experts.act, LIBDEVICE=x.is_cuda and not interpreting())
    if token_path:  # an intermediate row per assignment, straight from the routing: no grouping
        ids = routing.ids
        inter = torch.empty(n_assign, inter_size, dtype=x.dtype, device=x.device)
        _gate_up_kernel[(n_assign, triton.cdiv(inter_size, tile.gate_up_n))](
            x, gate_up, gu_bias, inter, ids, ids, ids, ids, *gate_up_args, inter.stride(0), alpha, limit,
            **gate_up_shape, TOKEN=True, **launch, **launch_args(x.device, t),
        )
        _down_combine_kernel[(t, triton.cdiv(hidden, tile.token_n))](
            inter, down, d_bias, routing.weights, ids, out, hidden, inter_size, inter.stride(0), *experts.d_strides,
            out.stride(0), TOP_K=top_k, BLOCK_TOP=triton.next_power_of_2(top_k), BLOCK_M=BLOCK_M, BLOCK_N=tile.token_n,
            BLOCK_K=tile.block_k, UPCAST=upcast, HAS_BIAS=gpt_oss, num_warps=tile.token_warps,
            num_stages=tile.token_stages, **launch_args(x.device, t),
        )
        return out
    n_blocks = routing.block_expert.numel()
    groups = (routing.block_expert, routing.block_rows, routing.row_assign)
    inter = torch.empty(n_blocks * BLOCK_M, inter_size, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(n_blocks, triton.cdiv(inter_size, tile.gate_up_n))](
        x, gate_up, gu_bias, inter, routing.ids, *groups, *gate_up_args, inter.stride(0), alpha, limit,
        **gate_up_shape, TOKEN=False, **launch, **launch_args(x.device, t),
    )
    per_slot = torch.empty(n_assign, hidden, dtype=x.dtype, device=x.device)
    _down_kernel[(n_blocks, triton.cdiv(hidden, tile.down_n))](
        inter, down, d_bias, routing.weights, per_slot, *groups, hidden, inter_size,
        inter.stride(0), *experts.d_strides, per_slot.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=tile.down_n, BLOCK_K=tile.block_k, UPCAST=upcast, HAS_BIAS=gpt_oss, **launch,
        **launch_args(x.device, t),
    )
    _combine_kernel[(t, triton.cdiv(hidden, COMBINE_BLOCK))](
        per_slot, out, hidden, out.stride(0), TOP_K=top_k, BLOCK=COMBINE_BLOCK, **launch_args(x.device, t),
    )
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


def moe_block_gpt_oss(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    router_bias: torch.Tensor,
    gate_up: torch.Tensor,
    gate_up_bias: torch.Tensor,
    down: torch.Tensor,
    down_bias: torch.Tensor,
    top_k: int,
    alpha: float,
    limit: float,
) -> torch.Tensor:
    """gpt-oss's sparse MoE block: the fused Triton path on CUDA tensors, the torch reference elsewhere."""
    args = (x, router_weight, router_bias, gate_up, gate_up_bias, down, down_bias, top_k, alpha, limit)
    if x.is_cuda and triton is not None and not x.requires_grad:
        return moe_block_gpt_oss_triton(*args)
    return moe_block_gpt_oss_ref(*args)


def moe_block_gemma4(
    x: torch.Tensor,
    residual: torch.Tensor,
    scale: torch.Tensor,
    proj: torch.Tensor,
    per_expert_scale: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    eps: float,
) -> torch.Tensor:
    """Gemma 4's sparse experts: the fused Triton path on CUDA tensors, the torch reference elsewhere."""
    args = (x, residual, scale, proj, per_expert_scale, gate_up, down, top_k, eps)
    if x.is_cuda and triton is not None and not x.requires_grad:
        return moe_block_gemma4_triton(*args)
    return moe_block_gemma4_ref(*args)


__all__ = ["BLOCK_M", "MoeRouting", "MoeTile", "PLACE_TOKENS", "TILE", "gemma4_router_input", "max_blocks", "moe_block",
           "moe_block_gemma4", "moe_block_gemma4_triton", "moe_block_gpt_oss",
           "moe_block_gpt_oss_triton", "moe_block_triton",
           "moe_route_triton", "router_logits", "router_partials", "uses_token_path"]

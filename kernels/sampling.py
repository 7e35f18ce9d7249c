"""Top-p (nucleus) sampling of whole vocabulary rows without a sort: one program per row.

Contract: `nucleus_sample_ref` (kernels/reference.py), the sorted definition: tokens in stable
descending order of the logit, kept while the mass before them is below top_p, then one token
by inverse CDF in index order over the kept tokens' renormalised probabilities. The weights are
torch's (exp(x - max) in fp32, CUDA expf through libdevice; numpy's exp under the interpreter),
their sums float64 in another order: the kept set can differ from the reference's only where a
cumulative mass lies within float64 rounding of top_p, and the sampled token only where
u * total lies within rounding of a cumulative weight.

Two kernels, launched one after the other by engine/sampling.py on the GPU:

- `_sample_candidates_kernel`, the fast path: three passes over the row (its maximum; its
  normaliser and a histogram of m - x in bins of 1/BIN_SCALE, in two levels of 32 bins; a copy,
  in index order, of every logit in the most whole top bins that hold at most CANDIDATES; four
  passes in all), then the copies sorted in one
  block by (value descending, index ascending), the nucleus as their prefix, and the draw. The
  candidates are every logit above some value, so every token outside them comes later in the
  sorted order: unless every candidate is kept, the nucleus is exactly the kept prefix. Else the
  row is left to the next kernel (`need`).
- `_nucleus_sample_kernel`, the exact fallback for rows whose nucleus is wider (flat rows,
  top_p 1): the smallest logit v* whose strictly-greater mass G(v*) is below top_p * Z is the
  last kept value (G only changes at the row's own values, so a bisection over the 2^32
  order-preserving integer keys of the logits ends on one of them). First, passes that each
  measure the mass and count above 16 values (2 logits apart below the maximum, then evenly
  inside the bracket found) narrow a bracket of v* until at most FALLBACK_CAPACITY logits lie
  inside (up to BRACKET_LEVELS passes; one or two on a flat 152k row), a pass copies them, and
  the bisection's passes run over the copies; where more lie inside, over the whole row (33
  passes). Of the
  tokens tied at v*, the sorted order keeps the first r = ceil((top_p * Z - G) / w(v*)) by
  index (at least one, at most all), and so does the kernel. Rows not needed return at once, so
  inside a CUDA graph it costs a launch when no row needs it.

Also here: `row_mass`, the torch fast path's softmax normaliser in one read of the rows.
"""
from __future__ import annotations

import torch

from .launch import interpreting, launch_args, wait_for_previous
from .reference import nucleus_sample_ref, row_mass_ref

try:  # triton is optional: CPU-only installs use the torch reference.
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None
    libdevice = None

BLOCK = 2048  # logits per step of a pass
WARPS = 8
FALLBACK_WARPS = 8  # the bisection kernel's and the candidates kernel's warps
CANDIDATE_WARPS = 8  # (benchmarks/sampling.py times 8 and 16)
CANDIDATE_BINS = 1024  # histogram bins below the row's maximum (32 groups of 32), BIN_SCALE a unit
BIN_SCALE = 32.0  # of logit: they span 32 (weights down to e^-32 of the top's); the last holds the rest
FALLBACK_CAPACITY = 8192  # logits inside the bracket that the bisection may copy, a row
BRACKET_LEVELS = 4  # passes that narrow the bracket, each 16 times (the first to 2 logits)

if triton is not None:

    @triton.jit
    def _order_key(x):
        """int64 key in the order of the fp32 value (-0.0 and 0.0 share one key)."""
        bits = x.to(tl.int32, bitcast=True)
        bits = tl.where(x == 0.0, 0, bits)
        bits = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: flip the magnitude bits
        return bits.to(tl.int64)

    @triton.jit
    def _key_value(key):
        bits = key.to(tl.int32)
        bits = bits ^ ((bits >> 31) & 0x7FFFFFFF)
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _weight(x, m, USE_LIBDEVICE: tl.constexpr):
        """exp(x - m) in fp32 as torch computes it on the GPU (CUDA expf), widened to float64."""
        if USE_LIBDEVICE:
            w = libdevice.exp(x - m)
        else:
            w = tl.exp(x - m)
        return w.to(tl.float64)

    @triton.jit
    def _bin(x, m, SCALE: tl.constexpr, BINS: tl.constexpr):
        """The histogram bin of a logit: floor((m - x) * SCALE), the last bin holding the rest.
        Monotone in x, so a set of whole bins below b* is every logit above some value."""
        return tl.minimum((m - x) * SCALE, BINS - 1).to(tl.int32)

    @triton.jit
    def _above(x_row, V, m, t, BLOCK_T: tl.constexpr, USE_LIBDEVICE: tl.constexpr):
        """The mass (float64 sum of the weights) and the count of the row's logits above each
        of the values t [16], in one pass."""
        offs = tl.arange(0, BLOCK_T)
        mass = tl.zeros([BLOCK_T, 16], tl.float64)
        count = tl.zeros([BLOCK_T, 16], tl.int32)
        for s in range(0, V, BLOCK_T):
            x = tl.load(x_row + s + offs, mask=s + offs < V, other=float("-inf"))
            above = x[:, None] > t[None, :]
            mass += tl.where(above, _weight(x, m, USE_LIBDEVICE)[:, None], 0.0)
            count += above.to(tl.int32)
        return tl.sum(mass, 0), tl.sum(count, 0)

    @triton.jit
    def _kept_weights(x, m, hi, r, tie_rank, USE_LIBDEVICE: tl.constexpr):
        """A block's weights of the kept set (keys above `hi`, and the first `r` by index of the
        ties at `hi`, `tie_rank` of them already passed), zero elsewhere; and the new tie_rank.
        Both inverse-CDF passes use it, so they walk the same kept set."""
        key = _order_key(x)
        tie = (key == hi).to(tl.int64)
        kept = (key > hi) | ((tie != 0) & (tie_rank + tl.cumsum(tie, 0) - 1 < r))
        return tl.where(kept, _weight(x, m, USE_LIBDEVICE), 0.0), tie_rank + tl.sum(tie, 0)

    @triton.jit
    def _nucleus_sample_kernel(
        X, U, TOP_P, NEED, TOKENS, KEPT,  # [N, V] fp32, [N] fp64, 0-d fp64, [N] int8, [N] int64, [N] int32
        SCRATCH,  # [N, CAPACITY] fp32: the logits inside the bracket, for the bisection
        V, stride,
        NUCLEUS: tl.constexpr, CAPACITY: tl.constexpr, LEVELS: tl.constexpr, BLOCK: tl.constexpr,
        BLOCK_T: tl.constexpr, USE_LIBDEVICE: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_for_previous(PDL)
        row = tl.program_id(0)
        if tl.load(NEED + row) != 0:
            x_row = X + row.to(tl.int64) * stride
            offs = tl.arange(0, BLOCK)
            neg_inf = float("-inf")
            top = tl.full([BLOCK], neg_inf, tl.float32)
            for s in range(0, V, BLOCK):
                top = tl.maximum(top, tl.load(x_row + s + offs, mask=s + offs < V, other=neg_inf))
            m = tl.max(top, 0)
            z_acc = tl.zeros([BLOCK], tl.float64)
            for s in range(0, V, BLOCK):
                x = tl.load(x_row + s + offs, mask=s + offs < V, other=neg_inf)
                z_acc += _weight(x, m, USE_LIBDEVICE)
            z = tl.sum(z_acc, 0)
            # The kept set: keys above `hi`, and the first `r` (by index) of the ties at `hi`.
            lowest = _order_key(m) * 0 - 2147483649  # below every key
            if NUCLEUS:
                bound = tl.load(TOP_P) * z
                # Bracket the last kept value: the mass above 16 values 2 apart below the
                # maximum, then above 16 values spaced evenly inside the bracket found, until
                # at most CAPACITY logits lie inside (exact float64 sums, like every mass here).
                steps = (tl.arange(0, 16) + 1).to(tl.float32)
                hi_v = m  # nothing above it: G(hi_v) = 0 < bound
                g_hi = z * 0.0
                n_hi = (lowest * 0).to(tl.int32)  # logits above hi_v (the maximum's ties count below)
                lo_v = m * 0.0 + neg_inf  # G(-inf) = Z >= bound
                n_lo = n_hi + V  # at most V above lo_v
                for level in range(LEVELS):
                    if n_lo - n_hi > CAPACITY:
                        step = tl.where(lo_v > neg_inf, (hi_v - lo_v) / 16.0, tl.where(level == 0, 2.0, 0.125))
                        t = hi_v - steps * step
                        g, c = _above(x_row, V, m, t, BLOCK_T, USE_LIBDEVICE)
                        k = tl.sum((g < bound).to(tl.int32), 0)  # G rises as t falls: a prefix
                        hi_v = tl.where(k > 0, tl.max(tl.where(steps == k, t, neg_inf), 0), hi_v)
                        g_hi = tl.where(k > 0, tl.sum(tl.where(steps == k, g, 0.0), 0), g_hi)
                        n_hi = tl.where(k > 0, tl.sum(tl.where(steps == k, c, 0), 0), n_hi)
                        lo_v = tl.where(k < 16, tl.max(tl.where(steps == k + 1, t, neg_inf), 0), lo_v)
                        n_lo = tl.where(k < 16, tl.sum(tl.where(steps == k + 1, c, 0), 0), n_lo)
                # G(lo) >= bound > G(hi) = g_hi. Copy the logits between (a few thousand on a
                # flat 152k row); the bisection's passes run over the copies, or over the row
                # where more than CAPACITY lie between.
                lo = _order_key(lo_v)
                hi = _order_key(hi_v)
                g_base = g_hi
                scratch = SCRATCH + row.to(tl.int64) * CAPACITY
                n_in = (lowest * 0).to(tl.int32)
                for s in range(0, V, BLOCK):
                    x = tl.load(x_row + s + offs, mask=s + offs < V, other=neg_inf)
                    key = _order_key(x)
                    inside = (key > lo) & (key <= hi) & (s + offs < V)
                    slot = n_in + tl.cumsum(inside.to(tl.int32), 0) - 1
                    tl.store(scratch + slot, x, mask=inside & (slot < CAPACITY))
                    n_in += tl.sum(inside.to(tl.int32), 0)
                copied = n_in <= CAPACITY
                tl.debug_barrier()
                for _ in range(33):  # the key range spans at most 2^32 + 1 values
                    mid = lo + (hi - lo) // 2
                    open_range = hi - lo > 1
                    g_acc = tl.zeros([BLOCK], tl.float64)
                    if open_range:
                        if copied:  # the mass above mid: above the bracket, and the copies' above mid
                            for s in range(0, n_in, BLOCK):
                                x = tl.load(scratch + s + offs, mask=s + offs < n_in, other=neg_inf)
                                g_acc += tl.where(_order_key(x) > mid, _weight(x, m, USE_LIBDEVICE), 0.0)
                        else:
                            for s in range(0, V, BLOCK):
                                x = tl.load(x_row + s + offs, mask=s + offs < V, other=neg_inf)
                                g_acc += tl.where(_order_key(x) > mid, _weight(x, m, USE_LIBDEVICE), 0.0)
                    g = tl.sum(g_acc, 0) + tl.where(copied, g_base, 0.0)
                    below = (g < bound) & open_range
                    lo = tl.where(open_range & (g >= bound), mid, lo)
                    hi = tl.where(below, mid, hi)
                    g_hi = tl.where(below, g, g_hi)
                ties = tl.zeros([BLOCK], tl.int64)
                above = tl.zeros([BLOCK], tl.int64)
                for s in range(0, V, BLOCK):
                    key = _order_key(tl.load(x_row + s + offs, mask=s + offs < V, other=neg_inf))
                    ties += (key == hi).to(tl.int64)
                    above += (key > hi).to(tl.int64)
                n_ties = tl.sum(ties, 0)
                q = _weight(_key_value(hi), m, USE_LIBDEVICE)
                r = tl.minimum(tl.maximum(tl.math.ceil((bound - g_hi) / q).to(tl.int64), 1), n_ties)
                n_kept = tl.sum(above, 0) + r
            else:
                hi = lowest
                r = lowest * 0
                n_kept = lowest * 0 + V
            # Inverse CDF in index order over the kept weights: the total, then the count of
            # cumulative weights <= u * total (the same running sums both times).
            total = z * 0.0
            tie_rank = lowest * 0
            last = lowest * 0
            for s in range(0, V, BLOCK):
                x = tl.load(x_row + s + offs, mask=s + offs < V, other=neg_inf)
                w, tie_rank = _kept_weights(x, m, hi, r, tie_rank, USE_LIBDEVICE)
                cum = total + tl.cumsum(w, 0)
                total = tl.sum(tl.where(offs == BLOCK - 1, cum, 0.0), 0)
                last = tl.maximum(last, tl.max(tl.where(w > 0.0, s + offs, 0), 0).to(tl.int64))
            target = tl.load(U + row) * total
            count = lowest * 0
            run = z * 0.0
            tie_rank = lowest * 0
            for s in range(0, V, BLOCK):
                x = tl.load(x_row + s + offs, mask=s + offs < V, other=neg_inf)
                w, tie_rank = _kept_weights(x, m, hi, r, tie_rank, USE_LIBDEVICE)
                cum = run + tl.cumsum(w, 0)
                run = tl.sum(tl.where(offs == BLOCK - 1, cum, 0.0), 0)
                count += tl.sum((cum <= target).to(tl.int64), 0)
            tl.store(TOKENS + row, tl.minimum(count, last))
            tl.store(KEPT + row, n_kept.to(tl.int32))


    @triton.jit
    def _row_mass_kernel(
        X, M, PART,  # [N, V] fp32, [N] fp32 row maxima, [N, chunks] fp64 partial sums
        V, stride, chunks,
        CHUNK: tl.constexpr, BLOCK: tl.constexpr, USE_LIBDEVICE: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_for_previous(PDL)
        row = tl.program_id(0)
        chunk = tl.program_id(1)
        x_row = X + row.to(tl.int64) * stride
        m = tl.load(M + row)
        acc = tl.zeros([BLOCK], tl.float64)
        for s in range(0, CHUNK, BLOCK):
            offs = chunk * CHUNK + s + tl.arange(0, BLOCK)
            x = tl.load(x_row + offs, mask=offs < V, other=float("-inf"))
            acc += _weight(x, m, USE_LIBDEVICE)
        tl.store(PART + row * chunks + chunk, tl.sum(acc, 0))



    @triton.jit
    def _sample_candidates_kernel(
        X, U, TOP_P, TOKENS, NEED, KEPT,  # [N, V] fp32, [N] fp64, 0-d fp64, [N] int64, [N] int8, [N] int32
        CAND_X, CAND_I, CAND_KEPT,  # [N, CAP] fp32, int32, int8: the row's candidates (scratch)
        V, stride,
        CAP: tl.constexpr, BINS: tl.constexpr, SCALE: tl.constexpr, BLOCK: tl.constexpr,
        USE_LIBDEVICE: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_for_previous(PDL)
        row = tl.program_id(0)
        x_row = X + row.to(tl.int64) * stride
        offs = tl.arange(0, BLOCK)
        neg_inf = float("-inf")
        # 1. The row's maximum.
        top = tl.full([BLOCK], neg_inf, tl.float32)
        for s in range(0, V, BLOCK):
            top = tl.maximum(top, tl.load(x_row + s + offs, mask=s + offs < V, other=neg_inf))
        m = tl.max(top, 0)
        # 2. The normaliser, and how many logits lie in each group of 32 bins below the maximum
        # (a histogram costs its warps about bins / 32 steps a logit: two levels of 32 bins
        # find the same bins as one of 1024).
        z_acc = tl.zeros([BLOCK], tl.float64)
        coarse = tl.zeros([32], tl.int32)
        for s in range(0, V, BLOCK):
            x = tl.load(x_row + s + offs, mask=s + offs < V, other=neg_inf)
            z_acc += _weight(x, m, USE_LIBDEVICE)
            coarse += tl.histogram(_bin(x, m, SCALE, BINS) // 32, 32)  # padding lands in the last bin
        z = tl.sum(z_acc, 0)
        groups = tl.arange(0, 32)
        g_star = tl.minimum(tl.sum((tl.cumsum(coarse, 0) <= CAP).to(tl.int32), 0), 31)
        base = tl.sum(tl.where(groups < g_star, coarse, 0), 0)
        # 3. The bins of group g_star (the others go to bin 63 of 64).
        fine = tl.zeros([64], tl.int32)
        for s in range(0, V, BLOCK):
            b = _bin(tl.load(x_row + s + offs, mask=s + offs < V, other=neg_inf), m, SCALE, BINS)
            fine += tl.histogram(tl.where(b // 32 == g_star, b % 32, 63), 64)
        sub = tl.arange(0, 64)
        fine = tl.where(sub < 32, fine, 0)
        # The candidates: the most whole bins (never the last) that hold at most CAP logits.
        b_star = tl.minimum(g_star * 32 + tl.sum(((base + tl.cumsum(fine, 0) <= CAP) & (sub < 32)).to(tl.int32), 0), BINS - 1)
        n = base + tl.sum(tl.where(g_star * 32 + sub < b_star, fine, 0), 0)
        # 4. Their copies in index order.
        cand_x = CAND_X + row * CAP
        cand_i = CAND_I + row * CAP
        filled = n * 0
        for s in range(0, V, BLOCK):
            x = tl.load(x_row + s + offs, mask=s + offs < V, other=neg_inf)
            inside = _bin(x, m, SCALE, BINS) < b_star
            slot = filled + tl.cumsum(inside.to(tl.int32), 0) - 1
            tl.store(cand_x + slot, x, mask=inside)
            tl.store(cand_i + slot, s + offs, mask=inside)
            filled += tl.sum(inside.to(tl.int32), 0)
        tl.debug_barrier()
        # 5. The nucleus among them in the stable sorted order: value descending, then index
        # ascending (a candidate's slot is in index order), one int64 key each.
        j = tl.arange(0, CAP)
        valid = j < n
        xs = tl.load(cand_x + j, mask=valid, other=neg_inf)
        lowest = -(1 << 62)
        key = tl.where(valid, _order_key(xs) * 65536 + (65535 - j), lowest)
        key = tl.sort(key, 0, descending=True)
        valid_s = key != lowest
        j_s = 65535 - (key & 65535)
        p_s = tl.where(valid_s, _weight(_key_value(key >> 16), m, USE_LIBDEVICE) / z, 0.0)
        keep = valid_s & (tl.cumsum(p_s, 0) - p_s < tl.load(TOP_P))  # the top one always stays
        n_kept = tl.sum(keep.to(tl.int32), 0)
        tl.store(CAND_KEPT + row * CAP + j_s, keep.to(tl.int8), mask=valid_s)
        tl.debug_barrier()
        # 6. Inverse CDF in index order over the kept candidates (nucleus_sample_ref's running
        # sums, whose other weights are zeros).
        kept = tl.load(CAND_KEPT + row * CAP + j, mask=valid, other=0) != 0
        cdf = tl.cumsum(tl.where(kept, _weight(xs, m, USE_LIBDEVICE) / z, 0.0), 0)
        total = tl.max(cdf, 0)
        count = tl.sum((cdf <= tl.load(U + row) * total).to(tl.int32), 0)
        first_full = tl.min(tl.where(cdf == total, j, CAP), 0)  # never past the last kept weight
        pick = tl.minimum(count, first_full)
        token = tl.sum(tl.where(j == pick, tl.load(cand_i + j, mask=valid, other=0), 0), 0)
        tl.store(TOKENS + row, token.to(tl.int64))
        # The kept set is the nucleus unless every candidate was kept (then it may go on).
        tl.store(NEED + row, ((n_kept == n) & (n < V)).to(tl.int8))
        tl.store(KEPT + row, n_kept)

MASS_CHUNK = 8192  # logits a program sums (a multiple of its block): 19 programs a row at 152k tokens


def row_mass_triton(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """row_mass_ref on the GPU: partial float64 sums per chunk of the row (one program each),
    then their sum; the same weights, another order of summation. [N, 1] float64."""
    n, v = x.shape
    m = m.contiguous()  # the maxima may be a column of the candidates
    chunks = triton.cdiv(v, MASS_CHUNK)
    part = torch.empty(n, chunks, dtype=torch.float64, device=x.device)
    _row_mass_kernel[(n, chunks)](
        x, m, part, v, x.stride(0), chunks, CHUNK=MASS_CHUNK, BLOCK=min(BLOCK, MASS_CHUNK), USE_LIBDEVICE=not interpreting(),
        num_warps=WARPS, enable_fp_fusion=False, **launch_args(x.device, n),
    )
    return part.sum(-1, keepdim=True)


def row_mass(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """sum(exp(x - m)) of each row in float64 ([N, 1]), m [N] fp32 the row maxima: Triton on CUDA
    tensors (one read of the rows), the reference elsewhere."""
    if x.is_cuda and triton is not None:
        return row_mass_triton(x, m)
    return row_mass_ref(x, m)


def nucleus_sample_triton(
    x: torch.Tensor, top_p: float | torch.Tensor, u: torch.Tensor, need: torch.Tensor,
    tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """nucleus_sample_ref for the rows where `need` ([N] bool or int8) is set; the other rows'
    outputs are left unwritten (`tokens`, if given, keeps them). x [N, V] fp32 (contiguous
    rows), u [N] float64."""
    n, v = x.shape
    nucleus = isinstance(top_p, torch.Tensor) or top_p < 1.0
    if not isinstance(top_p, torch.Tensor):  # a fill, not a host copy: capturable in a graph
        top_p = torch.full((), top_p, dtype=torch.float64, device=x.device)
    if tokens is None:
        tokens = torch.empty(n, dtype=torch.int64, device=x.device)
    kept = torch.empty(n, dtype=torch.int32, device=x.device)
    scratch = torch.empty(n if nucleus else 1, FALLBACK_CAPACITY if nucleus else 1, dtype=torch.float32, device=x.device)
    _nucleus_sample_kernel[(n,)](
        x, u, top_p, need.view(torch.int8), tokens, kept, scratch, v, x.stride(0),
        NUCLEUS=nucleus, CAPACITY=FALLBACK_CAPACITY, LEVELS=BRACKET_LEVELS, BLOCK=BLOCK, BLOCK_T=BLOCK // 8, USE_LIBDEVICE=not interpreting(), num_warps=FALLBACK_WARPS, enable_fp_fusion=False,
        **launch_args(x.device, n),
    )
    return tokens, kept


def nucleus_sample(
    x: torch.Tensor, top_p: float | torch.Tensor, u: torch.Tensor, need: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton on CUDA tensors (rows where `need` is set), the sort-based reference elsewhere
    (every row)."""
    if x.is_cuda and triton is not None:
        return nucleus_sample_triton(x, top_p, u, need)
    return nucleus_sample_ref(x, top_p, u)




def sample_candidates_triton(
    x: torch.Tensor, top_p: float | torch.Tensor, u: torch.Tensor, candidates: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """nucleus_sample_ref's token for each row of x [N, V] fp32 (contiguous rows) whose nucleus
    lies among its top logits, in one program a row: (tokens [N] int64, need [N] int8, kept [N]
    int32). The candidates are every logit above a value chosen from a histogram of the row so
    that at most `candidates` (a power of two, <= 65536) are; where all of them are kept the
    nucleus may go on (`need` is 1: nucleus_sample_triton decides that row, and its token and
    kept count here are not the row's). u [N] float64; top_p a float < 1 or a 0-d float64
    tensor."""
    n, v = x.shape
    if not isinstance(top_p, torch.Tensor):
        top_p = torch.full((), top_p, dtype=torch.float64, device=x.device)
    tokens = torch.empty(n, dtype=torch.int64, device=x.device)
    need = torch.empty(n, dtype=torch.int8, device=x.device)
    kept = torch.empty(n, dtype=torch.int32, device=x.device)
    cand_x = torch.empty(n, candidates, dtype=torch.float32, device=x.device)
    cand_i = torch.empty(n, candidates, dtype=torch.int32, device=x.device)
    cand_kept = torch.empty(n, candidates, dtype=torch.int8, device=x.device)
    _sample_candidates_kernel[(n,)](
        x, u, top_p, tokens, need, kept, cand_x, cand_i, cand_kept, v, x.stride(0),
        CAP=candidates, BINS=CANDIDATE_BINS, SCALE=BIN_SCALE, BLOCK=BLOCK, USE_LIBDEVICE=not interpreting(),
        num_warps=CANDIDATE_WARPS, enable_fp_fusion=False, **launch_args(x.device, n),
    )
    return tokens, need, kept


def nucleus_sample_in_candidates_triton(
    x: torch.Tensor, top_p: float | torch.Tensor, u: torch.Tensor, candidates: int
) -> torch.Tensor:
    """nucleus_sample_ref's token for every row ([N] int64) in two launches: the candidates
    kernel, then the bisection kernel for the rows whose nucleus goes past their candidates
    (it returns at once for the others, so a CUDA graph holds both whatever the rows)."""
    tokens, need, _ = sample_candidates_triton(x, top_p, u, candidates)
    return nucleus_sample_triton(x, top_p, u, need, tokens)[0]


def triton_samples(x: torch.Tensor) -> bool:
    """Whether the sampling kernels run on x: a CUDA tensor, with Triton installed."""
    return x.is_cuda and triton is not None

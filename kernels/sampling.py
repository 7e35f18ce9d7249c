"""Top-p (nucleus) sampling of whole vocabulary rows without a sort of the row.

Contract: `nucleus_sample_ref` (kernels/reference.py), the sorted definition: tokens in stable
descending order of the logit, kept while the mass before them is below top_p, then one token
by inverse CDF in index order over the kept tokens' renormalised probabilities. The weights are
torch's (exp(x - max) in fp32, CUDA expf through libdevice; numpy's exp under the interpreter),
their sums float64 in another order: the kept set can differ from the reference's only where a
cumulative mass lies within float64 rounding of top_p, and the sampled token only where
u * total lies within rounding of a cumulative weight.

Two stages, launched one after the other by engine/sampling.py on the GPU:

- The fast path (`sample_candidates_triton`), five launches. Four passes over the row, each a
  program per CANDIDATE_CHUNK logits of every row, so a row is read by many SMs at once (one
  program a row left a 152k-logit row's passes on one SM: ~250 us, latency-bound, at 1 row as
  at 64): the chunks' maxima; the chunks' shares of the normaliser and a histogram of m - x in
  bins of 1/BIN_SCALE, two levels of 32 bins (the groups, then the bins of one group); a copy
  of every logit in the most whole top bins that hold at most CANDIDATES, with its index. Then
  one program a row (`_candidates_draw_kernel`) sorts the copies by (value descending, index
  ascending), takes the nucleus as their prefix, sorts the kept ones by index and draws. The
  candidates are every logit above some value, so every token outside them comes later in
  the sorted order: unless every candidate is kept, the nucleus is exactly the kept prefix.
  Else the row is left to the next kernel (`need`).
  Deterministic: the histograms and the candidates' slots are integer atomic adds (the counts
  are the same in any order; the slots are not, and the draw sorts the copies, so it does not
  depend on them); the maximum and the float64 normaliser are per-chunk partials combined in
  chunk order. The chunk length is fixed (not a function of the row count), so a row's kept set
  and token depend only on its logits, top_p and u, not on the rows sampled with it.
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

from dataclasses import dataclass

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
FALLBACK_WARPS = 8  # the bisection kernel's warps
CANDIDATE_WARPS = 8  # the candidates passes' warps, a program per chunk
DRAW_WARPS = 4  # the candidates' sort and draw: CANDIDATES elements, one program a row
# Logits of a row that one program of the candidates passes reads: 75 programs a row at 152k
# tokens, so an AR step's single row spreads over most SMs of an H100/H200 (132) and 64 rows
# are 4800 programs of one block each, a few to an SM at a time. A fixed length, not one that
# follows the row count, so a row's partial sums (hence its token) do not depend on how many
# rows are sampled with it.
CANDIDATE_CHUNK = 2048
COUNT_SLOTS = 128  # a row's counts: 32 group counts, 32 bin counts, the candidates copied
INDEX_BITS = 24  # token index bits in the sort keys (vocabularies up to 16.7M tokens)
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
            offs, inside = _chunk_offsets(chunk, s, V, CHUNK, BLOCK)
            x = tl.load(x_row + offs, mask=inside, other=float("-inf"))
            acc += _weight(x, m, USE_LIBDEVICE)
        tl.store(PART + row * chunks + chunk, tl.sum(acc, 0))



    # The candidates phase, over many programs a row: each program takes one chunk of
    # CANDIDATE_CHUNK logits, and the four passes are four launches (each needs the whole row's
    # result of the one before: its maximum, then its coarse histogram, then its fine one). The
    # row's counts (two histograms of 32 bins and the candidates copied) live in COUNTS
    # [N, COUNT_SLOTS] int32, summed by atomic adds: integer sums, the same in any order. The
    # maximum and the float64 normaliser are per-chunk partials, combined in chunk order.

    @triton.jit
    def _chunk_offsets(chunk, s, V, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
        """The indices of block s of a chunk, and which of them are the chunk's logits."""
        offs = chunk * CHUNK + s + tl.arange(0, BLOCK)
        return offs, (s + tl.arange(0, BLOCK) < CHUNK) & (offs < V)

    @triton.jit
    def _row_max(PART_M, row, chunks, CHUNKS_P: tl.constexpr):
        c = tl.arange(0, CHUNKS_P)
        return tl.max(tl.load(PART_M + row * chunks + c, mask=c < chunks, other=float("-inf")), 0)

    @triton.jit
    def _star_group(coarse, CAP: tl.constexpr):
        """The group of 32 bins that the candidates end in, from the row's 32 group counts: the
        first whose count would take the running total past CAP (the last group at most); and
        the count of the groups before it."""
        groups = tl.arange(0, 32)
        g_star = tl.minimum(tl.sum((tl.cumsum(coarse, 0) <= CAP).to(tl.int32), 0), 31)
        return g_star, tl.sum(tl.where(groups < g_star, coarse, 0), 0)

    @triton.jit
    def _star_bin(g_star, base, fine, CAP: tl.constexpr, BINS: tl.constexpr):
        """The first bin that is not a candidate: the most whole bins (never the last) whose
        logits number at most CAP, from the bin counts of group g_star."""
        k = tl.sum((base + tl.cumsum(fine, 0) <= CAP).to(tl.int32), 0)
        return tl.minimum(g_star * 32 + k, BINS - 1)

    @triton.jit
    def _candidates_max_kernel(
        X, PART_M, COUNTS,  # [N, V] fp32, [N, chunks] fp32, [N, COUNT_SLOTS] int32
        V, stride, chunks,
        CHUNK: tl.constexpr, BLOCK: tl.constexpr, SLOTS: tl.constexpr, PDL: tl.constexpr,
    ):
        """Pass 1: each chunk's maximum. Also zeroes the row's counts for the passes after."""
        wait_for_previous(PDL)
        row = tl.program_id(0)
        chunk = tl.program_id(1)
        x_row = X + row.to(tl.int64) * stride
        top = tl.full([BLOCK], float("-inf"), tl.float32)
        for s in range(0, CHUNK, BLOCK):
            offs, inside = _chunk_offsets(chunk, s, V, CHUNK, BLOCK)
            top = tl.maximum(top, tl.load(x_row + offs, mask=inside, other=float("-inf")))
        tl.store(PART_M + row * chunks + chunk, tl.max(top, 0))
        if chunk == 0:
            slots = tl.arange(0, SLOTS)
            tl.store(COUNTS + row * SLOTS + slots, tl.zeros([SLOTS], tl.int32))

    @triton.jit
    def _candidates_mass_kernel(
        X, PART_M, PART_Z, COUNTS,  # ..., [N, chunks] fp64 partial normalisers
        V, stride, chunks,
        CHUNK: tl.constexpr, BLOCK: tl.constexpr, CHUNKS_P: tl.constexpr, SLOTS: tl.constexpr,
        BINS: tl.constexpr, SCALE: tl.constexpr, USE_LIBDEVICE: tl.constexpr, PDL: tl.constexpr,
    ):
        """Pass 2: each chunk's share of the normaliser, and its logits counted into the row's
        32 groups of 32 bins below the maximum (COUNTS[:, 0:32]). A histogram costs its warps
        about bins / 32 steps a logit: two levels of 32 bins find the same bins as one of 1024."""
        wait_for_previous(PDL)
        row = tl.program_id(0)
        chunk = tl.program_id(1)
        x_row = X + row.to(tl.int64) * stride
        m = _row_max(PART_M, row, chunks, CHUNKS_P)
        z_acc = tl.zeros([BLOCK], tl.float64)
        coarse = tl.zeros([32], tl.int32)
        for s in range(0, CHUNK, BLOCK):
            offs, inside = _chunk_offsets(chunk, s, V, CHUNK, BLOCK)
            x = tl.load(x_row + offs, mask=inside, other=float("-inf"))
            z_acc += _weight(x, m, USE_LIBDEVICE)
            # padding counts into the last group, which is never a candidate
            coarse += tl.histogram(_bin(x, m, SCALE, BINS) // 32, 32)
        tl.store(PART_Z + row * chunks + chunk, tl.sum(z_acc, 0))
        tl.atomic_add(COUNTS + row * SLOTS + tl.arange(0, 32), coarse)

    @triton.jit
    def _candidates_fine_kernel(
        X, PART_M, COUNTS,
        V, stride, chunks,
        CHUNK: tl.constexpr, BLOCK: tl.constexpr, CHUNKS_P: tl.constexpr, SLOTS: tl.constexpr,
        CAP: tl.constexpr, BINS: tl.constexpr, SCALE: tl.constexpr, PDL: tl.constexpr,
    ):
        """Pass 3: each chunk's logits counted into the 32 bins of the row's group g_star
        (COUNTS[:, 32:64]; the logits of other groups go to a 64th bin, not kept)."""
        wait_for_previous(PDL)
        row = tl.program_id(0)
        chunk = tl.program_id(1)
        x_row = X + row.to(tl.int64) * stride
        m = _row_max(PART_M, row, chunks, CHUNKS_P)
        g_star, _ = _star_group(tl.load(COUNTS + row * SLOTS + tl.arange(0, 32)), CAP)
        fine = tl.zeros([64], tl.int32)
        for s in range(0, CHUNK, BLOCK):
            offs, inside = _chunk_offsets(chunk, s, V, CHUNK, BLOCK)
            b = _bin(tl.load(x_row + offs, mask=inside, other=float("-inf")), m, SCALE, BINS)
            fine += tl.histogram(tl.where(b // 32 == g_star, b % 32, 63), 64)
        sub = tl.arange(0, 64)
        tl.atomic_add(COUNTS + row * SLOTS + 32 + sub, fine, mask=sub < 32)

    @triton.jit
    def _candidates_copy_kernel(
        X, PART_M, COUNTS, CAND_X, CAND_I,  # ..., [N, CAP] fp32 and int32: the candidates
        V, stride, chunks,
        CHUNK: tl.constexpr, BLOCK: tl.constexpr, CHUNKS_P: tl.constexpr, SLOTS: tl.constexpr,
        CAP: tl.constexpr, BINS: tl.constexpr, SCALE: tl.constexpr, PDL: tl.constexpr,
    ):
        """Pass 4: each chunk's logits in bins below b_star, copied with their indices into
        slots that an atomic count hands out (COUNTS[:, 64] ends as the row's candidates): in
        no fixed order, which the last kernel does not depend on (it sorts them)."""
        wait_for_previous(PDL)
        row = tl.program_id(0)
        chunk = tl.program_id(1)
        x_row = X + row.to(tl.int64) * stride
        m = _row_max(PART_M, row, chunks, CHUNKS_P)
        counts = COUNTS + row * SLOTS
        g_star, base = _star_group(tl.load(counts + tl.arange(0, 32)), CAP)
        b_star = _star_bin(g_star, base, tl.load(counts + 32 + tl.arange(0, 32)), CAP, BINS)
        for s in range(0, CHUNK, BLOCK):
            offs, inside = _chunk_offsets(chunk, s, V, CHUNK, BLOCK)
            x = tl.load(x_row + offs, mask=inside, other=float("-inf"))
            take = _bin(x, m, SCALE, BINS) < b_star  # never padding: it is in the last bin
            n_take = tl.sum(take.to(tl.int32), 0)
            if n_take > 0:
                slot = tl.atomic_add(counts + 64, n_take) + tl.cumsum(take.to(tl.int32), 0) - 1
                tl.store(CAND_X + row * CAP + slot, x, mask=take)
                tl.store(CAND_I + row * CAP + slot, offs, mask=take)

    @triton.jit
    def _candidates_draw_kernel(
        U, TOP_P, TOKENS, NEED, KEPT,  # [N] fp64, 0-d fp64, [N] int64, [N] int8, [N] int32
        PART_M, PART_Z, COUNTS, CAND_X, CAND_I,
        V, chunks,
        CHUNKS_P: tl.constexpr, SLOTS: tl.constexpr, CAP: tl.constexpr, INDEX_BITS: tl.constexpr,
        USE_LIBDEVICE: tl.constexpr, PDL: tl.constexpr,
    ):
        """One program a row: the candidates sorted by (value descending, index ascending), the
        nucleus as their kept prefix; then sorted by index for the inverse CDF, and the draw."""
        wait_for_previous(PDL)
        row = tl.program_id(0)
        c = tl.arange(0, CHUNKS_P)
        m = _row_max(PART_M, row, chunks, CHUNKS_P)
        z = tl.sum(tl.load(PART_Z + row * chunks + c, mask=c < chunks, other=0.0), 0)  # chunk order
        n = tl.load(COUNTS + row * SLOTS + 64)
        j = tl.arange(0, CAP)
        valid = j < n
        xs = tl.load(CAND_X + row * CAP + j, mask=valid, other=float("-inf"))
        ids = tl.load(CAND_I + row * CAP + j, mask=valid, other=0).to(tl.int64)
        # The stable sorted order in one int64 key: the value's order key, then the index reversed.
        low = (1 << INDEX_BITS) - 1
        lowest = -(1 << 62)
        key = tl.where(valid, _order_key(xs) * (1 << INDEX_BITS) + (low - ids), lowest)
        key = tl.sort(key, 0, descending=True)
        valid_s = key != lowest
        value_key = key >> INDEX_BITS  # arithmetic shift: the order key, whatever its sign
        p_s = tl.where(valid_s, _weight(_key_value(value_key), m, USE_LIBDEVICE) / z, 0.0)
        keep = valid_s & (tl.cumsum(p_s, 0) - p_s < tl.load(TOP_P))  # the top one always stays
        n_kept = tl.sum(keep.to(tl.int32), 0)
        # Index order (nucleus_sample_ref's running sums, whose other weights are zeros): the
        # index, the kept bit and the order key (offset to be non-negative) in one int64 key.
        key = tl.where(valid_s, (low - (key & low)) * (1 << 33) + keep.to(tl.int64) * (1 << 32)
                       + (value_key + (1 << 31)), 1 << 62)
        key = tl.sort(key, 0)
        kept = ((key >> 32) & 1) != 0
        x_i = _key_value(key - ((key >> 32) << 32) - (1 << 31))
        cdf = tl.cumsum(tl.where(valid & kept, _weight(x_i, m, USE_LIBDEVICE) / z, 0.0), 0)
        total = tl.max(cdf, 0)
        count = tl.sum((cdf <= tl.load(U + row) * total).to(tl.int32), 0)
        first_full = tl.min(tl.where(cdf == total, j, CAP), 0)  # never past the last kept weight
        pick = tl.minimum(count, first_full)
        token = tl.sum(tl.where(j == pick, key >> 33, 0), 0)
        tl.store(TOKENS + row, token)
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




@dataclass
class CandidateScratch:
    """What the candidates passes leave for the draw, per row (allocated per call: inside a CUDA
    graph, once per captured row count)."""

    part_m: torch.Tensor  # [N, chunks] fp32: each chunk's maximum
    part_z: torch.Tensor  # [N, chunks] fp64: each chunk's share of the normaliser
    counts: torch.Tensor  # [N, COUNT_SLOTS] int32: group counts, bin counts, candidates copied
    cand_x: torch.Tensor  # [N, CAP] fp32: the candidates' logits, in no fixed order
    cand_i: torch.Tensor  # [N, CAP] int32: their token indices

    @property
    def n(self) -> torch.Tensor:
        """The candidates of each row ([N] int32)."""
        return self.counts[:, 64]


def find_candidates_triton(x: torch.Tensor, candidates: int) -> CandidateScratch:
    """The candidates of each row of x [N, V] fp32 (contiguous rows): every logit above a value
    chosen from a histogram of the row so that at most `candidates` (a power of two, <= 65536)
    are. Four launches of one program per CANDIDATE_CHUNK logits of each row."""
    n, v = x.shape
    if v > 1 << INDEX_BITS:
        raise ValueError(f"the sampling kernels take at most {1 << INDEX_BITS} logits a row, not {v}")
    dev = x.device
    chunks = triton.cdiv(v, CANDIDATE_CHUNK)
    s = CandidateScratch(
        part_m=torch.empty(n, chunks, dtype=torch.float32, device=dev),
        part_z=torch.empty(n, chunks, dtype=torch.float64, device=dev),
        counts=torch.empty(n, COUNT_SLOTS, dtype=torch.int32, device=dev),  # zeroed by the first pass
        cand_x=torch.empty(n, candidates, dtype=torch.float32, device=dev),
        cand_i=torch.empty(n, candidates, dtype=torch.int32, device=dev),
    )
    shape = dict(CHUNK=CANDIDATE_CHUNK, BLOCK=min(BLOCK, CANDIDATE_CHUNK), SLOTS=COUNT_SLOTS)
    wide = dict(CHUNKS_P=triton.next_power_of_2(chunks), **shape)
    hist = dict(BINS=CANDIDATE_BINS, SCALE=BIN_SCALE)
    warps = dict(num_warps=CANDIDATE_WARPS, enable_fp_fusion=False)
    grid = (n, chunks)
    row = (v, x.stride(0), chunks)
    _candidates_max_kernel[grid](x, s.part_m, s.counts, *row, **shape, **warps, **launch_args(dev, n))
    _candidates_mass_kernel[grid](x, s.part_m, s.part_z, s.counts, *row, **wide, **hist,
                                  USE_LIBDEVICE=not interpreting(), **warps, **launch_args(dev, n))
    _candidates_fine_kernel[grid](x, s.part_m, s.counts, *row, **wide, CAP=candidates, **hist, **warps,
                                  **launch_args(dev, n))
    _candidates_copy_kernel[grid](x, s.part_m, s.counts, s.cand_x, s.cand_i, *row, **wide, CAP=candidates,
                                  **hist, **warps, **launch_args(dev, n))
    return s


def draw_candidates_triton(
    s: CandidateScratch, v: int, top_p: float | torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The nucleus among each row's candidates (of a row of v logits) and its token for u [N]
    float64, one program a row: (tokens [N] int64, need [N] int8, kept [N] int32) as
    sample_candidates_triton. The order of the candidates' slots does not matter."""
    n, candidates = s.cand_x.shape
    dev = s.cand_x.device
    if not isinstance(top_p, torch.Tensor):
        top_p = torch.full((), top_p, dtype=torch.float64, device=dev)
    tokens = torch.empty(n, dtype=torch.int64, device=dev)
    need = torch.empty(n, dtype=torch.int8, device=dev)
    kept = torch.empty(n, dtype=torch.int32, device=dev)
    chunks = s.part_m.shape[1]
    _candidates_draw_kernel[(n,)](
        u, top_p, tokens, need, kept, s.part_m, s.part_z, s.counts, s.cand_x, s.cand_i, v, chunks,
        CHUNKS_P=triton.next_power_of_2(chunks), SLOTS=COUNT_SLOTS, CAP=candidates, INDEX_BITS=INDEX_BITS,
        USE_LIBDEVICE=not interpreting(), num_warps=DRAW_WARPS, enable_fp_fusion=False, **launch_args(dev, n),
    )
    return tokens, need, kept


def sample_candidates_triton(
    x: torch.Tensor, top_p: float | torch.Tensor, u: torch.Tensor, candidates: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """nucleus_sample_ref's token for each row of x [N, V] fp32 (contiguous rows) whose nucleus
    lies among its top logits: (tokens [N] int64, need [N] int8, kept [N] int32), in five
    launches (find_candidates_triton, draw_candidates_triton). The candidates are every logit
    above a value chosen so that at most `candidates` (a power of two, <= 65536) are; where all
    of them are kept the nucleus may go on (`need` is 1: nucleus_sample_triton decides that
    row, and its token and kept count here are not the row's). u [N] float64; top_p a float < 1
    or a 0-d float64 tensor. Fixed launch shapes for a given N and V and no host sync: a CUDA
    graph holds it."""
    return draw_candidates_triton(find_candidates_triton(x, candidates), x.shape[1], top_p, u)


def nucleus_sample_in_candidates_triton(
    x: torch.Tensor, top_p: float | torch.Tensor, u: torch.Tensor, candidates: int
) -> torch.Tensor:
    """nucleus_sample_ref's token for every row ([N] int64): the candidates stage
    (`sample_candidates_triton`, five launches), then the bisection kernel for the rows whose
    nucleus goes past their candidates (it returns at once for the others, so a CUDA graph holds
    them all whatever the rows)."""
    tokens, need, _ = sample_candidates_triton(x, top_p, u, candidates)
    return nucleus_sample_triton(x, top_p, u, need, tokens)[0]


def triton_samples(x: torch.Tensor) -> bool:
    """Whether the sampling kernels run on x: a CUDA tensor, with Triton installed."""
    return x.is_cuda and triton is not None

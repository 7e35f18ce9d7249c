"""Top-p (nucleus) sampling of whole vocabulary rows without a sort: one program per row.

Contract: `nucleus_sample_ref` (kernels/reference.py), the sorted definition: tokens in stable
descending order of the logit, kept while the mass before them is below top_p, then one token
by inverse CDF in index order over the kept tokens' renormalised probabilities. The kernel finds
the same kept set by bisection instead: the smallest logit v* whose strictly-greater mass
G(v*) is below top_p * Z is the last kept value (G only changes at the row's own values, so
the bisection over the 2^32 order-preserving integer keys of the logits ends on one of them, in
33 passes over the row). Of the tokens tied at v*, the sorted order keeps the first
r = ceil((top_p * Z - G) / w(v*)) by index (at least one, at most all), and so does the kernel.
The weights are torch's (exp(x - max) in fp32, CUDA expf through libdevice; numpy's exp under
the interpreter), their sums float64 in another order: the kept set can differ from the
reference's only where a cumulative mass lies within float64 rounding of top_p, and the sampled
token only where u * total lies within rounding of a cumulative weight.

It is the exact fallback of engine/sampling.py: rows whose nucleus the top-K candidates do not
hold (`need`); rows not needed return at once, so inside a CUDA graph it costs a launch when
no row needs it. A needed row costs ~38 passes over its logits on one SM.

Also here: `row_mass`, the fast path's softmax normaliser in one read of the rows.
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
        V, stride,
        NUCLEUS: tl.constexpr, BLOCK: tl.constexpr, USE_LIBDEVICE: tl.constexpr, PDL: tl.constexpr,
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
                lo = lowest  # all the mass is above it: >= bound
                hi = _order_key(m)  # nothing above it: < bound
                g_hi = z * 0.0  # mass strictly above hi
                for _ in range(33):  # the key range spans 2^32 + 1 values
                    mid = lo + (hi - lo) // 2
                    g_acc = tl.zeros([BLOCK], tl.float64)
                    for s in range(0, V, BLOCK):
                        x = tl.load(x_row + s + offs, mask=s + offs < V, other=neg_inf)
                        w = _weight(x, m, USE_LIBDEVICE)
                        g_acc += tl.where(_order_key(x) > mid, w, 0.0)
                    g = tl.sum(g_acc, 0)
                    open_range = hi - lo > 1
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
    x: torch.Tensor, top_p: float | torch.Tensor, u: torch.Tensor, need: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """nucleus_sample_ref for the rows where `need` ([N] bool) is set; the other rows' outputs
    are left unwritten. x [N, V] fp32 (contiguous rows), u [N] float64."""
    n, v = x.shape
    nucleus = isinstance(top_p, torch.Tensor) or top_p < 1.0
    if not isinstance(top_p, torch.Tensor):  # a fill, not a host copy: capturable in a graph
        top_p = torch.full((), top_p, dtype=torch.float64, device=x.device)
    tokens = torch.empty(n, dtype=torch.int64, device=x.device)
    kept = torch.empty(n, dtype=torch.int32, device=x.device)
    _nucleus_sample_kernel[(n,)](
        x, u, top_p, need.view(torch.int8), tokens, kept, v, x.stride(0),
        NUCLEUS=nucleus, BLOCK=BLOCK, USE_LIBDEVICE=not interpreting(), num_warps=WARPS, enable_fp_fusion=False, **launch_args(x.device, n),
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

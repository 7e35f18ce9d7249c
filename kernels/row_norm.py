"""One row's residual add + RMSNorm, the arithmetic shared by the norm kernel (kernels/fused.py,
`_rms_norm_kernel`) and the batch-invariant GEMM's folded epilogue (kernels/matmul.py: at one row
the last program of a split launch normalises the row itself, one launch fewer).

Both call `rms_norm_row` with the same BLOCK and NUM_CHUNKS (`norm_launch`) and the same number of
warps (the GEMM folds only where its warps are the norm's: `folds_norm`), so the sum of squares is
reduced in the same order and a row's bits do not depend on which kernel normalised it (the GPU
tests check it at the real shapes). Its own module because matmul.py and fused.py both need it and
fused.py imports matmul.py.
"""
from __future__ import annotations

try:  # triton is optional: CPU-only installs use the torch references.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None

# A row of up to this many elements is held in registers (one read of x); longer rows loop over
# chunks of CHUNK_LOOP elements and read x twice (sum of squares, then normalise).
MAX_SINGLE_BLOCK = 8192
CHUNK_LOOP = 4096


def norm_launch(n_cols: int, block: int | None = None) -> tuple[int, int, int]:
    """(BLOCK, NUM_CHUNKS, num_warps) for a row of n_cols elements (block: a power of two to force)."""
    if block is None:
        block = triton.next_power_of_2(n_cols)
        block = block if block <= MAX_SINGLE_BLOCK else CHUNK_LOOP
    chunks = triton.cdiv(n_cols, block)
    return block, chunks, max(1, min(8, block // 512))


if triton is not None:

    @triton.jit
    def load_input(X, B, row, n_rows, n_cols, row_x, cols, mask, GROUPS: tl.constexpr, HAS_BIAS: tl.constexpr,
                   DT: tl.constexpr, CACHE: tl.constexpr):
        """Elements `cols` of row `row` of a linear's output, in DT. GROUPS == 0: X is that output.
        GROUPS > 0: X is its split launch's group sums [GROUPS, n_rows, n_cols] fp32 (`Partials`),
        summed here with `_sum_groups_kernel`'s arithmetic: in group order onto a zero fp32
        total, the bias (B) added, one cast. CACHE: the group sums' cache modifier (".cg", L2
        only, where programs of the same grid stored them)."""
        if GROUPS == 0:
            x = tl.load(X + row_x + cols, mask=mask, other=0.0)
        else:
            x = tl.zeros(cols.shape, dtype=tl.float32)
            for g in tl.static_range(GROUPS):
                x += tl.load(X + (g * n_rows + row) * n_cols + cols, mask=mask, other=0.0, cache_modifier=CACHE)
            if HAS_BIAS:
                x += tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
            x = x.to(DT)
        return x

    @triton.jit
    def load_row(X, R, B, row, n_rows, n_cols, row_x, row_r, cols, mask,
                 HAS_RES: tl.constexpr, GROUPS: tl.constexpr, HAS_BIAS: tl.constexpr, DT: tl.constexpr,
                 CACHE: tl.constexpr):
        """x (or x + residual, rounded to DT as torch's add is) in DT; x as `load_input`."""
        x = load_input(X, B, row, n_rows, n_cols, row_x, cols, mask, GROUPS, HAS_BIAS, DT, CACHE)
        if HAS_RES:
            r = tl.load(R + row_r + cols, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(DT)
        return x

    @triton.jit
    def rms_norm_row(
        X, R, B, W, Y, H, row, n_rows, n_cols, inv_n, eps, row_x, row_r, row_y, row_h,
        HAS_RES: tl.constexpr, GROUPS: tl.constexpr, HAS_BIAS: tl.constexpr, DT: tl.constexpr,
        BLOCK: tl.constexpr, NUM_CHUNKS: tl.constexpr, CACHE: tl.constexpr,
    ):
        """Row `row`: x (`load_row`; with HAS_RES h = x + r, written to H) normalised into Y:
        y = weight * (x.float() * rsqrt(mean(x.float()^2) + eps)).to(DT)."""
        cols = tl.arange(0, BLOCK)
        if NUM_CHUNKS == 1:
            mask = cols < n_cols
            x = load_row(X, R, B, row, n_rows, n_cols, row_x, row_r, cols, mask, HAS_RES, GROUPS, HAS_BIAS, DT, CACHE)
            if HAS_RES:
                tl.store(H + row_h + cols, x, mask=mask)
            xf = x.to(tl.float32)
            ss = tl.sum(xf * xf, 0)
            scale = tl.math.rsqrt(ss * inv_n + eps)
            y = (xf * scale).to(DT)
            w = tl.load(W + cols, mask=mask, other=0.0)
            out = y.to(tl.float32) * w.to(tl.float32)
            tl.store(Y + row_y + cols, out.to(Y.dtype.element_ty), mask=mask)
        else:
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for c in range(NUM_CHUNKS):
                cc = c * BLOCK + cols
                mask = cc < n_cols
                x = load_row(X, R, B, row, n_rows, n_cols, row_x, row_r, cc, mask, HAS_RES, GROUPS, HAS_BIAS, DT, CACHE)
                if HAS_RES:
                    tl.store(H + row_h + cc, x, mask=mask)
                xf = x.to(tl.float32)
                acc += xf * xf
            ss = tl.sum(acc, 0)
            scale = tl.math.rsqrt(ss * inv_n + eps)
            # Second pass re-reads the inputs (not H: no cross-thread read-after-write).
            for c in range(NUM_CHUNKS):
                cc = c * BLOCK + cols
                mask = cc < n_cols
                x = load_row(X, R, B, row, n_rows, n_cols, row_x, row_r, cc, mask, HAS_RES, GROUPS, HAS_BIAS, DT, CACHE)
                y = (x.to(tl.float32) * scale).to(DT)
                w = tl.load(W + cc, mask=mask, other=0.0)
                out = y.to(tl.float32) * w.to(tl.float32)
                tl.store(Y + row_y + cc, out.to(Y.dtype.element_ty), mask=mask)


__all__ = ["CHUNK_LOOP", "MAX_SINGLE_BLOCK", "norm_launch"]

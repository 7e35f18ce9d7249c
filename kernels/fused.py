"""Fused elementwise kernels for the decoder layer: RMSNorm, residual add + RMSNorm, SiLU*mul,
and per-head q/k RMSNorm + RoPE (alone, or with the K/V cache write: `qkv_rope_write`). One
launch each instead of the ~6-8 small kernels eager torch runs for the same step.

add_rms_norm and qkv_rope_write read a linear's output, or, where the batch-invariant GEMM
splits over K groups (kernels/matmul.py), its fp32 group sums (`Partials`), which they add as
they load with the group-sum pass's arithmetic (`_load_input`): that pass's launch is saved and
the bits are the same (tests/kernels/test_launch_fusion.py). Under tensor parallelism the
ranks' partials come the same way, read in place from the peers' symmetric buffers through a
table of their addresses (`Partials.group_ptrs`; tests/kernels/test_partials_in_place.py).

Numerics follow the eager code in engine/layers.py (and transformers) step by step, including
its intermediate roundings to the input dtype, so that swapping a kernel in changes as little
as possible:

  rms_norm:      y = weight * (x.float() * rsqrt(mean(x.float()^2) + eps)).to(x.dtype)
  add_rms_norm:  h = x + residual (rounded to x's dtype); y = rms_norm(h)
  silu_mul:      (g / (1 + exp(-g))) computed in fp32, rounded to the input dtype, then * up
  qk_norm_rope:  per head: optional rms_norm (rounded as above), then x*cos + rotate_half(x)*sin
                 with each product rounded to the input dtype before the add (as torch does)

Every kernel is launched with `enable_fp_fusion=False`: no mul+add contraction into FMAs, so each
product is rounded exactly as torch's separate elementwise kernels round it. What still differs
from torch in fp32 is the order of the sum of squares inside the mean (a parallel reduction
either way), i.e. about 1 ulp in the norm's scale factor. Everything else (the adds, the
products, the bf16 roundings, rsqrt / exp / division on the GPU through the same CUDA math as
torch's kernels) is the same operation.

Under TRITON_INTERPRET=1 (CPU tests) the kernels run in numpy; exp then comes from numpy instead
of libdevice (a ~1 ulp difference, no semantic one).

All kernels write fresh, out-of-place outputs, need no host sync and have grids that depend
on shapes only, so they can be captured in CUDA graphs.
"""
from __future__ import annotations

import torch

from .launch import interpreting, launch_args, wait_for_previous
from .matmul import Partials
from .reference import add_rms_norm_ref, qk_norm_rope_ref, qkv_rope_write_ref, rms_norm_ref, silu_mul_ref

try:  # triton is optional: CPU-only installs use the torch references.
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None
    libdevice = None

# A row of up to this many elements is held in registers (one read of x); longer rows loop over
# chunks of CHUNK_LOOP elements and read x twice (sum of squares, then normalise).
MAX_SINGLE_BLOCK = 8192
CHUNK_LOOP = 4096
SILU_BLOCK = 1024


# ----------------------------------------------------------------------------- triton kernels

if triton is not None:

    @triton.jit
    def _load_input(X, B, row, n_rows, n_cols, row_x, cols, mask,
                    GROUPS: tl.constexpr, PTRS: tl.constexpr, HAS_BIAS: tl.constexpr, DT: tl.constexpr):
        """Elements `cols` of row `row` of a linear's output, in DT. GROUPS == 0: X is that output.
        GROUPS > 0: its parts (`Partials`), summed here with `_sum_groups_kernel`'s arithmetic:
        in group order onto a zero fp32 total, the bias (B) added, one cast. The parts are X
        [GROUPS, n_rows, n_cols]; or, PTRS, X is a table of GROUPS int64 addresses, part g
        [n_rows, n_cols] at the g-th, and X's element type is the parts' (the table is passed
        viewed as their dtype: every launch argument is then a local tensor, none a peer's)."""
        if GROUPS == 0:
            x = tl.load(X + row_x + cols, mask=mask, other=0.0)
        else:
            x = tl.zeros(cols.shape, dtype=tl.float32)
            for g in tl.static_range(GROUPS):
                if PTRS:
                    # 16-byte aligned (the wrapper checks): the loads stay vectorised
                    address = tl.load(X.to(tl.pointer_type(tl.int64), bitcast=True) + g)
                    part = tl.multiple_of(address.to(tl.pointer_type(X.dtype.element_ty)), 16)
                    x += tl.load(part + row * n_cols + cols, mask=mask, other=0.0)
                else:
                    x += tl.load(X + (g * n_rows + row) * n_cols + cols, mask=mask, other=0.0)
            if HAS_BIAS:
                x += tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
            x = x.to(DT)
        return x

    @triton.jit
    def _load_row(X, R, B, row, n_rows, n_cols, row_x, row_r, cols, mask,
                  HAS_RES: tl.constexpr, GROUPS: tl.constexpr, PTRS: tl.constexpr, HAS_BIAS: tl.constexpr,
                  DT: tl.constexpr):
        """x (or x + residual, rounded to DT as torch's add is) in DT; x as `_load_input`."""
        x = _load_input(X, B, row, n_rows, n_cols, row_x, cols, mask, GROUPS, PTRS, HAS_BIAS, DT)
        if HAS_RES:
            r = tl.load(R + row_r + cols, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(DT)
        return x

    @triton.jit(do_not_specialize=["n_rows"])
    def _rms_norm_kernel(
        X, R, B, W, Y, H, n_rows, n_cols, inv_n, eps,
        stride_x, stride_r, stride_y, stride_h,
        HAS_RES: tl.constexpr, GROUPS: tl.constexpr, PTRS: tl.constexpr, HAS_BIAS: tl.constexpr,
        BLOCK: tl.constexpr, NUM_CHUNKS: tl.constexpr, PDL: tl.constexpr,
    ):
        """One row per program. HAS_RES: h = x + r is written to H and normalised. GROUPS > 0:
        x is summed from a split linear's group sums as it loads (`_load_input`); the code after
        the load is the same, so the result is that of the linear's own output."""
        wait_for_previous(PDL)
        DT: tl.constexpr = H.dtype.element_ty  # x's dtype (the wrapper passes X as H without a residual)
        row = tl.program_id(0).to(tl.int64)
        row_x = row * stride_x
        row_r = row * stride_r
        row_y = row * stride_y
        row_h = row * stride_h
        cols = tl.arange(0, BLOCK)
        if NUM_CHUNKS == 1:
            mask = cols < n_cols
            # The weight first: loaded after H's store it would wait for the reduction, and no
            # load may pass a store to memory that could alias it; here its latency hides
            # behind the input's.
            w = tl.load(W + cols, mask=mask, other=0.0)
            x = _load_row(X, R, B, row, n_rows, n_cols, row_x, row_r, cols, mask, HAS_RES, GROUPS, PTRS, HAS_BIAS, DT)
            if HAS_RES:
                tl.store(H + row_h + cols, x, mask=mask)
            xf = x.to(tl.float32)
            ss = tl.sum(xf * xf, 0)
            scale = tl.math.rsqrt(ss * inv_n + eps)
            y = (xf * scale).to(DT)
            out = y.to(tl.float32) * w.to(tl.float32)
            tl.store(Y + row_y + cols, out.to(Y.dtype.element_ty), mask=mask)
        else:
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for c in range(NUM_CHUNKS):
                cc = c * BLOCK + cols
                mask = cc < n_cols
                x = _load_row(X, R, B, row, n_rows, n_cols, row_x, row_r, cc, mask, HAS_RES, GROUPS, PTRS, HAS_BIAS, DT)
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
                x = _load_row(X, R, B, row, n_rows, n_cols, row_x, row_r, cc, mask, HAS_RES, GROUPS, PTRS, HAS_BIAS, DT)
                y = (x.to(tl.float32) * scale).to(DT)
                w = tl.load(W + cc, mask=mask, other=0.0)
                out = y.to(tl.float32) * w.to(tl.float32)
                tl.store(Y + row_y + cc, out.to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def _silu_mul_kernel(
        G, U, O, n_cols, stride_g, stride_u, stride_o,
        BLOCK: tl.constexpr, USE_LIBDEVICE: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_for_previous(PDL)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n_cols
        g = tl.load(G + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(U + row * stride_u + cols, mask=mask, other=0.0)
        # torch: x / (1 + exp(-x)) in fp32 (CUDA expf, IEEE division), rounded to the dtype.
        if USE_LIBDEVICE:
            e = libdevice.exp(-g)
        else:
            e = tl.exp(-g)
        s = tl.math.div_rn(g, 1.0 + e).to(G.dtype.element_ty)
        out = s.to(tl.float32) * u.to(tl.float32)
        tl.store(O + row * stride_o + cols, out.to(O.dtype.element_ty), mask=mask)

    @triton.jit
    def _norm_rope(x1, x2, W, C, S, t, inv_d, eps, stride_ct, stride_st, HAS_NORM: tl.constexpr, HALF: tl.constexpr):
        """The two halves [heads, HALF] (fp32 holding x's dtype's values) of heads of token t:
        optional RMSNorm over head_dim, then half-split RoPE. Returns the halves in fp32 (exact
        in x's dtype); the one arithmetic for qk_norm_rope and qkv_rope_write."""
        dt = C.dtype.element_ty  # cos/sin come in x's dtype
        d = tl.arange(0, HALF)[None, :]
        if HAS_NORM:
            ss = tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)
            scale = tl.math.rsqrt(ss * inv_d + eps)[:, None]
            w1 = tl.load(W + d).to(tl.float32)
            w2 = tl.load(W + HALF + d).to(tl.float32)
            x1 = ((x1 * scale).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
            x2 = ((x2 * scale).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
        c1 = tl.load(C + t * stride_ct + d).to(tl.float32)
        c2 = tl.load(C + t * stride_ct + HALF + d).to(tl.float32)
        s1 = tl.load(S + t * stride_st + d).to(tl.float32)
        s2 = tl.load(S + t * stride_st + HALF + d).to(tl.float32)
        # x * cos + cat(-x2, x1) * sin, each product rounded to the dtype before the add.
        o1 = (x1 * c1).to(dt).to(tl.float32) + (-x2 * s1).to(dt).to(tl.float32)
        o2 = (x2 * c2).to(dt).to(tl.float32) + (x1 * s2).to(dt).to(tl.float32)
        return o1, o2

    @triton.jit
    def _norm_rope_heads(
        X, O, W, C, S, t, h0, n_heads, inv_d, eps,
        stride_xt, stride_xh, stride_ot, stride_oh, stride_ct, stride_st,
        HAS_NORM: tl.constexpr, HEADS: tl.constexpr, HALF: tl.constexpr,
    ):
        """Heads h0..h0+HEADS-1 of token t: optional RMSNorm over head_dim, then half-split RoPE."""
        heads = h0 + tl.arange(0, HEADS)
        hmask = (heads < n_heads)[:, None]
        d = tl.arange(0, HALF)[None, :]
        src = X + t * stride_xt + heads[:, None].to(tl.int64) * stride_xh + d
        x1 = tl.load(src, mask=hmask, other=0.0).to(tl.float32)
        x2 = tl.load(src + HALF, mask=hmask, other=0.0).to(tl.float32)
        o1, o2 = _norm_rope(x1, x2, W, C, S, t, inv_d, eps, stride_ct, stride_st, HAS_NORM, HALF)
        dst = O + t * stride_ot + heads[:, None].to(tl.int64) * stride_oh + d
        tl.store(dst, o1.to(O.dtype.element_ty), mask=hmask)
        tl.store(dst + HALF, o2.to(O.dtype.element_ty), mask=hmask)

    @triton.jit(do_not_specialize=["n_rows"])
    def _qkv_rope_write_kernel(
        QKV, B, QO, K_POOL, V_POOL, SLOTS, QW, KW, C, S,
        n_rows, n_cols, n_q, inv_d, eps,
        stride_qkv, stride_qot, stride_qoh, stride_ps, stride_ph, stride_ct, stride_st,
        GROUPS: tl.constexpr, PTRS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_QNORM: tl.constexpr, HAS_KNORM: tl.constexpr,
        HALF: tl.constexpr, PDL: tl.constexpr,
    ):
        """grid (T, n_q + n_kv): one head of token t's qkv row [q heads | k heads | v heads] per
        program (`_load_input`: the linear's output, or its group sums added here). A q head is
        normed, RoPE'd and stored to QO; program n_q + j takes k head j (normed, RoPE'd) and v
        head j and stores both at physical slot SLOTS[t] of the pools (write_kv's stores)."""
        wait_for_previous(PDL)
        dt = C.dtype.element_ty
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        d = tl.arange(0, HALF)[None, :]
        row = t * stride_qkv
        col = h * (2 * HALF) + d
        every = col < n_cols  # all true: the loads keep the masked form of the other kernels
        x1 = _load_input(QKV, B, t, n_rows, n_cols, row, col, every, GROUPS, PTRS, HAS_BIAS, dt).to(tl.float32)
        x2 = _load_input(QKV, B, t, n_rows, n_cols, row, col + HALF, every, GROUPS, PTRS, HAS_BIAS, dt).to(tl.float32)
        if h < n_q:
            o1, o2 = _norm_rope(x1, x2, QW, C, S, t, inv_d, eps, stride_ct, stride_st, HAS_QNORM, HALF)
            q_dst = QO + t * stride_qot + h * stride_qoh + d
            tl.store(q_dst, o1.to(QO.dtype.element_ty))
            tl.store(q_dst + HALF, o2.to(QO.dtype.element_ty))
        else:
            kv = h - n_q
            # Every load before the first store: a load after a store that may alias it waits
            # for that store's turn, one more memory latency on this program's path.
            vcol = col + (n_cols - n_q * 2 * HALF) // 2  # the same head's v columns
            v1 = _load_input(QKV, B, t, n_rows, n_cols, row, vcol, every, GROUPS, PTRS, HAS_BIAS, dt)
            v2 = _load_input(QKV, B, t, n_rows, n_cols, row, vcol + HALF, every, GROUPS, PTRS, HAS_BIAS, dt)
            off = tl.load(SLOTS + t).to(tl.int64) * stride_ps + kv * stride_ph + d
            o1, o2 = _norm_rope(x1, x2, KW, C, S, t, inv_d, eps, stride_ct, stride_st, HAS_KNORM, HALF)
            tl.store(K_POOL + off, o1.to(dt).to(K_POOL.dtype.element_ty))
            tl.store(K_POOL + off + HALF, o2.to(dt).to(K_POOL.dtype.element_ty))
            tl.store(V_POOL + off, v1.to(V_POOL.dtype.element_ty))
            tl.store(V_POOL + off + HALF, v2.to(V_POOL.dtype.element_ty))

    @triton.jit
    def _qk_norm_rope_kernel(
        Q, K, QO, KO, QW, KW, C, S, n_q, n_k, q_blocks, inv_d, eps,
        stride_qt, stride_qh, stride_kt, stride_kh,
        stride_qot, stride_qoh, stride_kot, stride_koh, stride_ct, stride_st,
        HAS_QNORM: tl.constexpr, HAS_KNORM: tl.constexpr, HEADS: tl.constexpr, HALF: tl.constexpr, PDL: tl.constexpr,
    ):
        """grid (T, q head blocks + k head blocks)."""
        wait_for_previous(PDL)
        t = tl.program_id(0).to(tl.int64)
        hb = tl.program_id(1)
        if hb < q_blocks:
            _norm_rope_heads(Q, QO, QW, C, S, t, hb * HEADS, n_q, inv_d, eps,
                             stride_qt, stride_qh, stride_qot, stride_qoh, stride_ct, stride_st,
                             HAS_QNORM, HEADS, HALF)
        else:
            _norm_rope_heads(K, KO, KW, C, S, t, (hb - q_blocks) * HEADS, n_k, inv_d, eps,
                             stride_kt, stride_kh, stride_kot, stride_koh, stride_ct, stride_st,
                             HAS_KNORM, HEADS, HALF)


# ----------------------------------------------------------------------------- wrappers


def _check_triton() -> None:
    if triton is None:
        raise RuntimeError("triton is not installed")


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[..., H] -> [rows, H] with a unit last stride (a view when possible)."""
    x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 or x2.shape[-1] == 1 else x2.contiguous()


def _norm_launch(n_cols: int, block: int | None) -> tuple[int, int, int]:
    """(BLOCK, NUM_CHUNKS, num_warps) for a row of n_cols elements. A warp per 256 elements, at
    most 8: at one row the norm is one program, and its split-GEMM partials (8-11 fp32 rows) are
    loaded by that program's threads alone. A function of n_cols only, so every M reduces a row
    alike. H100, 1.5B shape (hidden 1536: 4 -> 8 warps), engine-only: AR step 1.823 -> 1.765 ms,
    verify(64) 2.387 -> 2.337; 16 warps gained less (1.786), and the 8B's 8 -> 16 nothing."""
    if block is None:
        block = triton.next_power_of_2(n_cols)
        block = block if block <= MAX_SINGLE_BLOCK else CHUNK_LOOP
    chunks = triton.cdiv(n_cols, block)
    return block, chunks, max(1, min(8, block // 256))


def _parts(p: Partials) -> tuple[torch.Tensor, bool]:
    """(X, PTRS) of `_load_input` for `p`'s parts: the one buffer [G, M, N]; or, in the
    address-table form, the table viewed as the parts' dtype."""
    if p.group_ptrs is None:
        assert p.groups.is_contiguous(), "Partials: one dense [G, M, N] buffer"
        return p.groups, False
    first = p.groups[0]
    assert all(g.shape == first.shape and g.dtype == first.dtype and g.device == first.device and g.is_contiguous()
               and g.data_ptr() % 16 == 0 for g in p.groups), "Partials: parts of one shape, dtype and device, dense, 16-byte aligned"
    assert p.group_ptrs.shape == (p.num_groups,) and p.group_ptrs.dtype == torch.int64 and p.group_ptrs.is_contiguous()
    assert p.group_ptrs.device == first.device, "Partials: the address table on the parts' device"
    return p.group_ptrs.view(first.dtype), True


def _rms_norm_launch(x, residual, weight, eps, block):
    _check_triton()
    shape, n = x.shape, x.shape[-1]
    assert weight.shape == (n,), f"weight {tuple(weight.shape)} does not match hidden {n}"
    if isinstance(x, Partials):  # a linear's parts (split GEMM groups, ranks' partials), summed as loaded
        assert residual is not None and x.dtype == residual.dtype
        x2, ptrs = _parts(x)
        groups, bias, dtype, rows = x.num_groups, x.bias, x.dtype, x.shape[0]
    else:
        x2, groups, bias, dtype, ptrs = _rows(x), 0, None, x.dtype, False
        rows = x2.shape[0]
    out_dtype = torch.promote_types(dtype, weight.dtype)
    y = torch.empty(rows, n, device=x2.device, dtype=out_dtype)
    if residual is not None:
        assert residual.shape == shape and residual.dtype == dtype, "residual must match x"
        r2 = _rows(residual)
        h = torch.empty(rows, n, device=x2.device, dtype=dtype)
    else:
        r2, h = x2, x2  # unused (HAS_RES=False); h's dtype is x's (the kernel's rounding dtype)
    if rows > 0:
        weight = weight.contiguous()
        block, chunks, warps = _norm_launch(n, block)
        _rms_norm_kernel[(rows,)](
            x2, r2, bias if bias is not None else weight, weight, y, h, rows, n, 1.0 / n, eps,
            n if ptrs else x2.stride(-2), r2.stride(0), y.stride(0), h.stride(-2),
            HAS_RES=residual is not None, GROUPS=groups, PTRS=ptrs, HAS_BIAS=bias is not None, BLOCK=block, NUM_CHUNKS=chunks,
            num_warps=warps, enable_fp_fusion=False, **launch_args(x2.device, rows),
        )
    y = y.view(shape)
    return y if residual is None else (y, h.view(shape))


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, *, block: int | None = None) -> torch.Tensor:
    """Triton `rms_norm_ref`. x: [..., H] (rows may be strided; the last dim must be dense or
    it is copied), weight [H]. Returns a new contiguous tensor in promote(x, weight) dtype.
    block: elements per chunk (a power of two); default one chunk up to 8192, else 4096."""
    return _rms_norm_launch(x, None, weight, eps, block)


def add_rms_norm_triton(
    x: torch.Tensor | Partials, residual: torch.Tensor, weight: torch.Tensor, eps: float, *, block: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton `add_rms_norm_ref`: (rms_norm(x + residual), x + residual), both new tensors.
    x may be a split linear's `Partials` (o_proj, down at AR): summed as loaded, one launch in
    place of the group-sum pass and this one, the same bits."""
    return _rms_norm_launch(x, residual, weight, eps, block)


def silu_mul_triton(gate: torch.Tensor, up: torch.Tensor, *, block: int = SILU_BLOCK) -> torch.Tensor:
    """Triton `silu_mul_ref`: silu(gate) * up. gate, up: [..., I] with the same shape and dtype;
    rows may be strided (e.g. the two halves of a fused gate_up projection)."""
    _check_triton()
    assert gate.shape == up.shape and gate.dtype == up.dtype, "gate and up must match"
    shape, n = gate.shape, gate.shape[-1]
    g2, u2 = _rows(gate), _rows(up)
    rows = g2.shape[0]
    out = torch.empty(rows, n, device=gate.device, dtype=gate.dtype)
    if rows > 0 and n > 0:
        block = min(block, triton.next_power_of_2(n))
        _silu_mul_kernel[(rows, triton.cdiv(n, block))](
            g2, u2, out, n, g2.stride(0), u2.stride(0), out.stride(0),
            BLOCK=block, USE_LIBDEVICE=gate.is_cuda and not interpreting(),
            num_warps=max(1, min(4, block // 256)), enable_fp_fusion=False,
            **launch_args(gate.device, rows),
        )
    return out.view(shape)


def _heads_view(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _cos_sin_rows(c: torch.Tensor, t: int, d: int) -> tuple[torch.Tensor, int]:
    """cos/sin [T, D] or [T, 1, D] (or one row for every token) -> (tensor, row stride)."""
    c2 = c.reshape(-1, d)
    if c2.stride(-1) != 1:
        c2 = c2.contiguous()
    assert c2.shape[0] in (1, t), f"cos/sin rows {c2.shape[0]} for {t} tokens"
    return c2, (0 if c2.shape[0] == 1 else c2.stride(0))


def qk_norm_rope_triton(
    q: torch.Tensor | None,
    k: torch.Tensor | None,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    *,
    heads_per_program: int = 1,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Triton `qk_norm_rope_ref`, q and k in one launch. See the reference for the contract.

    q [T, Hq, D], k [T, Hk, D] may be strided views (any token / head strides, e.g. slices of a
    fused qkv projection); only the last dim must be dense (else it is copied). Either may be
    None (e.g. K only for the draft context). D must be a power of two >= 2. All tensors share
    one dtype. Outputs are new contiguous [T, H, D] tensors.
    """
    _check_triton()
    ref = q if q is not None else k
    assert ref is not None, "need q or k"
    t, _, d = ref.shape
    assert d >= 2 and d & (d - 1) == 0, "head_dim must be a power of two"
    for x in (q, k):
        assert x is None or (x.dim() == 3 and x.shape[0] == t and x.shape[2] == d and x.dtype == ref.dtype)
    for w in (q_norm_weight, k_norm_weight):
        assert w is None or (w.shape == (d,) and w.dtype == ref.dtype), "norm weight [D] in q's dtype"
    assert cos.dtype == ref.dtype and sin.dtype == ref.dtype, "cos/sin in q's dtype (Rotary.cos_sin(.., dtype))"
    q = _heads_view(q) if q is not None else None
    k = _heads_view(k) if k is not None else None
    qo = torch.empty(q.shape, device=q.device, dtype=q.dtype) if q is not None else None
    ko = torch.empty(k.shape, device=k.device, dtype=k.dtype) if k is not None else None
    n_q = q.shape[1] if q is not None else 0
    n_k = k.shape[1] if k is not None else 0
    if t == 0 or n_q + n_k == 0:
        return qo, ko
    c2, sc = _cos_sin_rows(cos, t, d)
    s2, ss = _cos_sin_rows(sin, t, d)
    # One head per program by default, whatever T: a head's norm then reduces in the same order
    # in an AR step and in a verify (batch invariance); other values exist for the tests.
    heads = heads_per_program
    q_blocks, k_blocks = triton.cdiv(n_q, heads), triton.cdiv(n_k, heads)
    # Absent operands: pass the other one's tensors; their branch never runs.
    qq, qqo = (q, qo) if q is not None else (k, ko)
    kk, kko = (k, ko) if k is not None else (q, qo)
    qw = q_norm_weight.contiguous() if q_norm_weight is not None else c2
    kw = k_norm_weight.contiguous() if k_norm_weight is not None else c2
    _qk_norm_rope_kernel[(t, q_blocks + k_blocks)](
        qq, kk, qqo, kko, qw, kw, c2, s2, n_q, n_k, q_blocks, 1.0 / d, eps,
        qq.stride(0), qq.stride(1), kk.stride(0), kk.stride(1),
        qqo.stride(0), qqo.stride(1), kko.stride(0), kko.stride(1), sc, ss,
        HAS_QNORM=q_norm_weight is not None, HAS_KNORM=k_norm_weight is not None,
        HEADS=heads, HALF=d // 2, num_warps=max(1, min(4, heads * d // 256)), enable_fp_fusion=False,
        **launch_args(ref.device, t),
    )
    return qo, ko


def qkv_rope_write_triton(
    qkv: torch.Tensor | Partials,
    n_heads: int,
    n_kv: int,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """Triton `qkv_rope_write_ref` in one launch: q/k norm + RoPE (qk_norm_rope's arithmetic) and
    the k/v cache write (write_kv's), from the fused projection's output [T, (Hq + 2 Hk) * D]
    or its split launch's `Partials` (summed as loaded: no group-sum pass). Returns q [T, Hq, D]."""
    _check_triton()
    if isinstance(qkv, Partials):
        x, ptrs = _parts(qkv)
        groups, bias, dtype, stride = qkv.num_groups, qkv.bias, qkv.dtype, 0
    else:
        assert qkv.dim() == 2 and qkv.stride(1) == 1, "qkv: [T, N], dense rows"
        x, groups, bias, dtype, stride, ptrs = qkv, 0, None, qkv.dtype, qkv.stride(0), False
    t, n = qkv.shape
    d = n // (n_heads + 2 * n_kv)
    assert d * (n_heads + 2 * n_kv) == n and d >= 2 and d & (d - 1) == 0, "head_dim: a power of two"
    for w in (q_norm_weight, k_norm_weight):
        assert w is None or (w.shape == (d,) and w.dtype == dtype), "norm weight [D] in q's dtype"
    assert cos.dtype == dtype and sin.dtype == dtype, "cos/sin in q's dtype (Rotary.cos_sin(.., dtype))"
    assert k_pool.shape[2:] == (n_kv, d) and v_pool.stride() == k_pool.stride() and k_pool.stride(-1) == 1
    assert k_pool.stride(0) == k_pool.shape[1] * k_pool.stride(1), "pool blocks must be contiguous"
    q = torch.empty(t, n_heads, d, device=x.device, dtype=dtype)
    if t == 0:
        return q
    c2, sc = _cos_sin_rows(cos, t, d)
    s2, ss = _cos_sin_rows(sin, t, d)
    qw = q_norm_weight.contiguous() if q_norm_weight is not None else c2
    kw = k_norm_weight.contiguous() if k_norm_weight is not None else c2
    _qkv_rope_write_kernel[(t, n_heads + n_kv)](
        x, bias if bias is not None else c2, q, k_pool, v_pool, slots.contiguous(), qw, kw, c2, s2,
        t, n, n_heads, 1.0 / d, eps,
        stride, q.stride(0), q.stride(1), k_pool.stride(1), k_pool.stride(2), sc, ss,
        GROUPS=groups, PTRS=ptrs, HAS_BIAS=bias is not None, HAS_QNORM=q_norm_weight is not None,
        HAS_KNORM=k_norm_weight is not None, HALF=d // 2,
        num_warps=max(1, min(4, d // 256)), enable_fp_fusion=False,  # qk_norm_rope's, one head a program
        **launch_args(x.device, t),
    )
    return q


# ----------------------------------------------------------------------------- dispatchers


def _use_triton(*tensors: torch.Tensor | None) -> bool:
    """Triton for CUDA inputs, unless autograd needs a backward (training): the kernels have none."""
    present = [t for t in tensors if t is not None]
    return present[0].is_cuda and triton is not None and not any(t.requires_grad for t in present)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm (engine.layers.RMSNorm): Triton on CUDA tensors, the torch reference elsewhere."""
    return rms_norm_triton(x, weight, eps) if _use_triton(x, weight) else rms_norm_ref(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor | Partials, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(residual + x), residual + x): Triton on CUDA tensors, the reference elsewhere.
    x: a tensor, or a split linear's `Partials` (only the Triton GEMM makes them)."""
    if _use_triton(x.groups[0] if isinstance(x, Partials) else x, residual, weight):
        return add_rms_norm_triton(x, residual, weight, eps)
    return add_rms_norm_ref(x.sum() if isinstance(x, Partials) else x, residual, weight, eps)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up: Triton on CUDA tensors, the torch reference elsewhere."""
    return silu_mul_triton(gate, up) if _use_triton(gate, up) else silu_mul_ref(gate, up)


def qk_norm_rope(
    q: torch.Tensor | None,
    k: torch.Tensor | None,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Optional per-head RMSNorm then RoPE of q and k: one Triton launch on CUDA, else the reference."""
    ref = q if q is not None else k
    if ref is not None and _use_triton(q, k, q_norm_weight, k_norm_weight, cos, sin):
        return qk_norm_rope_triton(q, k, q_norm_weight, k_norm_weight, cos, sin, eps)
    return qk_norm_rope_ref(q, k, q_norm_weight, k_norm_weight, cos, sin, eps)


def qkv_rope_write(
    qkv: torch.Tensor | Partials,
    n_heads: int,
    n_kv: int,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """q of a fused qkv projection's output (or `Partials`), its k and v written to the cache
    slots: one Triton launch on CUDA, else the reference. Returns q [T, Hq, D] (normed, RoPE'd)."""
    x = qkv.groups[0] if isinstance(qkv, Partials) else qkv
    if _use_triton(x, q_norm_weight, k_norm_weight, cos, sin):
        return qkv_rope_write_triton(qkv, n_heads, n_kv, q_norm_weight, k_norm_weight, cos, sin, eps, k_pool, v_pool, slots)
    qkv = qkv.sum() if isinstance(qkv, Partials) else qkv
    return qkv_rope_write_ref(qkv, n_heads, n_kv, q_norm_weight, k_norm_weight, cos, sin, eps, k_pool, v_pool, slots)


__all__ = [
    "add_rms_norm",
    "add_rms_norm_triton",
    "qk_norm_rope",
    "qk_norm_rope_triton",
    "qkv_rope_write",
    "qkv_rope_write_triton",
    "rms_norm",
    "rms_norm_triton",
    "silu_mul",
    "silu_mul_triton",
]

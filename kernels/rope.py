"""RoPE's cos and sin tables of a forward in one Triton launch.

Contract: `rope_cos_sin_ref` (kernels/reference.py), element for element: the angle is the fp32
product position * inv_freq[j % (D/2)] (the position converted to fp32 first), its cos and sin
in fp32, times attention_factor only where that is not 1.0 (YaRN), then one rounding to the
output dtype. Launched with `enable_fp_fusion=False` (no product is contracted into an FMA) and
with cos and sin from libdevice's `__nv_cosf` / `__nv_sinf`, the functions CUDA's `cosf` /
`sinf` (torch's kernels) compile to. Named explicitly: in Triton 3.9 `tl.cos` / `tl.sin`
compile to the same code for sm_90 (no `cos.approx.f32`), but the lowering is Triton's choice.
One difference remains: Triton compiles libdevice in its flush-to-zero variant, torch does not;
a subnormal intermediate is flushed to zero, which changes no result for angles of RoPE's
sizes (exactly 0, or 1e-12 and up). Under TRITON_INTERPRET=1 (CPU tests) numpy's cos and sin run
instead (no libdevice there).

Why: torch computes the table in ~7 kernels (the cast, the product, cat, cos, sin, two casts;
two more with YaRN's factor), each a serial launch of the forward's CUDA graph, and a round
builds three tables (verify, draft, the draft context's keys).

Fixed shapes, no host read (the positions stay on the device): safe inside a CUDA graph.
"""
from __future__ import annotations

import torch

from .launch import interpreting, launch_args, wait_for_previous
from .reference import rope_cos_sin_ref

try:  # triton is optional: CPU-only installs use the torch reference.
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None
    libdevice = None

KERNELS = ("_rope_cos_sin_kernel",)
BLOCK_ELEMENTS = 2048  # table elements (rows x columns) a program computes

if triton is not None:

    @triton.jit
    def _rope_cos_sin_kernel(
        POS, INV_FREQ, COS, SIN,  # [T] int32/int64, [H] fp32, [T, D] x2 (the output dtype)
        t, attention_factor,  # runtime: rows, the fp32 factor (read only when SCALED)
        H: tl.constexpr, DP: tl.constexpr, BLOCK_T: tl.constexpr,
        SCALED: tl.constexpr, USE_LIBDEVICE: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_for_previous(PDL)
        rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        cols = tl.arange(0, DP)
        row_in = rows < t
        col_in = cols < 2 * H
        pos = tl.load(POS + rows, mask=row_in, other=0).to(tl.float32)
        freq = tl.load(INV_FREQ + cols % H, mask=col_in, other=0.0)
        x = pos[:, None] * freq[None, :]
        if USE_LIBDEVICE:
            c = libdevice.cos(x)
            s = libdevice.sin(x)
        else:
            c = tl.cos(x)
            s = tl.sin(x)
        if SCALED:
            c = c * attention_factor
            s = s * attention_factor
        at = rows.to(tl.int64)[:, None] * (2 * H) + cols[None, :]
        inside = row_in[:, None] & col_in[None, :]
        tl.store(COS + at, c.to(COS.dtype.element_ty), mask=inside)
        tl.store(SIN + at, s.to(SIN.dtype.element_ty), mask=inside)


def _pow2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


def rope_cos_sin_triton(
    positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton `rope_cos_sin_ref`: (cos, sin), each [T, 1, D] in `dtype`, D = 2 * len(inv_freq), in
    one launch."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    assert positions.dim() == 1 and not positions.is_floating_point(), "positions: [T] integers"
    assert inv_freq.dim() == 1 and inv_freq.dtype == torch.float32, "inv_freq: [D/2] fp32"
    t, h = positions.shape[0], inv_freq.shape[0]
    d = 2 * h
    cos = torch.empty(t, 1, d, dtype=dtype, device=positions.device)
    sin = torch.empty(t, 1, d, dtype=dtype, device=positions.device)
    if t == 0:
        return cos, sin
    positions = positions.contiguous()
    inv_freq = inv_freq.contiguous()
    dp = _pow2(d)
    block_t = max(1, min(_pow2(t), BLOCK_ELEMENTS // dp))
    _rope_cos_sin_kernel[(triton.cdiv(t, block_t),)](
        positions, inv_freq, cos, sin, t, float(attention_factor),
        H=h, DP=dp, BLOCK_T=block_t, SCALED=attention_factor != 1.0,
        USE_LIBDEVICE=positions.is_cuda and not interpreting(),
        num_warps=4, enable_fp_fusion=False, **launch_args(positions.device, t),
    )
    return cos, sin


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's (cos, sin) at `positions` [T] (int32/int64), each [T, 1, D] in `dtype`
    (`rope_cos_sin_ref`): the one Triton launch on CUDA, the torch reference elsewhere."""
    if positions.is_cuda and triton is not None:
        return rope_cos_sin_triton(positions, inv_freq, attention_factor, dtype)
    return rope_cos_sin_ref(positions, inv_freq, attention_factor, dtype)

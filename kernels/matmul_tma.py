"""A persistent, TMA-fed form of the batch-invariant linear (kernels/matmul.py), for many rows.

Why: past 64 rows the engine's verify GEMMs are bound by the tensor cores and by how the weight
and activation tiles reach them. `_linear_kernel` loads its tiles with pointer arithmetic and
launches one program per output tile. This kernel keeps the same arithmetic and changes only the
delivery: the tiles come through the bulk tensor copy engine (TMA, `TensorDescriptor`s made on
the host), and a grid of at most `programs` programs walks the output tiles in a fixed order
(tile t -> program t mod programs; M tiles vary fastest, as in `_linear_kernel`'s grid), so the
next tile's loads overlap the previous tile's epilogue.

Bits: every output element is computed exactly as `_linear_kernel`'s fused launch computes it
for the same `LinearConfig` and block_m: the same BLOCK_K blocks in the same order, the same
tl.dot (on Hopper the same m64nNk16 wgmma steps per 64-row warpgroup, num_warps per 64 rows
unchanged), each K group accumulated alone from zero in fp32 and folded into a zero fp32 total
in group order, the bias added once, one cast. Out-of-range rows and K columns are zeros in both
(masked loads there, the copy engine's zero fill here); out-of-range N columns are never stored.
So a row's result does not depend on M, nor on which of the two kernels produced it; the CUDA
tests and benchmarks/kernels_vs_vendor.py check this bitwise at the real shapes.

Needs a CUDA device with TMA (sm_90+) and Triton's host tensor descriptors; `available()` says
whether this form can run here. matmul.py picks the tile config and calls `launch_tma`
(`matmul.linear_tma`, and `linear_triton` where `matmul.use_tma` picks this form).
"""
from __future__ import annotations

import torch

from .launch import hopper_or_newer, interpreting, launch_args, wait_for_previous

try:
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - exercised only without triton or with an old one
    triton = None
    tl = None
    TensorDescriptor = None

SMS = 132  # H100 / H200


def available(device: torch.device) -> bool:
    """Whether the TMA form runs on `device`: Triton with host tensor descriptors, and a CUDA
    device of sm_90 or newer, or the interpreter (the CPU tests: the descriptors' loads there
    are masked loads with the copy engine's zero fill)."""
    return TensorDescriptor is not None and (interpreting() or hopper_or_newer(device))


if triton is not None and TensorDescriptor is not None:

    @triton.jit(do_not_specialize=["M"])
    def _linear_tma_kernel(
        x_desc, w_desc, B, Y, M, N, stride_ym, group_blocks, k_blocks, programs,
        UPCAST: tl.constexpr, ONE_GROUP: tl.constexpr, HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        FLATTEN: tl.constexpr, PDL: tl.constexpr,
    ):
        """grid (programs,): program p computes output tiles p, p + programs, ... (M tiles fastest)."""
        wait_for_previous(PDL)
        m_tiles = tl.cdiv(M, BLOCK_M)
        tiles = m_tiles * tl.cdiv(N, BLOCK_N)
        for tile in tl.range(tl.program_id(0), tiles, programs, flatten=FLATTEN):
            pid_m = tile % m_tiles
            pid_n = tile // m_tiles
            off_m = pid_m * BLOCK_M
            off_n = pid_n * BLOCK_N
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for kb in range(0, k_blocks):
                x = x_desc.load([off_m, kb * BLOCK_K])
                w = w_desc.load([off_n, kb * BLOCK_K])
                if UPCAST:  # the interpreter's bf16 dot is wrong: fp32 products, as `_linear_kernel` there
                    acc = tl.dot(x.to(tl.float32), w.T.to(tl.float32), acc, input_precision="ieee")
                else:
                    acc = tl.dot(x, w.T, acc)
                if not ONE_GROUP:
                    # End of a group that is not the last: fold it into the total, start the next.
                    if ((kb + 1) % group_blocks == 0) & (kb + 1 < k_blocks):
                        total += acc
                        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            total += acc
            rows = off_m + tl.arange(0, BLOCK_M)
            cols = off_n + tl.arange(0, BLOCK_N)
            if HAS_BIAS:
                total += tl.load(B + cols % N).to(tl.float32)[None, :]
            mask = (rows < M)[:, None] & (cols < N)[None, :]
            y_ptrs = Y + rows[:, None].to(tl.int64) * stride_ym + cols[None, :]
            tl.store(y_ptrs, total.to(Y.dtype.element_ty), mask=mask)


def launch_tma(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor, *,
    block_m: int, block_n: int, block_k: int, group_blocks: int, one_group: bool,
    num_warps: int, num_stages: int, programs_per_sm: int = 1, flatten: bool = False,
) -> None:
    """_linear_tma_kernel over x [M, K] (unit column stride), weight [N, K] (unit column stride)
    into out [M, N], with matmul.py's tile config (matmul.linear_tma chooses it)."""
    m, k = x.shape
    n = weight.shape[0]
    x_desc = TensorDescriptor.from_tensor(x, [block_m, block_k])
    w_desc = TensorDescriptor.from_tensor(weight, [block_n, block_k])
    programs = min(-(-m // block_m) * -(-n // block_n), SMS * programs_per_sm)
    b = bias if bias is not None else out
    _linear_tma_kernel[(programs,)](
        x_desc, w_desc, b, out, m, n, out.stride(0), group_blocks, -(-k // block_k), programs,
        UPCAST=interpreting(), ONE_GROUP=one_group, HAS_BIAS=bias is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, FLATTEN=flatten,
        num_warps=num_warps, num_stages=num_stages, enable_fp_fusion=False, **launch_args(x.device, m),
    )


__all__ = ["available", "launch_tma"]

"""A persistent, warp-specialized (producer/consumer) form of the batch-invariant linear, in Gluon.

Why: `_linear_kernel` and `_linear_tma_kernel` (matmul.py, matmul_tma.py) issue their loads and
their MMAs from the same warps, so a program's next tiles are requested only as fast as its MMA
loop comes round to them, and Triton's automatic warp specialization makes no partitions on
sm_90. Here the partitions are written out (Triton's Gluon layer exposes Hopper's TMA, mbarriers,
warpgroup MMA and `warp_specialize`):
  * a loader partition (one warp) walks the program's work items and keeps a ring of STAGES
    shared-memory slots full of x [BLOCK_M, BLOCK_K] and weight [BLOCK_N, BLOCK_K] tiles, each
    slot filled by the bulk tensor copy engine (TMA) and signalled on its `ready` mbarrier;
  * the MMA partition (the kernel's num_warps: one warpgroup per 64 rows) waits on `ready`,
    issues the wgmma on the slot, keeps one wgmma in flight, hands the slot back on its `empty`
    mbarrier once the wgmma that read it has completed, and runs the epilogue.
So the weight streams continuously, across the K loop and across work items (the loader runs
ahead into the next item while the MMA partition stores the last one).

Work items (a grid of at most `programs` programs; item t -> program t mod programs; M tiles
vary fastest, as in `_linear_kernel`'s grid, so programs that share a weight tile run together):
  * fused (SPLIT False): one item per output tile, over every K group; the group sums are folded
    into a zero fp32 total in group order, the bias added once, one cast, stored to Y.
  * split (SPLIT True): one item per (output tile, K group); the group sum is stored to the fp32
    partial buffer P [groups, M, N], summed afterwards by matmul's `_sum_groups_kernel` or by a
    consumer that takes `Partials`.

Bits: every output element is computed as `_linear_kernel` computes it for the same BLOCK_K and
K groups: the same BLOCK_K blocks in the same order, each block as four m64nNk16 wgmma steps per
64-row warpgroup (`NVMMADistributedLayout` version 3, warps [num_warps, 1], instr [16, BLOCK_N,
16]: the layout Triton picks for tl.dot on these tiles), each group accumulated alone from zero
in fp32 (the first wgmma of a group ignores the accumulator, as Triton's zero-initialised dot
does), the group sums added in group order to a zero total. The wgmma's N (BLOCK_N) does not
change a bit on Hopper (docs/kernels.md: 128- and 256-wide tiles measured bitwise), so BLOCK_N
and BLOCK_M are speed choices here. Out-of-range rows, columns and K columns are zeros from the
copy engine's zero fill (masked loads there); out-of-range outputs are never stored. The GPU
tests and benchmarks/kernels_vs_vendor.py check this bitwise at the real shapes.

Needs an sm_90 device (wgmma is Hopper's instruction) and Triton's Gluon layer with Hopper TMA
(`available()`); matmul.py calls `launch_ws` only where `matmul.USE_WS` is on.
"""
from __future__ import annotations

import functools

import torch

from .launch import interpreting

try:  # Gluon: Triton 3.5 and newer; optional, as is triton.
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    # The TMA load's name: async_copy_global_to_shared up to Triton 3.6, async_load since.
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
except ImportError:  # pragma: no cover - exercised only without triton or with an older one
    gluon = None

SMS = 132  # H100 / H200
REGISTER_FILE = 65536  # 32-bit registers per SM (sm_90)


def available(device: torch.device) -> bool:
    """Whether the warp-specialized form runs on `device`: compiled Triton with Gluon, an sm_90 GPU."""
    if gluon is None or device.type != "cuda" or interpreting():
        return False
    return _device_is_sm90(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _device_is_sm90(index: int) -> bool:
    return torch.cuda.get_device_capability(index) == (9, 0)


def max_registers(num_warps: int, programs_per_sm: int = 1) -> int:
    """Registers per thread that let `programs_per_sm` programs share the SM's register file: each
    the MMA partition's num_warps plus one warpgroup that holds the loader warp (registers are
    handed out per warpgroup)."""
    return min(256, REGISTER_FILE // (programs_per_sm * (num_warps + 4) * 32) // 8 * 8)


def fits(t: torch.Tensor) -> bool:
    """Whether a 2-D operand can be read through a TMA descriptor: unit column stride, its base and
    row stride 16-byte aligned."""
    return t.stride(1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0


if gluon is not None:

    @gluon.jit
    def _item_coords(item, m_tiles, n_tiles, group_blocks, k_blocks, SPLIT: gl.constexpr):
        """Work item -> (M tile, N tile, first K block, K block end). M tiles vary fastest, then N
        tiles, then (split) K groups."""
        tile = item % (m_tiles * n_tiles)
        pid_m = tile % m_tiles
        pid_n = tile // m_tiles
        if SPLIT:
            kb_start = (item // (m_tiles * n_tiles)) * group_blocks
            kb_end = gl.minimum(kb_start + group_blocks, k_blocks)
        else:
            kb_start = item * 0
            kb_end = kb_start + k_blocks
        return pid_m, pid_n, kb_start, kb_end

    @gluon.jit
    def _ws_loader(x_desc, w_desc, x_bufs, w_bufs, ready, empty, M, N, group_blocks, k_blocks, items, programs,
                   SPLIT: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                   STAGES: gl.constexpr):
        """Fill the slot ring: slot i % STAGES takes the program's i-th K block (counted over its
        work items), once the MMA partition has emptied it."""
        m_tiles = gl.cdiv(M, BLOCK_M)
        n_tiles = gl.cdiv(N, BLOCK_N)
        nbytes: gl.constexpr = x_desc.block_type.nbytes + w_desc.block_type.nbytes
        i = 0
        for item in range(gl.program_id(0), items, programs):
            pid_m, pid_n, kb_start, kb_end = _item_coords(item, m_tiles, n_tiles, group_blocks, k_blocks, SPLIT)
            for kb in range(kb_start, kb_end):
                s = i % STAGES
                # Slots start empty: the first pass waits on the phase before the barrier's first.
                mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), nbytes)
                _tma_load(x_desc, [pid_m * BLOCK_M, kb * BLOCK_K], ready.index(s), x_bufs.index(s))
                _tma_load(w_desc, [pid_n * BLOCK_N, kb * BLOCK_K], ready.index(s), w_bufs.index(s))
                i += 1

    @gluon.jit
    def _ws_mma(x_bufs, w_bufs, ready, empty, B, Y, P, M, N, stride_ym, group_blocks, k_blocks, items, programs,
                SPLIT: gl.constexpr, ONE_GROUP: gl.constexpr, HAS_BIAS: gl.constexpr, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
        """Consume the slots in the loader's order; one wgmma in flight; the epilogue per item."""
        # One warpgroup per 64 rows, each running m64nNk16 wgmma steps with N = BLOCK_N.
        layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
        m_tiles = gl.cdiv(M, BLOCK_M)
        n_tiles = gl.cdiv(N, BLOCK_N)
        i = 0
        for item in range(gl.program_id(0), items, programs):
            pid_m, pid_n, kb_start, kb_end = _item_coords(item, m_tiles, n_tiles, group_blocks, k_blocks, SPLIT)
            acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout)
            if not ONE_GROUP:
                total = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout)
            pending = 0  # 1 while the previous slot is still read by the wgmma in flight
            for kb in range(kb_start, kb_end):
                s = i % STAGES
                mbarrier.wait(ready.index(s), (i // STAGES) & 1)
                # A group's first block starts from zero (use_acc False), as tl.dot from zeros does.
                acc = warpgroup_mma(x_bufs.index(s), w_bufs.index(s).permute((1, 0)), acc,
                                    use_acc=(kb - kb_start) % group_blocks != 0, is_async=True)
                # At most one wgmma in flight: the previous one has read its slot.
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
                mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), pred=pending != 0)
                pending = 1
                if not ONE_GROUP:
                    if ((kb - kb_start + 1) % group_blocks == 0) | (kb + 1 == kb_end):
                        # A group's last block: its sum is complete; fold it in, free the slot.
                        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
                        mbarrier.arrive(empty.index(s))
                        pending = 0
                        total += acc
                i += 1
            if ONE_GROUP:
                # The item's one group sum: wait for its last wgmma, free its slot.
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
                mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), pred=pending != 0)
                if SPLIT:
                    total = acc  # stored as is, as _linear_kernel's split launch stores it
                else:
                    total = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout) + acc  # its zero total
            rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
            cols = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
            mask = (rows < M)[:, None] & (cols < N)[None, :]
            if SPLIT:
                group = item // (m_tiles * n_tiles)
                p_ptrs = P + (group.to(gl.int64) * M + rows[:, None]) * N + cols[None, :]
                gl.store(p_ptrs, total, mask=mask)
            else:
                if HAS_BIAS:
                    total += gl.load(B + cols % N).to(gl.float32)[None, :]
                y_ptrs = Y + rows[:, None].to(gl.int64) * stride_ym + cols[None, :]
                gl.store(y_ptrs, total.to(Y.dtype.element_ty), mask=mask)

    @gluon.jit(do_not_specialize=["M"])
    def _linear_ws_kernel(x_desc, w_desc, B, Y, P, M, N, stride_ym, group_blocks, k_blocks, items, programs,
                          SPLIT: gl.constexpr, ONE_GROUP: gl.constexpr, HAS_BIAS: gl.constexpr, BLOCK_M: gl.constexpr,
                          BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                          num_warps: gl.constexpr):
        """grid (programs,): program p runs work items p, p + programs, ... (module docstring)."""
        x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
        w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=1)
        gl.warp_specialize([
            (_ws_mma, (x_bufs, w_bufs, ready, empty, B, Y, P, M, N, stride_ym, group_blocks, k_blocks, items,
                       programs, SPLIT, ONE_GROUP, HAS_BIAS, BLOCK_M, BLOCK_N, STAGES, num_warps)),
            (_ws_loader, (x_desc, w_desc, x_bufs, w_bufs, ready, empty, M, N, group_blocks, k_blocks, items,
                          programs, SPLIT, BLOCK_M, BLOCK_N, BLOCK_K, STAGES)),
        ], [1], [24])  # the loader holds scalars only: the fewest registers a warp can have


def launch_ws(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None,
    partials: torch.Tensor | None, *, block_m: int, block_n: int, block_k: int, group_blocks: int, groups: int,
    stages: int, programs_per_sm: int = 1,
) -> None:
    """_linear_ws_kernel over x [M, K] and weight [N, K] (unit column strides, 16-byte aligned rows)
    into out [M, N] (fused: partials None) or partials [groups, M, N] fp32 (split: out None), with
    matmul.py's BLOCK_K and K groups (matmul.linear_ws chooses them)."""
    m, k = x.shape
    n = weight.shape[0]
    assert stages >= 2, "the slot ring needs two slots: one read by the wgmma in flight, one being filled"
    assert block_m in (64, 128) and block_n % 8 == 0 and block_n <= 256, (block_m, block_n)
    # A 128-row program (12 warps) in half the register file does not assemble (ptxas, sm_90).
    assert programs_per_sm == 1 or block_m == 64, "several programs an SM: 64-row programs only"
    split = partials is not None
    dtype = gl.bfloat16 if x.dtype == torch.bfloat16 else gl.float16
    x_desc = TensorDescriptor.from_tensor(x, [block_m, block_k], gl.NVMMASharedLayout.get_default_for([block_m, block_k], dtype))
    w_desc = TensorDescriptor.from_tensor(weight, [block_n, block_k],
                                          gl.NVMMASharedLayout.get_default_for([block_n, block_k], dtype))
    k_blocks = -(-k // block_k)
    items = -(-m // block_m) * -(-n // block_n) * (groups if split else 1)
    programs = min(items, SMS * programs_per_sm)
    num_warps = 4 * block_m // 64
    y = out if out is not None else x  # unused in a split launch
    p = partials if split else x  # unused in a fused launch
    b = bias if bias is not None else y  # unused without HAS_BIAS
    _linear_ws_kernel[(programs,)](
        x_desc, w_desc, b, y, p, m, n, y.stride(0), group_blocks, k_blocks,
        items, programs,
        SPLIT=split, ONE_GROUP=split or groups == 1, HAS_BIAS=bias is not None and not split, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        STAGES=stages, num_warps=num_warps, maxnreg=max_registers(num_warps, programs_per_sm), enable_fp_fusion=False,
    )


__all__ = ["available", "fits", "launch_ws", "max_registers"]

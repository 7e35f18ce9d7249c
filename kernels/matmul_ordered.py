"""A persistent form of the batch-invariant linear (kernels/matmul.py) whose K groups meet in order.

Why: the linear's arithmetic is fixed per (N, K): a row's result is (0 + g_0 + g_1 + ... +
g_{G-1}) (+ bias), one cast, each g_i a K group's tl.dot chain from zero. matmul.py realises it
with a fused launch (a program per output tile runs every group: at 128-256 rows the 8B's
per-layer linears have too few tiles for 132 SMs, e.g. 192 programs = 1.45 waves) or a split
launch (a program per (tile, group) writes fp32 partials that a second pass adds: G * M * N fp32
written and read back). Here a grid of P programs walks the work units in a fixed order and the
groups of a tile are added where they are computed, through one fp32 running total per tile:

  * Work units u = g * TILES + t: group g of output tile t, group-major (all group-0 units, then
    all group-1 units, ...); within a group M tiles vary fastest, as in `_linear_kernel`'s grid,
    so programs that share a weight tile run together. Program p runs u = p, p + P, p + 2P, ...
    in increasing order.
  * A unit computes its group sum from zero: exactly `_linear_kernel`'s dot chain for that group
    (the same BLOCK_K blocks in the same order, the same tl.dot, the same masks).
  * g == 0: total = 0.0 + acc (the zero total of the fused launch: -0.0 + 0.0 is +0.0);
    g > 0: wait until the tile's flag says g groups have been added (acquire), load the running
    total from the fp32 workspace [M, N], total += acc;
    g < G - 1: store the total to the workspace, barrier (every thread's store before the
    signal), flag = g + 1 (release);
    g == G - 1: + bias, cast, store Y, flag = 0, so that the next call (and CUDA-graph replays)
    start from clean flags without a memset launch.
  So every element's adds are the fused launch's, in its order; the workspace round trip of an
  fp32 value is exact. Bits: identical to `linear_triton` (fused and split launches) for the
  same config; the CPU tests check it under the interpreter, the GPU tests at the real shapes.

Deadlock freedom. Unit (g, t) waits only for unit (g - 1, t) = u - TILES, a smaller unit. Take
the smallest unfinished unit u*: every unit below it has finished, so the unit it waits for has
published, and the program that owns u* has finished all its earlier units (they are smaller)
and is running u* or about to. If that program is resident on an SM, u* completes; by induction
every unit does. Residency is what the launch guarantees: P is at most the SM count times the
programs of this compiled kernel that fit one SM (`programs_that_fit`: registers, shared memory,
warps), so all P programs are on the SMs at once, whatever else waits for them. With
programmatic dependent launch the next kernel's programs may take SM room only once every
program of this one has started (`wait_for_previous`), so they cannot keep one off the SMs.
Under TRITON_INTERPRET=1 programs run one after another: P = 1 there, one program runs every
unit in order and every wait is already satisfied, so the CPU tests run the same code.

Flags: one int32 per output tile, kept per device (`_flags`) and left at zero by every call
that completes. Calls on one device must not overlap (one stream, as the engine runs); the
first call must come before any CUDA-graph capture that uses the launch (it allocates them).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .launch import interpreting, launch_args, wait_for_previous

try:  # triton is optional: CPU-only installs use F.linear.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None

# sm_90 per-SM limits, where the device does not report its own.
REGISTERS_PER_SM = 65536
SHARED_PER_SM = 228 * 1024
WARPS_PER_SM = 64
PROGRAMS_PER_SM_MAX = 32
SHARED_RESERVED = 1024  # the driver's shared memory per resident program


@dataclass(frozen=True)
class SmLimits:
    """What one SM holds: 32-bit registers, shared memory bytes, warps, programs."""

    registers: int = REGISTERS_PER_SM
    shared: int = SHARED_PER_SM
    warps: int = WARPS_PER_SM
    programs: int = PROGRAMS_PER_SM_MAX


def programs_that_fit(regs: int, shared: int, num_warps: int, limits: SmLimits = SmLimits()) -> int:
    """Programs of a compiled kernel (regs per thread, shared bytes, num_warps) that one SM holds
    at once: registers are handed out per warp in 256-register units, each program reserves
    SHARED_RESERVED bytes of shared memory beyond its own. At least 1 (the kernel launches)."""
    per_warp = -(-max(regs, 1) * 32 // 256) * 256
    by_regs = limits.registers // (per_warp * num_warps)
    by_shared = limits.shared // (shared + SHARED_RESERVED)
    return max(1, min(by_regs, by_shared, limits.warps // num_warps, limits.programs))


def sm_limits(device: torch.device) -> tuple[int, SmLimits]:
    """(SM count, per-SM limits) of a CUDA device, from its properties (sm_90 values where torch
    does not report one)."""
    props = torch.cuda.get_device_properties(device)
    limits = SmLimits(
        registers=getattr(props, "regs_per_multiprocessor", REGISTERS_PER_SM),
        shared=getattr(props, "shared_memory_per_multiprocessor", SHARED_PER_SM),
        warps=getattr(props, "max_threads_per_multi_processor", WARPS_PER_SM * 32) // 32,
    )
    return props.multi_processor_count, limits


if triton is not None:

    @triton.jit(do_not_specialize=["M", "programs"])
    def _linear_ordered_kernel(
        X, W, B, Y, WS, F, M, N, K, stride_xm, stride_wn, stride_ym, group_blocks, k_blocks, groups, programs,
        UPCAST: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
    ):
        """grid (programs,): program p runs units p, p + programs, ... (module docstring)."""
        wait_for_previous(PDL)
        m_tiles = tl.cdiv(M, BLOCK_M)
        tiles = m_tiles * tl.cdiv(N, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        for u in range(tl.program_id(0), tiles * groups, programs):
            g = u // tiles
            t = u - g * tiles
            pid_m = t % m_tiles
            pid_n = t // m_tiles
            rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            # As in _linear_kernel: rows past M masked out of the x loads, columns past N wrapped
            # onto valid weight rows (never stored).
            row_ok = (rows < M)[:, None]
            offs_n = cols % N
            kb_start = g * group_blocks
            kb_end = tl.minimum(kb_start + group_blocks, k_blocks)
            k0 = kb_start * BLOCK_K
            x_ptrs = X + rows[:, None].to(tl.int64) * stride_xm + (k0 + offs_k)[None, :]
            w_ptrs = W + offs_n[None, :].to(tl.int64) * stride_wn + (k0 + offs_k)[:, None]  # [BK, BN]
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for kb in range(kb_start, kb_end):
                if EVEN_K:
                    x = tl.load(x_ptrs, mask=row_ok, other=0.0)
                    w = tl.load(w_ptrs)
                else:
                    k_left = K - kb * BLOCK_K
                    x = tl.load(x_ptrs, mask=row_ok & (offs_k[None, :] < k_left), other=0.0)
                    w = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
                if UPCAST:
                    acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
                else:
                    acc = tl.dot(x, w, acc)
                x_ptrs += BLOCK_K
                w_ptrs += BLOCK_K
            mask = row_ok & (cols < N)[None, :]
            ws_ptrs = WS + rows[:, None].to(tl.int64) * N + cols[None, :]
            if g == 0:
                total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32) + acc
            else:
                # One thread spins (Triton issues a scalar atomic once a program and hands its
                # result to every thread); the barrier orders every thread's loads after it.
                # The loads skip L1 (.cg): another SM wrote the total, after this SM may have
                # read an older one there.
                while tl.atomic_cas(F + t, g, g, sem="acquire", scope="gpu") != g:
                    pass
                tl.debug_barrier()
                total = tl.load(ws_ptrs, mask=mask, other=0.0, cache_modifier=".cg") + acc
            if g < groups - 1:
                tl.store(ws_ptrs, total, mask=mask, cache_modifier=".cg")
                tl.debug_barrier()  # every thread's store before the signal
                tl.atomic_xchg(F + t, g + 1, sem="release", scope="gpu")
            else:
                if HAS_BIAS:
                    total += tl.load(B + offs_n).to(tl.float32)[None, :]
                y_ptrs = Y + rows[:, None].to(tl.int64) * stride_ym + cols[None, :]
                tl.store(y_ptrs, total.to(Y.dtype.element_ty), mask=mask)
                if g > 0:  # the tile's flag back to zero for the next call
                    tl.atomic_xchg(F + t, 0, sem="relaxed", scope="gpu")


_flags: dict[torch.device, torch.Tensor] = {}


def flags_for(device: torch.device, tiles: int) -> torch.Tensor:
    """The device's tile flags (int32 zeros), at least `tiles` of them. Grown outside CUDA-graph
    capture only: a capture records the zero fill without running it."""
    flags = _flags.get(device)
    if flags is None or flags.numel() < tiles:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("linear_ordered: call it once with this many output tiles before capturing a CUDA graph")
        flags = torch.zeros(max(1024, triton.next_power_of_2(tiles)), device=device, dtype=torch.int32)
        _flags[device] = flags
    return flags


_fit_cache: dict[tuple, tuple[int, int]] = {}


def _resident_programs(args: tuple, kwargs: dict, key: tuple, device: torch.device) -> tuple[int, int]:
    """(SM count, programs of this compiled kernel that fit an SM), compiled once per key: the
    launch's own binary (its registers and shared memory), so the bound holds for it."""
    fit = _fit_cache.get(key)
    if fit is None:
        compiled = _linear_ordered_kernel.warmup(*args, grid=(1,), **kwargs)
        compiled._init_handles()
        sms, limits = sm_limits(device)
        fit = sms, programs_that_fit(compiled.n_regs, compiled.metadata.shared, compiled.metadata.num_warps, limits)
        _fit_cache[key] = fit
    return fit


def launch_ordered(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor, *,
    block_m: int, block_n: int, block_k: int, group_blocks: int, groups: int,
    num_warps: int, num_stages: int, programs_per_sm: int | None = None,
) -> None:
    """_linear_ordered_kernel over x [M, K] and weight [N, K] (unit column strides) into out [M, N],
    with matmul.py's BLOCK_K and K groups (matmul.linear_ordered chooses them). programs_per_sm:
    at most this many programs an SM (default and cap: as many as fit one)."""
    m, k = x.shape
    n = weight.shape[0]
    tiles = -(-m // block_m) * -(-n // block_n)
    units = tiles * groups
    flags = flags_for(x.device, tiles)
    ws = torch.empty(m, n, device=x.device, dtype=torch.float32) if groups > 1 else out  # unused in one group
    b = bias if bias is not None else out  # unused without HAS_BIAS
    k_blocks = -(-k // block_k)
    args = (x, weight, b, out, ws, flags, m, n, k, x.stride(0), weight.stride(0), out.stride(0),
            group_blocks, k_blocks, groups)
    kwargs = dict(UPCAST=interpreting(), HAS_BIAS=bias is not None, EVEN_K=k % block_k == 0,
                  BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages,
                  enable_fp_fusion=False)
    if interpreting():
        programs = 1  # programs run one after another there: one runs every unit in order
    else:
        pdl = launch_args(x.device, m)
        key = (x.device, x.dtype, n, k, x.stride(0), weight.stride(0), out.stride(0), group_blocks, groups,
               *sorted(kwargs.items()), *sorted(pdl.items()))
        sms, fit = _resident_programs((*args, 1), kwargs | pdl, key, x.device)
        programs = min(units, sms * min(fit, programs_per_sm or fit))
    _linear_ordered_kernel[(programs,)](*args, programs, **kwargs, **launch_args(x.device, m))

__all__ = ["SmLimits", "flags_for", "launch_ordered", "programs_that_fit", "sm_limits"]

"""How every Triton kernel here is launched: programmatic dependent launch (PDL) on Hopper and newer.

Why: a decode step is ~300 small kernels (a 1.5B AR step: 10 a layer, most a few µs), and between
two dependent kernels of a CUDA graph the GPU idles while the next grid is launched and its
programs are put on the SMs. With PDL (`launch_pdl=True`, sm_90+), a kernel's programs may be
put on the SMs as soon as every program of the kernel before it has called
`gdc_launch_dependents`; they then block in `gdc_wait` until that kernel has finished and its
writes are visible. So the launch and the program start-up overlap the previous kernel's tail.

The rule that keeps this exact: every kernel's first statement is `wait_for_previous(PDL)`, before
any load or store. A program therefore reads and writes memory only once everything launched
before it has finished, as without PDL; only when its programs reach the SMs moves. The
arithmetic is unchanged: the compiled code differs by the two `griddepcontrol` instructions
(tests/kernels/test_launch.py compiles the forward's kernels for sm_90 both ways and compares).
A kernel that follows a torch kernel (which never signals early) simply starts when it ends.

Off (`PDL=False`, a plain launch) on the CPU, under the interpreter (no griddepcontrol there),
below sm_90, and for calls of more than PDL_MAX_ROWS rows (tokens). Measured on an H200 (Qwen3-8B
shapes, one run, 3 rounds): with PDL on every call the AR step was 3.2% faster and verify(64)
2.2% faster, but verify(128) 1.9% slower. Past 64 rows the GEMMs run 128-row programs that are
bound by the tensor cores, several to an SM; a grid started early is placed on whatever SMs the
previous kernel's tail leaves room on, not spread evenly (our reading; not profiled).
"""
from __future__ import annotations

import functools
import os

import torch

try:  # triton is optional: CPU-only installs use the torch references.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None
try:  # grid dependency control: Triton 3.3 and newer
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAVE_GDC = True
except ImportError:  # pragma: no cover - an older triton (or none): plain launches
    HAVE_GDC = False


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1: the CPU tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def _sm90_or_newer(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def hopper_or_newer(device: torch.device) -> bool:
    """Whether `device` is a CUDA device of sm_90 or newer (PDL, TMA)."""
    if device.type != "cuda":
        return False
    return _sm90_or_newer(device.index if device.index is not None else torch.cuda.current_device())


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL: a CUDA device of sm_90 or newer, compiled (not
    interpreted) Triton with grid dependency control."""
    return HAVE_GDC and not interpreting() and hopper_or_newer(device)


PDL_MAX_ROWS = 64  # the widest call that launches with PDL (module docstring)


def launch_args(device: torch.device, rows: int) -> dict:
    """The keyword arguments of every kernel launch here, for a call over `rows` rows (tokens): the
    kernel's `PDL` constexpr and Triton's `launch_pdl` option, both on for calls of at most
    PDL_MAX_ROWS rows on a device with PDL. Speed only: either way the kernel computes the same."""
    on = rows <= PDL_MAX_ROWS and pdl_enabled(device)
    return dict(PDL=on, launch_pdl=on)


if triton is not None:

    @triton.jit
    def wait_for_previous(PDL: tl.constexpr):
        """A kernel's first statement. PDL: wait until the kernel before has finished (its writes
        visible), then let the next kernel's programs start (they wait in turn)."""
        if PDL:
            gdc_wait()
            gdc_launch_dependents()

else:  # no triton (a CPU-only torch build): no kernel is defined and the torch references run,
    # but every kernel module still imports this name.
    wait_for_previous = None


__all__ = ["PDL_MAX_ROWS", "interpreting", "launch_args", "pdl_enabled", "wait_for_previous"]

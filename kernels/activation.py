"""SiLU(gate) * up with torch's roundings, one jit helper for the elementwise kernel
(fused.py: silu_mul) and the gate/up GEMM's epilogue (matmul.py: linear_silu_mul_triton), so
that the two give the same bits."""
from __future__ import annotations

try:  # triton is optional: CPU-only installs use the torch references.
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None

if triton is not None:

    @triton.jit
    def silu_times_up(g, u, USE_LIBDEVICE: tl.constexpr):
        """g, u in the input dtype -> fp32 silu(g) * u as torch computes it: g / (1 + exp(-g)) in
        fp32 (CUDA expf, IEEE division), rounded to the input dtype, times u in fp32. The caller
        rounds the result to the output dtype. USE_LIBDEVICE: CUDA's expf (compiled kernels);
        else tl.exp (the interpreter's numpy exp)."""
        gf = g.to(tl.float32)
        if USE_LIBDEVICE:
            e = libdevice.exp(-gf)
        else:
            e = tl.exp(-gf)
        s = tl.math.div_rn(gf, 1.0 + e).to(g.dtype)
        return s.to(tl.float32) * u.to(tl.float32)

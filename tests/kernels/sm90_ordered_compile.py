"""Compile kernels/matmul_ordered.py's _linear_ordered_kernel for sm_90 without a GPU and print, per
variant, its MMA layout, its wgmma instructions, whether they are the very instructions of
matmul.py's `_linear_kernel` for the same tile (`same_wgmma`: forms, operands, flags, count per
kernel body, as sm90_ws_compile.py compares them), the atomics on its flags (with their
memory order: the acquire that waits, the release that publishes), its registers, local memory and
shared memory, and how many of its programs fit one sm_90 SM (`matmul_ordered.programs_that_fit`,
the bound of its persistent grid). Run as a script (test_matmul_ordered.py does, in a
subprocess: the compiler needs the real triton.jit, not the interpreter's).

    python tests/kernels/sm90_ordered_compile.py BLOCK_M,BLOCK_N,BLOCK_K,STAGES,EVEN_K,HAS_BIAS ...

prints one JSON object per variant, one a line.
"""
from __future__ import annotations

import json
import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sm90 import resource_usage  # noqa: E402
from sm90_ws_compile import linear_kernel_ptx, wgmma_forms  # noqa: E402
from jetspec_chat.kernels import matmul_ordered  # noqa: E402

INTS = ("M", "N", "K", "stride_xm", "stride_wn", "stride_ym", "group_blocks", "k_blocks", "groups", "programs")
FLAGS = ("UPCAST", "HAS_BIAS", "EVEN_K", "BLOCK_M", "BLOCK_N", "BLOCK_K", "PDL")


def compile_variant(block_m: int, block_n: int, block_k: int, stages: int, even_k: bool, has_bias: bool) -> dict:
    sig = {"X": "*bf16", "W": "*bf16", "B": "*bf16", "Y": "*bf16", "WS": "*fp32", "F": "*i32"}
    sig |= {name: "i32" for name in INTS} | {name: "constexpr" for name in FLAGS}
    consts = dict(UPCAST=False, HAS_BIAS=has_bias, EVEN_K=even_k, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                  PDL=True)  # as launched on sm_90 up to 64 rows
    aligned = [list(sig).index(name) for name in ("X", "W", "B", "Y", "WS", "F", "stride_xm", "stride_wn", "stride_ym")]
    src = ASTSource(fn=matmul_ordered._linear_ordered_kernel, signature=sig, constexprs=consts,
                    attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    warps = 4 * block_m // 64
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=warps, num_stages=stages, enable_fp_fusion=False, launch_pdl=True))
    mma = set()
    for layout in re.findall(r"nvidia_mma<\{([^}]*)\}>", kernel.asm["ttgir"]):
        w = re.search(r"warpsPerCTA = \[([\d, ]+)\]", layout).group(1)
        instr = re.search(r"instrShape = \[([\d, ]+)\]", layout).group(1)
        mma.add(tuple(int(v) for v in (w + ", " + instr).split(", ")))
    ptx = kernel.asm["ptx"]
    wgmma = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\w+)", ptx)))
    # the linear's split launch: one group's dot chain per program, as a unit here
    same = wgmma_forms(ptx) == wgmma_forms(linear_kernel_ptx(block_m, block_n, block_k, True, True))
    atomics = sorted(set(re.findall(r"\batom\.global\.[\w.]+", ptx)))
    usage = resource_usage(kernel)
    fit = matmul_ordered.programs_that_fit(usage["regs"] or 255, usage["shared"], warps)
    return dict(block_m=block_m, block_n=block_n, block_k=block_k, stages=stages, even_k=even_k, has_bias=has_bias,
                mma=sorted(mma), wgmma=wgmma, same_wgmma=same, atomics=atomics,
                bypass_l1=bool(re.search(r"ld\.global\.cg", ptx)), fit=fit, **usage)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        bm, bn, bk, stages, even, bias = (int(v) for v in arg.split(","))
        print(json.dumps(compile_variant(bm, bn, bk, stages, bool(even), bool(bias))))

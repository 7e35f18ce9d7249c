"""Compile kernels/matmul_tma.py's _linear_tma_kernel for sm_90 without a GPU and print, per
variant, its MMA layout, its wgmma instructions, whether it loads through the bulk tensor copy
engine, and its registers, local memory and shared memory. Run as a script (test_matmul_tma.py
does, in a subprocess: the compiler needs the real triton.jit, not the interpreter's).

    python tests/kernels/sm90_tma_compile.py BLOCK_M,BLOCK_N,BLOCK_K,STAGES,WARPS,ONE_GROUP ...

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

from sm90 import resource_usage, wgmma_forms  # noqa: E402
from jetspec_chat.kernels import matmul_tma  # noqa: E402

INTS = ("M", "N", "stride_ym", "group_blocks", "k_blocks", "programs")
FLAGS = ("UPCAST", "ONE_GROUP", "HAS_BIAS", "BLOCK_M", "BLOCK_N", "BLOCK_K", "FLATTEN", "PDL")


def compile_variant(block_m: int, block_n: int, block_k: int, stages: int, warps: int, one_group: bool) -> dict:
    sig = {"x_desc": f"tensordesc<bf16[{block_m},{block_k}]>", "w_desc": f"tensordesc<bf16[{block_n},{block_k}]>",
           "B": "*bf16", "Y": "*bf16"}
    sig |= {name: "i32" for name in INTS} | {name: "constexpr" for name in FLAGS}
    consts = dict(UPCAST=False, ONE_GROUP=one_group, HAS_BIAS=False, BLOCK_M=block_m, BLOCK_N=block_n,
                  BLOCK_K=block_k, FLATTEN=False, PDL=False)  # as launched past 64 rows, where matmul.use_tma picks it
    src = ASTSource(fn=matmul_tma._linear_tma_kernel, signature=sig, constexprs=consts)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=warps, num_stages=stages, enable_fp_fusion=False))
    mma = set()
    for layout in re.findall(r"nvidia_mma<\{([^}]*)\}>", kernel.asm["ttgir"]):
        w = re.search(r"warpsPerCTA = \[([\d, ]+)\]", layout).group(1)
        instr = re.search(r"instrShape = \[([\d, ]+)\]", layout).group(1)
        mma.add(tuple(int(v) for v in (w + ", " + instr).split(", ")))
    ptx = kernel.asm["ptx"]
    wgmma = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\w+)", ptx)))
    return dict(block_m=block_m, block_n=block_n, block_k=block_k, warps=warps, one_group=one_group, mma=sorted(mma),
                wgmma=wgmma, forms=wgmma_forms(ptx), tma="cp.async.bulk.tensor" in ptx, **resource_usage(kernel))


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        bm, bn, bk, stages, warps, one = (int(v) for v in arg.split(","))
        print(json.dumps(compile_variant(bm, bn, bk, stages, warps, bool(one))))

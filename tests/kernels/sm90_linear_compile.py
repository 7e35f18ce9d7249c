"""Compile kernels/matmul.py's _linear_kernel for sm_90 without a GPU and print, per variant, what
decides its arithmetic: the MMA layout (warps per CTA, instruction shape) and the wgmma
instructions in the PTX, plus registers, local memory (spills) and shared memory, with the
wrapper's warps and stages (`stages_for` of a config with the given stages). Run as a script
(test_matmul_kernel.py does, in a subprocess: the compiler needs the real triton.jit, not the
interpreter's).

    python tests/kernels/sm90_linear_compile.py BLOCK_M,BLOCK_N,BLOCK_K,STAGES,WARPS,SPLIT,ONE_GROUP ...

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

from sm90 import resource_usage, wgmma_forms  # noqa: E402  (tests/kernels/sm90.py: the script's folder is on sys.path)
from jetspec_chat.kernels import matmul  # noqa: E402

INTS = ("M", "N", "K", "stride_xm", "stride_wn", "stride_ym", "group_blocks", "k_blocks")
FLAGS = ("UPCAST", "SPLIT", "ONE_GROUP", "HAS_BIAS", "EVEN_K", "BLOCK_M", "BLOCK_N", "BLOCK_K", "PDL")


def compile_variant(block_m: int, block_n: int, block_k: int, stages: int, warps: int, split: bool, one_group: bool) -> dict:
    sig = {"X": "*bf16", "W": "*bf16", "B": "*bf16", "Y": "*bf16", "P": "*fp32"}
    sig |= {name: "i32" for name in INTS} | {name: "constexpr" for name in FLAGS}
    consts = dict(UPCAST=False, SPLIT=split, ONE_GROUP=one_group, HAS_BIAS=False, EVEN_K=True,
                  BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PDL=True)  # as launched on sm_90
    aligned = [list(sig).index(name) for name in ("X", "W", "B", "Y", "P", "stride_xm", "stride_wn", "stride_ym")]
    src = ASTSource(fn=matmul._linear_kernel, signature=sig, constexprs=consts,
                    attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=warps, num_stages=stages, enable_fp_fusion=False,
                                         launch_pdl=True))
    mma = set()
    for layout in re.findall(r"nvidia_mma<\{([^}]*)\}>", kernel.asm["ttgir"]):
        per_cta = re.search(r"warpsPerCTA = \[([\d, ]+)\]", layout).group(1)
        instr = re.search(r"instrShape = \[([\d, ]+)\]", layout).group(1)
        mma.add(tuple(int(v) for v in (per_cta + ", " + instr).split(", ")))
    ptx = kernel.asm["ptx"]
    wgmma = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\w+)", ptx)))
    return dict(block_m=block_m, block_n=block_n, block_k=block_k, stages=stages, warps=warps, split=split,
                one_group=one_group, mma=sorted(mma), wgmma=wgmma, forms=wgmma_forms(ptx), **resource_usage(kernel))


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        bm, bn, bk, stages, warps, split, one = (int(v) for v in arg.split(","))
        print(json.dumps(compile_variant(bm, bn, bk, stages, warps, bool(split), bool(one))))

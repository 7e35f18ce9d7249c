"""Compile kernels/matmul_ws.py's _linear_ws_kernel for sm_90 without a GPU and print, per variant,
its wgmma instructions, whether they are the very instructions of matmul.py's `_linear_kernel`
for the same tile and launch (`same_wgmma`: the same instruction forms, operands from shared
memory, scale and transpose flags, and as many per kernel body), whether it loads through the
bulk tensor copy engine, whether it has warp partitions (setmaxnreg), and its registers, local
memory and shared memory. Run as a script
(test_matmul_ws.py does, in a subprocess: the compiler needs the real jit, not the interpreter's).

    python tests/kernels/sm90_ws_compile.py BLOCK_M,BLOCK_N,BLOCK_K,STAGES,SPLIT,ONE_GROUP ...

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

from sm90 import resource_usage  # noqa: E402
from jetspec_chat.kernels import matmul_ws  # noqa: E402

INTS = ("M", "N", "stride_ym", "group_blocks", "k_blocks", "items", "programs")
FLAGS = ("SPLIT", "ONE_GROUP", "HAS_BIAS", "BLOCK_M", "BLOCK_N", "BLOCK_K", "STAGES", "num_warps")


def wgmma_forms(ptx: str) -> tuple[int, list[str]]:
    """(number of wgmma.mma_async in the PTX, their distinct forms with registers blanked)."""
    ops = [line.strip() for line in ptx.splitlines() if "wgmma.mma_async" in line]
    return len(ops), sorted({re.sub(r"%\w+", "%r", re.sub(r"\{[^}]*\}", "{}", op)) for op in ops})


def linear_kernel_ptx(block_m: int, block_n: int, block_k: int, split: bool, one_group: bool) -> str:
    """`_linear_kernel`'s PTX for the same tile and launch, as sm90_linear_compile.py builds it."""
    from triton.compiler import ASTSource

    import sm90_linear_compile as linear

    sig = {"X": "*bf16", "W": "*bf16", "B": "*bf16", "Y": "*bf16", "P": "*fp32"}
    sig |= {name: "i32" for name in linear.INTS} | {name: "constexpr" for name in linear.FLAGS}
    consts = dict(UPCAST=False, SPLIT=split, ONE_GROUP=one_group, HAS_BIAS=False, EVEN_K=True,
                  BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PDL=True)
    aligned = [list(sig).index(name) for name in ("X", "W", "B", "Y", "P", "stride_xm", "stride_wn", "stride_ym")]
    src = ASTSource(fn=linear.matmul._linear_kernel, signature=sig, constexprs=consts,
                    attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=4 * block_m // 64, num_stages=3, enable_fp_fusion=False))
    return kernel.asm["ptx"]


def compile_variant(block_m: int, block_n: int, block_k: int, stages: int, split: bool, one_group: bool) -> dict:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    def desc(rows: int) -> str:
        layout = gl.NVMMASharedLayout.get_default_for([rows, block_k], gl.bfloat16)
        return f"tensordesc<bf16[{rows},{block_k}],{layout!r}>"

    num_warps = 4 * block_m // 64
    sig = {"x_desc": desc(block_m), "w_desc": desc(block_n), "B": "*bf16", "Y": "*bf16", "P": "*fp32"}
    sig |= {name: "i32" for name in INTS} | {name: "constexpr" for name in FLAGS}
    consts = dict(SPLIT=split, ONE_GROUP=one_group, HAS_BIAS=False, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=stages,
                  num_warps=num_warps)
    src = GluonASTSource(fn=matmul_ws._linear_ws_kernel, signature=sig, constexprs=consts)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=num_warps, maxnreg=matmul_ws.max_registers(num_warps),
                                         enable_fp_fusion=False))
    ptx = kernel.asm["ptx"]
    wgmma = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\w+)", ptx)))
    same = wgmma_forms(ptx) == wgmma_forms(linear_kernel_ptx(block_m, block_n, block_k, split, one_group))
    return dict(block_m=block_m, block_n=block_n, block_k=block_k, stages=stages, split=split, one_group=one_group,
                wgmma=wgmma, same_wgmma=same,
                tma="cp.async.bulk.tensor" in ptx, partitions="setmaxnreg" in ptx, **resource_usage(kernel))


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        bm, bn, bk, stages, split, one = (int(v) for v in arg.split(","))
        print(json.dumps(compile_variant(bm, bn, bk, stages, bool(split), bool(one))))

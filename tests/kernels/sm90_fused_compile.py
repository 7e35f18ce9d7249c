"""Compile kernels/fused.py's norm kernels for sm_90 without a GPU, each with and without a split
linear's partials as its input (`_load_input`; the norm also with the tensor-parallel ranks'
bf16 partials read in place through an address table), and print per variant the register layouts in
which its reductions run (resolved, not aliases) and how many layout conversions it has. A
reduction's order is its layout's (each thread adds its own elements, then shuffles, then shared
memory), so equal layouts mean the partials variant sums the squares as the plain one does.
Run as a script (test_launch_fusion.py does, in a subprocess: the compiler needs the real
triton.jit, not the interpreter's).

    python tests/kernels/sm90_fused_compile.py

prints one JSON object per variant, one a line.
"""
from __future__ import annotations

import json
import os
import re

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from jetspec_chat.kernels import fused  # noqa: E402


def ttgir(fn, sig: dict, consts: dict, warps: int) -> str:
    aligned = [i for i, (name, kind) in enumerate(sig.items()) if kind.startswith("*") or name.startswith("stride") or name == "n_cols"]
    consts = consts | {"PDL": True}  # as launched on sm_90 (kernels/launch.py)
    src = ASTSource(fn=fn, signature=sig | {name: "constexpr" for name in consts}, constexprs=consts,
                    attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    options = dict(num_warps=warps, enable_fp_fusion=False, launch_pdl=True)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    return kernel.asm["ttgir"]


def summary(case: str, variant: str, ir: str) -> dict:
    aliases = dict(re.findall(r"^(#\w+) = (#ttg\.\w+<\{.*\}>)$", ir, flags=re.M))
    operands = re.findall(r"\}\) : \((tensor<[^>]*>)\) ->", ir)  # the closing line of each tt.reduce
    layouts = sorted({aliases.get(t.rsplit(", ", 1)[1].rstrip(">"), t) for t in operands})
    return dict(case=case, variant=variant, reduce_layouts=layouts, converts=ir.count("ttg.convert_layout"))


def norm_variants(hidden: int):
    block, chunks, warps = fused._norm_launch(hidden, None)
    base = dict(R="*bf16", B="*bf16", W="*bf16", Y="*bf16", H="*bf16", n_rows="i32", n_cols="i32", inv_n="fp32",
                eps="fp32", stride_x="i32", stride_r="i32", stride_y="i32", stride_h="i32")
    for variant, x, groups, ptrs in (("output", "*bf16", 0, False), ("partials", "*fp32", 8, False),
                                     ("ranks' partials in place", "*bf16", 2, True)):
        consts = dict(HAS_RES=True, GROUPS=groups, PTRS=ptrs, HAS_BIAS=False, BLOCK=block, NUM_CHUNKS=chunks)
        yield summary(f"norm-{hidden}", variant, ttgir(fused._rms_norm_kernel, {"X": x} | base, consts, warps))


def rope_variants(d: int):
    half = d // 2
    sig = dict(Q="*bf16", K="*bf16", QO="*bf16", KO="*bf16", QW="*bf16", KW="*bf16", C="*bf16", S="*bf16",
               n_q="i32", n_k="i32", q_blocks="i32", inv_d="fp32", eps="fp32",
               stride_qt="i32", stride_qh="i32", stride_kt="i32", stride_kh="i32", stride_qot="i32",
               stride_qoh="i32", stride_kot="i32", stride_koh="i32", stride_ct="i32", stride_st="i32")
    consts = dict(HAS_QNORM=True, HAS_KNORM=True, HEADS=1, HALF=half)
    yield summary(f"rope-{d}", "qk_norm_rope", ttgir(fused._qk_norm_rope_kernel, sig, consts, 1))
    for variant, x, groups in (("qkv output", "*bf16", 0), ("qkv partials", "*fp32", 3)):
        sig = dict(QKV=x, B="*bf16", QO="*bf16", K_POOL="*bf16", V_POOL="*bf16", SLOTS="*i64", QW="*bf16", KW="*bf16",
                   C="*bf16", S="*bf16", n_rows="i32", n_cols="i32", n_q="i32", inv_d="fp32", eps="fp32",
                   stride_qkv="i32", stride_qot="i32", stride_qoh="i32", stride_ps="i32", stride_ph="i32",
                   stride_ct="i32", stride_st="i32")
        consts = dict(GROUPS=groups, PTRS=False, HAS_BIAS=True, HAS_QNORM=True, HAS_KNORM=True, HALF=half)
        yield summary(f"rope-{d}", variant, ttgir(fused._qkv_rope_write_kernel, sig, consts, 1))


if __name__ == "__main__":
    for result in (*norm_variants(1536), *norm_variants(4096), *rope_variants(128)):
        print(json.dumps(result))

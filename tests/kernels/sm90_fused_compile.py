"""Compile kernels/fused.py's norm kernels for sm_90 without a GPU, each with and without a split
linear's partials as its input (`load_input`), and the split GEMM whose last program normalises
(kernels/matmul.py, `folds_norm`), and print per variant the register layouts in
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

from jetspec_chat.kernels import fused, matmul  # noqa: E402
from jetspec_chat.kernels.row_norm import norm_launch  # noqa: E402


def ttgir(fn, sig: dict, consts: dict, warps: int, stages: int = 3) -> str:
    aligned = [i for i, (name, kind) in enumerate(sig.items())
               if kind.startswith("*") or name.startswith("stride") or name in ("n_cols", "N", "K")]
    consts = consts | {"PDL": True}  # as launched on sm_90 (kernels/launch.py)
    src = ASTSource(fn=fn, signature=sig | {name: "constexpr" for name in consts}, constexprs=consts,
                    attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    options = dict(num_warps=warps, num_stages=stages, enable_fp_fusion=False, launch_pdl=True)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    return kernel.asm["ttgir"]


def summary(case: str, variant: str, ir: str) -> dict:
    aliases = dict(re.findall(r"^(#\w+) = (#ttg\.\w+<\{.*\}>)$", ir, flags=re.M))
    operands = re.findall(r"\}\) : \((tensor<[^>]*>)\) ->", ir)  # the closing line of each tt.reduce
    layouts = sorted({aliases.get(t.rsplit(", ", 1)[1].rstrip(">"), t) for t in operands})
    return dict(case=case, variant=variant, reduce_layouts=layouts, converts=ir.count("ttg.convert_layout"))


def norm_variants(hidden: int):
    block, chunks, warps = norm_launch(hidden)
    base = dict(R="*bf16", B="*bf16", W="*bf16", Y="*bf16", H="*bf16", n_rows="i32", n_cols="i32", inv_n="fp32",
                eps="fp32", stride_x="i32", stride_r="i32", stride_y="i32", stride_h="i32")
    for variant, x, groups in (("output", "*bf16", 0), ("partials", "*fp32", 8)):
        consts = dict(HAS_RES=True, GROUPS=groups, HAS_BIAS=False, BLOCK=block, NUM_CHUNKS=chunks)
        yield summary(f"norm-{hidden}", variant, ttgir(fused._rms_norm_kernel, {"X": x} | base, consts, warps))
    # The split GEMM whose last program normalises (`folds_norm`), as launched: its config, one row.
    for name, k in (("o_proj", hidden), ("down", 8960)):
        if not matmul.folds_norm(1, hidden, k):
            continue
        config = matmul.choose_config(hidden, k)
        sig = dict(X="*bf16", W="*bf16", B="*bf16", Y="*bf16", P="*fp32", M="i32", N="i32", K="i32", stride_xm="i32",
                   stride_wn="i32", stride_ym="i32", group_blocks="i32", k_blocks="i32", R="*bf16", NW="*bf16",
                   H="*bf16", ARRIVED="*i32", inv_n="fp32", eps="fp32")
        consts = dict(UPCAST=False, SPLIT=True, ONE_GROUP=False, HAS_BIAS=False, EVEN_K=True, SILU=False,
                      NORM_GROUPS=config.num_groups(k), NORM_BLOCK=block, USE_LIBDEVICE=True, BLOCK_M=matmul.BLOCK_M,
                      BLOCK_N=config.block_n, BLOCK_K=config.block_k)
        ir = ttgir(matmul._linear_kernel, sig, consts, matmul.warps_for(matmul.BLOCK_M, config), config.num_stages)
        yield summary(f"norm-{hidden}", f"gemm {name}", ir)


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
        consts = dict(GROUPS=groups, HAS_BIAS=True, HAS_QNORM=True, HAS_KNORM=True, HALF=half)
        yield summary(f"rope-{d}", variant, ttgir(fused._qkv_rope_write_kernel, sig, consts, 1))


if __name__ == "__main__":
    for result in (*norm_variants(1536), *norm_variants(4096), *rope_variants(128)):
        print(json.dumps(result))

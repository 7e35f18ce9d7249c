"""Compile kernels/gated_delta.py's tree-walk kernel for sm_90 without a GPU, at Qwen3.6-35B-A3B's
and Qwen3.8-27B's head shapes (d_k = d_v = 128, 2 or 3 value heads per key head), with and
without PDL, and print its registers, local memory (spills) and shared memory. Run as a script
(test_gated_delta_kernel.py does, in a subprocess: the compiler needs the real triton.jit).

    python tests/kernels/sm90_gated_delta_compile.py

prints one JSON object per variant, one a line.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).parent))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from jetspec_chat.kernels import gated_delta  # noqa: E402
from sm90 import resource_usage  # noqa: E402

SIGNATURE = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", q_row="i32", k_row="i32", v_row="i32", g_ptr="*fp32",
                 beta_ptr="*fp32", walk_ptr="*i32", walk_row="i32", len_ptr="*i32", owner_ptr="*i32", s_in_ptr="*fp32",
                 s_out_ptr="*fp32", o_ptr="*fp32", T="i32", H="i32", emit="i32", store="i32", scale="fp32")

if __name__ == "__main__":
    aligned = [i for i, kind in enumerate(SIGNATURE.values()) if kind.startswith("*")]
    for rep in (2, 3):
        for pdl in (False, True):
            consts = dict(REP=rep, DK=128, DV=128, BV=gated_delta.BLOCK_V, PDL=pdl)
            src = ASTSource(fn=gated_delta._gated_delta_walk_kernel, signature=SIGNATURE | {n: "constexpr" for n in consts},
                            constexprs=consts, attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
            kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                    options=dict(num_warps=gated_delta.WARPS, enable_fp_fusion=False, launch_pdl=pdl))
            print(json.dumps(dict(rep=rep, pdl=pdl, **resource_usage(kernel))))

"""Compile kernels/sampling.py's _nucleus_sample_kernel (both NUCLEUS variants),
_row_mass_kernel and _sample_candidates_kernel for sm_90 without a GPU, PDL on and off, and print, per variant, its registers, local memory and shared memory,
one JSON object a line. Run as a script (test_sampling_kernel.py does, in a subprocess: the
compiler needs the real triton.jit, not the interpreter's)."""
from __future__ import annotations

import json
import os

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sm90 import resource_usage  # noqa: E402
from jetspec_chat.kernels import sampling  # noqa: E402

if __name__ == "__main__":
    sig = {"X": "*fp32", "U": "*fp64", "TOP_P": "*fp64", "NEED": "*i8", "TOKENS": "*i64", "KEPT": "*i32",
           "SCRATCH": "*fp32", "V": "i32", "stride": "i32", "NUCLEUS": "constexpr", "CAPACITY": "constexpr",
           "LEVELS": "constexpr", "BLOCK": "constexpr", "BLOCK_T": "constexpr", "USE_LIBDEVICE": "constexpr",
           "PDL": "constexpr"}
    for nucleus in (True, False):
        for pdl in (True, False):
            consts = dict(NUCLEUS=nucleus, CAPACITY=sampling.FALLBACK_CAPACITY, LEVELS=sampling.BRACKET_LEVELS,
                          BLOCK=sampling.BLOCK, BLOCK_T=sampling.BLOCK // 8, USE_LIBDEVICE=True, PDL=pdl)
            src = ASTSource(fn=sampling._nucleus_sample_kernel, signature=sig, constexprs=consts)
            kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=sampling.FALLBACK_WARPS, enable_fp_fusion=False))
            print(json.dumps(dict(nucleus=nucleus, pdl=pdl, **resource_usage(kernel))))
    sig = {"X": "*fp32", "M": "*fp32", "PART": "*fp64", "V": "i32", "stride": "i32", "chunks": "i32",
           "CHUNK": "constexpr", "BLOCK": "constexpr", "USE_LIBDEVICE": "constexpr", "PDL": "constexpr"}
    for pdl in (True, False):
        consts = dict(CHUNK=sampling.MASS_CHUNK, BLOCK=sampling.BLOCK, USE_LIBDEVICE=True, PDL=pdl)
        src = ASTSource(fn=sampling._row_mass_kernel, signature=sig, constexprs=consts)
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                options=dict(num_warps=sampling.WARPS, enable_fp_fusion=False))
        print(json.dumps(dict(kernel="row_mass", pdl=pdl, **resource_usage(kernel))))
    sig = {"X": "*fp32", "U": "*fp64", "TOP_P": "*fp64", "TOKENS": "*i64", "NEED": "*i8", "KEPT": "*i32",
           "CAND_X": "*fp32", "CAND_I": "*i32", "CAND_KEPT": "*i8", "V": "i32", "stride": "i32",
           "CAP": "constexpr", "BINS": "constexpr", "SCALE": "constexpr", "BLOCK": "constexpr",
           "USE_LIBDEVICE": "constexpr", "PDL": "constexpr"}
    for pdl in (True, False):
        consts = dict(CAP=256, BINS=sampling.CANDIDATE_BINS, SCALE=sampling.BIN_SCALE, BLOCK=sampling.BLOCK,
                      USE_LIBDEVICE=True, PDL=pdl)
        src = ASTSource(fn=sampling._sample_candidates_kernel, signature=sig, constexprs=consts)
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                options=dict(num_warps=sampling.CANDIDATE_WARPS, enable_fp_fusion=False))
        print(json.dumps(dict(kernel="sample_candidates", pdl=pdl, **resource_usage(kernel))))

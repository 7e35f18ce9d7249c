"""Compile kernels/sampling.py's _nucleus_sample_kernel (both NUCLEUS variants),
_row_mass_kernel and the five candidates kernels for sm_90 without a GPU, PDL on and off, and
print, per variant, its registers, local memory and shared memory,
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
    # The candidates passes (one program a chunk) and the draw (one a row), at the engine's 256
    # candidates and a 152k-token row's chunk count.
    chunks = triton.cdiv(151_936, sampling.CANDIDATE_CHUNK)
    shape = dict(CHUNK=sampling.CANDIDATE_CHUNK, BLOCK=min(sampling.BLOCK, sampling.CANDIDATE_CHUNK),
                 SLOTS=sampling.COUNT_SLOTS)
    wide = dict(CHUNKS_P=triton.next_power_of_2(chunks), **shape)
    hist = dict(BINS=sampling.CANDIDATE_BINS, SCALE=sampling.BIN_SCALE)
    row = {"V": "i32", "stride": "i32", "chunks": "i32"}
    passes = [
        ("candidates_max", sampling._candidates_max_kernel,
         {"X": "*fp32", "PART_M": "*fp32", "COUNTS": "*i32", **row}, shape, sampling.CANDIDATE_WARPS),
        ("candidates_mass", sampling._candidates_mass_kernel,
         {"X": "*fp32", "PART_M": "*fp32", "PART_Z": "*fp64", "COUNTS": "*i32", **row},
         dict(**wide, **hist, USE_LIBDEVICE=True), sampling.CANDIDATE_WARPS),
        ("candidates_fine", sampling._candidates_fine_kernel,
         {"X": "*fp32", "PART_M": "*fp32", "COUNTS": "*i32", **row}, dict(**wide, CAP=256, **hist),
         sampling.CANDIDATE_WARPS),
        ("candidates_copy", sampling._candidates_copy_kernel,
         {"X": "*fp32", "PART_M": "*fp32", "COUNTS": "*i32", "CAND_X": "*fp32", "CAND_I": "*i32", **row},
         dict(**wide, CAP=256, **hist), sampling.CANDIDATE_WARPS),
        ("candidates_draw", sampling._candidates_draw_kernel,
         {"U": "*fp64", "TOP_P": "*fp64", "TOKENS": "*i64", "NEED": "*i8", "KEPT": "*i32", "PART_M": "*fp32",
          "PART_Z": "*fp64", "COUNTS": "*i32", "CAND_X": "*fp32", "CAND_I": "*i32", "V": "i32", "chunks": "i32"},
         dict(CHUNKS_P=wide["CHUNKS_P"], SLOTS=sampling.COUNT_SLOTS, CAP=256, INDEX_BITS=sampling.INDEX_BITS,
              USE_LIBDEVICE=True), sampling.DRAW_WARPS),
    ]
    for name, fn, sig, consts, warps in passes:
        sig = dict(sig, **{k: "constexpr" for k in consts}, PDL="constexpr")
        for pdl in (True, False):
            src = ASTSource(fn=fn, signature=sig, constexprs=dict(consts, PDL=pdl))
            kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                    options=dict(num_warps=warps, enable_fp_fusion=False))
            print(json.dumps(dict(kernel=name, pdl=pdl, **resource_usage(kernel))))

"""Compile kernels/top_logprobs.py's two kernels for sm_90 without a GPU, at the draft's shape
(a 151,936-token row) for k = 8 / 32 / 64, fp32 and bf16 logits, PDL on and off, and print per
variant its registers, local memory (spills) and shared memory, one JSON object a line. Run as a
script with optional CHUNKS KS DTYPES, comma lists (test_top_logprobs_kernel.py does, in a subprocess: the compiler needs the real
triton.jit, not the interpreter's)."""
from __future__ import annotations

import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sm90 import resource_usage  # noqa: E402
from jetspec_chat.kernels import top_logprobs as tk  # noqa: E402

if __name__ == "__main__":
    chunks = [int(c) for c in sys.argv[1].split(",")] if len(sys.argv) > 1 else [tk.CHUNK]
    ks = [int(k) for k in sys.argv[2].split(",")] if len(sys.argv) > 2 else [8, 32, 64]
    dtypes = sys.argv[3].split(",") if len(sys.argv) > 3 else ["fp32", "bf16"]
    target = GPUTarget("cuda", 90, 32)
    for chunk in chunks:
        for k in ks:
            kp = tk._pow2(k)
            for dtype in dtypes:
                for pdl in (True, False):
                    sig = {"X": f"*{dtype}", "MAXS": "*fp32", "SUMS": "*fp32", "CAND": "*i64", "V": "i32",
                           "stride": "i32", "n_chunks": "i32", "CHUNK": "constexpr", "KP": "constexpr", "NARROW": "constexpr",
                           "PDL": "constexpr"}
                    narrow = dtype != "fp32"  # as top_log_probs_triton launches it
                    src = ASTSource(fn=tk._chunk_top_kernel, signature=sig,
                                    constexprs=dict(CHUNK=chunk, KP=kp, NARROW=narrow, PDL=pdl))
                    kernel = triton.compile(src, target=target, options=dict(num_warps=tk._chunk_warps(chunk)))
                    print(json.dumps(dict(kernel="chunk_top", chunk=chunk, k=k, dtype=dtype, pdl=pdl, **resource_usage(kernel))))
            ncp = tk._pow2(triton.cdiv(151_936, max(chunk, kp)))
            sig = {"MAXS": "*fp32", "SUMS": "*fp32", "CAND": "*i64", "VALUES": "*fp32", "IDS": "*i64",
                   "n_chunks": "i32", "k": "i32", "NCP": "constexpr", "KP": "constexpr", "PDL": "constexpr"}
            src = ASTSource(fn=tk._merge_top_kernel, signature=sig, constexprs=dict(NCP=ncp, KP=kp, PDL=True))
            kernel = triton.compile(src, target=target, options=dict(num_warps=tk._merge_warps(ncp * kp)))
            print(json.dumps(dict(kernel="merge_top", chunk=chunk, k=k, ncp=ncp, **resource_usage(kernel))))

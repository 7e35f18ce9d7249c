"""Compile kernels/accept.py's kernel for sm_90 without a GPU at the verify buckets' sizes (and
the widest, 1024 nodes), the size in memory or a value, PDL on and off, and the AR round's
launch (n, path_len and size all 1: Triton passes an int argument of 1 as a constant); print per
variant its registers, local memory (spills) and shared memory, one JSON object a line. Run as a
script (test_accept_kernel.py does, in a subprocess: the compiler needs the real triton.jit, not
the interpreter's)."""
from __future__ import annotations

import json
import os

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sm90 import resource_usage  # noqa: E402
from jetspec_chat.kernels import accept as ak  # noqa: E402

POINTERS = {"TOKENS": "*i64", "PARENTS": "*i64", "DEPTHS": "*i64", "SCORES": "*fp32", "CHOICES": "*i64",
            "ANC": "*u8", "anc_s0": "i32", "anc_s1": "i32", "SIZE": "*i64", "size_value": "i32",
            "HEAD": "*i64", "PACKED": "*i32", "n": "i32", "path_len": "i32"}


def compile_one(n: int, path_len: int, in_memory: bool, pdl: bool, ones: bool) -> dict:
    np_ = ak._pow2(n)
    constexprs = dict(NP=np_, ROWS=max(1, min(np_, ak.TILE // np_)), LEVELS=max(1, min(ak._pow2(path_len), ak.TILE // np_)),
                      SIZE_IN_MEMORY=in_memory, PDL=pdl)
    sig = dict(POINTERS, NP="constexpr", ROWS="constexpr", LEVELS="constexpr", SIZE_IN_MEMORY="constexpr", PDL="constexpr")
    if ones:  # the AR round: n = path_len = 1 (and the size 1 when passed as a value)
        for name in ("n", "path_len") + (() if in_memory else ("size_value",)):
            sig[name] = "constexpr"
            constexprs[name] = 1
    src = ASTSource(fn=ak._accept_pack_kernel, signature=sig, constexprs=constexprs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4 if np_ <= 256 else 8))
    return dict(n=n, path_len=path_len, in_memory=in_memory, pdl=pdl, ones=ones, **resource_usage(kernel))


if __name__ == "__main__":
    print(json.dumps(compile_one(1, 1, True, True, True)))
    print(json.dumps(compile_one(1, 1, False, True, True)))
    for n in (16, 64, 256, 1024):
        for in_memory in (True, False):
            print(json.dumps(compile_one(n, 16, in_memory, True, False)))
    print(json.dumps(compile_one(64, 16, True, False, False)))

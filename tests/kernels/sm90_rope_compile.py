"""Compile kernels/rope.py's kernel for sm_90 without a GPU (the engine's variants: bf16 and fp32
tables, D = 64 / 128 / 256, YaRN's factor on and off) and print per variant its registers, local
memory (spills) and the approximate math instructions of its PTX (`sin.approx`, `cos.approx`,
`ex2.approx`, ...: torch's cosf / sinf use none), one JSON object a line. Run as a script
(test_rope_kernel.py does, in a subprocess: the compiler needs the real triton.jit, not the
interpreter's)."""
from __future__ import annotations

import json
import os
import re

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sm90 import resource_usage  # noqa: E402
from jetspec_chat.kernels import rope  # noqa: E402

if __name__ == "__main__":
    target = GPUTarget("cuda", 90, 32)
    for dtype in ("bf16", "fp32"):
        for d in (64, 128, 256):
            for scaled in (False, True):
                sig = {"POS": "*i64", "INV_FREQ": "*fp32", "COS": f"*{dtype}", "SIN": f"*{dtype}", "t": "i32",
                       "attention_factor": "fp32"}
                consts = dict(H=d // 2, DP=d, BLOCK_T=rope.BLOCK_ELEMENTS // d, SCALED=scaled, USE_LIBDEVICE=True, PDL=True)
                src = ASTSource(fn=rope._rope_cos_sin_kernel, signature=sig | {k: "constexpr" for k in consts}, constexprs=consts)
                kernel = triton.compile(src, target=target, options=dict(num_warps=4, enable_fp_fusion=False))
                approx = sorted({m.group(0) for m in re.finditer(r"\b\w+\.approx(\.\w+)*", kernel.asm["ptx"])})
                print(json.dumps(dict(dtype=dtype, d=d, scaled=scaled, approx=approx, **resource_usage(kernel))))

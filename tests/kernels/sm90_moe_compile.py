"""Compile kernels/moe.py's expert GEMMs for sm_90 without a GPU and print, per kernel, what
decides its arithmetic (the MMA instructions in the PTX: mma.sync, never wgmma) and its
resources (registers, local memory = spills, shared memory), bf16, Qwen3-30B-A3B's top-k 8.
Run as a script (test_moe_kernel.py does, in a subprocess: the compiler needs the real
triton.jit, not the interpreter's).

    python tests/kernels/sm90_moe_compile.py GATE_UP_N,DOWN_N,BLOCK_K,WARPS,STAGES,TOKEN_N,TOKEN_WARPS,TOKEN_STAGES|gpt-oss|gemma4 ...

prints one JSON object per kernel and tile, one a line.
"""
from __future__ import annotations

import json
import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sm90 import resource_usage  # noqa: E402  (tests/kernels/sm90.py: the script's folder is on sys.path)
from jetspec_chat.kernels import moe  # noqa: E402

TOP_K = 8
GEMM_INTS = ("hidden", "inter_size")


def compile_kernel(fn, pointers: dict[str, str], ints: tuple[str, ...], consts: dict, warps: int, stages: int,
                   floats: tuple[str, ...] = (), unaligned: tuple[str, ...] = ()) -> dict:
    consts = consts | {"PDL": True}  # as launched on sm_90 (kernels/launch.py)
    sig = dict(pointers) | {name: "i32" for name in ints} | {name: "fp32" for name in floats} | {name: "constexpr" for name in consts}
    sig = {name: sig[name] for name in fn.arg_names}  # the kernel's parameter order
    # as Triton specialises them at the real shapes (multiples of 16; gpt-oss's gate column stride is 2)
    aligned = [n for n in list(pointers) + list(ints) if n not in unaligned]
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs={(list(sig).index(n),): [["tt.divisibility", 16]] for n in aligned})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages, launch_pdl=True))
    return dict(mma=sorted(set(re.findall(r"\bmma\.sync\.aligned\.(\S+?)\s", kernel.asm["ptx"]))),
                wgmma=sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\w+)", kernel.asm["ptx"]))),
                **resource_usage(kernel))


def compile_tile(tile: moe.MoeTile, family: str = "qwen3") -> list[dict]:
    """The four expert GEMM kernels at `tile`: Qwen3-30B-A3B's layout (K contiguous: the K
    strides are 1, which Triton specialises as it does at launch), or gpt-oss-20b's (top 4,
    gate/up interleaved in [E, H, 2I]: gate columns 2 apart, up 1 further; down [E, I, H]: N
    contiguous), with its biases and clamped SwiGLU, or Gemma 4 26B-A4B's (Qwen3's layout and
    top 8, gelu-tanh through libdevice's tanh, fp32 routing weights)."""
    gpt_oss, gemma4 = family == "gpt-oss", family == "gemma4"
    act = moe.SWIGLU if gpt_oss else moe.GELU_TANH if gemma4 else moe.SILU
    rw = "*fp32" if gemma4 else "*bf16"
    groups = {"BLOCK_EXPERT": "*i32", "BLOCK_ROWS": "*i32", "ROW_ASSIGN": "*i32"}
    top_k = 4 if gpt_oss else TOP_K
    gu_strides = ("stride_x", "stride_we", "stride_wn", "stride_wk", "stride_i") if gpt_oss else (
        "stride_x", "stride_we", "stride_wn", "up_offset", "stride_i")
    gu_ones = dict(up_offset=1) if gpt_oss else dict(stride_wk=1)
    d_strides = ("stride_i", "stride_we", "stride_wk", "stride_o") if gpt_oss else ("stride_i", "stride_we", "stride_wn", "stride_o")
    d_ones = dict(stride_wn=1) if gpt_oss else dict(stride_wk=1)
    gate_up_sig = {"X": "*bf16", "WGU": "*bf16", "BGU": "*bf16", "INTER": "*bf16", "IDS": "*i32"} | groups
    gate_up, gate_up_token = (compile_kernel(
        moe._gate_up_kernel, gate_up_sig, GEMM_INTS + gu_strides, gu_ones | dict(
            TOP_K=top_k, BLOCK_M=moe.BLOCK_M, BLOCK_N=tile.gate_up_n, BLOCK_K=tile.block_k, UPCAST=False, TOKEN=token,
            ACT=act, LIBDEVICE=True), tile.num_warps, tile.num_stages, floats=("alpha", "limit"),
        unaligned=("stride_wn",) if gpt_oss else ())
        for token in (False, True))
    down = compile_kernel(
        moe._down_kernel, {"INTER": "*bf16", "WD": "*bf16", "BD": "*bf16", "RW": rw, "OUT": "*bf16"} | groups,
        GEMM_INTS + d_strides, d_ones | dict(BLOCK_M=moe.BLOCK_M, BLOCK_N=tile.down_n, BLOCK_K=tile.block_k, UPCAST=False,
                                             HAS_BIAS=gpt_oss),
        tile.num_warps, tile.num_stages)
    token = compile_kernel(
        moe._down_combine_kernel,
        {"INTER": "*bf16", "WD": "*bf16", "BD": "*bf16", "RW": rw, "IDS": "*i32", "OUT": "*bf16"},
        GEMM_INTS + d_strides, d_ones | dict(TOP_K=top_k, BLOCK_TOP=top_k, BLOCK_M=moe.BLOCK_M, BLOCK_N=tile.token_n,
                                             BLOCK_K=tile.block_k, UPCAST=False, HAS_BIAS=gpt_oss),
        tile.token_warps, tile.token_stages)
    kernels = (("gate_up", gate_up), ("gate_up_token", gate_up_token), ("down", down), ("down_combine", token))
    suffix = {"qwen3": "", "gpt-oss": "_gpt_oss", "gemma4": "_gemma4"}[family]
    return [dict(kernel=name + suffix, tile=repr(tile)) | info for name, info in kernels]


def compile_route(family: str = "qwen3") -> dict:
    """The routing kernel as the engine launches it at Qwen3-30B-A3B's router (16 K groups, 128
    experts, top 8, renormalised, grouping picks on), gpt-oss-20b's (32 experts, top 4, router
    bias, softmax over the top 4) or Gemma 4 26B-A4B's (Qwen3's, then per-expert scales, fp32
    weights)."""
    gpt_oss, gemma4 = family == "gpt-oss", family == "gemma4"
    info = compile_kernel(
        moe._route_kernel, {"LOGITS": "*fp32", "BIAS": "*bf16", "SCALE": "*bf16", "IDS": "*i32",
                            "W": "*fp32" if gemma4 else "*bf16", "PICKS": "*i8"},
        ("n_tokens", "n_experts", "stride_l"),
        dict(TOP_K=4 if gpt_oss else TOP_K, NORM=not gpt_oss, GROUPS=16, BLOCK_E=32 if gpt_oss else 128,
             BLOCK_TOP=4 if gpt_oss else TOP_K, GROUP=True, HAS_BIAS=gpt_oss, TOPK_SOFTMAX=gpt_oss,
             EXPERT_SCALE=gemma4, DT=tl.bfloat16), moe.ROUTE_WARPS, 1)
    return dict(kernel={"qwen3": "route", "gpt-oss": "route_gpt_oss", "gemma4": "route_gemma4"}[family]) | info


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        if arg in ("gpt-oss", "gemma4"):  # that family's options at the engine's TILE, and its routing
            for line in compile_tile(moe.TILE, arg):
                print(json.dumps(line))
            print(json.dumps(compile_route(arg)))
            continue
        gu, dn, bk, w, s, tn, tw, ts = (int(v) for v in arg.split(","))
        tile = moe.MoeTile(gate_up_n=gu, down_n=dn, block_k=bk, num_warps=w, num_stages=s,
                           token_n=tn, token_warps=tw, token_stages=ts)
        for line in compile_tile(tile):
            print(json.dumps(line))
    print(json.dumps(compile_route()))

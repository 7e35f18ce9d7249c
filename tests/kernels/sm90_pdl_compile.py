"""Compile the forward's kernels for sm_90 without a GPU, with and without programmatic dependent
launch (kernels/launch.py), and print per kernel what the PDL build adds: its `griddepcontrol`
instructions, whether the wait comes before every global memory access, whether its Triton GPU IR
is otherwise the same program (the same ops on the same layouts: `ir_diff` empty), and whether its PTX has the
same instructions (LLVM schedules the parameter loads around the wait, so the text differs; the
multiset of instructions must not). Run as a script (test_launch.py does, in a subprocess: the
compiler needs the real triton.jit, not the interpreter's).

    python tests/kernels/sm90_pdl_compile.py

prints one JSON object per kernel, one a line.
"""
from __future__ import annotations

import collections
import difflib
import json
import os
import re

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from jetspec_chat.kernels import fused, key_order, matmul, moe, tree_attention  # noqa: E402
from jetspec_chat.kernels import rope as rope_kernels  # noqa: E402

GDC = "griddepcontrol"
MEMORY = re.compile(r"^\s*(?:@%p\d+\s+)?(?:ld|st|atom|red|cp\.async)\.(?:global|shared::cluster)")


def build(fn, sig: dict[str, str], consts: dict, warps: int, stages: int, pdl: bool) -> dict[str, str]:
    sig = sig | {name: "constexpr" for name in consts} | {"PDL": "constexpr"}
    aligned = [i for i, (name, kind) in enumerate(sig.items())
               if kind != "constexpr" and (kind.startswith("*") or name.startswith("stride"))]
    src = ASTSource(fn=fn, signature=sig, constexprs=consts | {"PDL": pdl},
                    attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    options = dict(num_warps=warps, num_stages=stages, enable_fp_fusion=False, launch_pdl=pdl)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm


def program(ttgir: str) -> list[str]:
    """The IR's ops without source locations and without the grid dependency ops (triton 3.9:
    `tt.grid_dependency_*`; 3.6: inline asm with a dummy result, which shifts the numbering of the
    unnamed values, so those are renumbered in order of appearance)."""
    lines = [re.sub(r" loc\([^)]*\)", "", line) for line in ttgir.splitlines()
             if not line.startswith("#loc") and "grid_dependency" not in line and GDC not in line]
    names: dict[str, str] = {}
    return [re.sub(r"%(\d+)\b", lambda m: names.setdefault(m.group(0), f"%v{len(names)}"), line) for line in lines]


def instructions(ptx: str) -> collections.Counter:
    """How often each PTX instruction (opcode with its type suffixes) occurs, guards dropped."""
    ops = collections.Counter()
    for line in ptx.splitlines():
        line = re.sub(r"^@!?%p\d+\s+", "", line.strip())
        if line and not line.startswith(("//", ".", "$", "{", "}", ")", "(")):
            ops[line.split()[0].rstrip(";")] += 1
    return ops


def compare(name: str, fn, sig: dict[str, str], consts: dict, warps: int, stages: int = 3) -> dict:
    plain = build(fn, sig, consts, warps, stages, False)
    with_pdl = build(fn, sig, consts, warps, stages, True)
    lines = with_pdl["ptx"].splitlines()
    gdc = [line.split(";")[0].strip() for line in lines if GDC in line]  # triton 3.6 adds "; // dummy %rN"
    first_wait = next((i for i, line in enumerate(lines) if f"{GDC}.wait" in line), len(lines))
    first_access = next((i for i, line in enumerate(lines) if MEMORY.match(line)), len(lines))
    added = instructions(with_pdl["ptx"]) - instructions(plain["ptx"])
    removed = instructions(plain["ptx"]) - instructions(with_pdl["ptx"])
    return dict(kernel=name, gdc=gdc, plain_gdc=plain["ptx"].count(GDC), wait_first=first_wait < first_access,
                ir_diff=[line for line in difflib.unified_diff(program(plain["ttgir"]), program(with_pdl["ttgir"]), lineterm="", n=0)
                         if line[:1] in "+-" and line[:3] not in ("+++", "---")][:8],
                added=sorted(added), removed=sorted(removed),
                mma=sorted(op for op in instructions(plain["ptx"]) if "mma" in op))


def kernels():
    p16, p32, i32 = "*bf16", "*fp32", "i32"
    ints = dict.fromkeys
    linear = dict(X=p16, W=p16, B=p16, Y=p16, P=p32) | ints(
        ("M", "N", "K", "stride_xm", "stride_wn", "stride_ym", "group_blocks", "k_blocks"), i32)
    for split in (True, False):
        consts = dict(UPCAST=False, SPLIT=split, ONE_GROUP=False, HAS_BIAS=True, EVEN_K=True,
                      BLOCK_M=matmul.BLOCK_M, BLOCK_N=64, BLOCK_K=64)
        yield compare(f"linear split={split}", matmul._linear_kernel, linear, consts, 4, 4)
    yield compare("sum_groups", matmul._sum_groups_kernel,
                  dict(P=p32, B=p16, Y=p16, M=i32, N=i32, stride_ym=i32),
                  dict(GROUPS=8, HAS_BIAS=False, BLOCK=matmul.SUM_BLOCK), 2)
    norm = dict(X=p32, R=p16, B=p16, W=p16, Y=p16, H=p16, n_rows=i32, n_cols=i32, inv_n="fp32", eps="fp32",
                stride_x=i32, stride_r=i32, stride_y=i32, stride_h=i32)
    block, chunks, warps = fused._norm_launch(1536, None)
    yield compare("add_rms_norm (partials)", fused._rms_norm_kernel, norm,
                  dict(HAS_RES=True, GROUPS=8, PTRS=False, HAS_BIAS=False, BLOCK=block, NUM_CHUNKS=chunks), warps)
    yield compare("silu_mul", fused._silu_mul_kernel,
                  dict(G=p16, U=p16, O=p16, n_cols=i32, stride_g=i32, stride_u=i32, stride_o=i32),
                  dict(BLOCK=fused.SILU_BLOCK, USE_LIBDEVICE=True), 4)
    yield compare("rope_cos_sin", rope_kernels._rope_cos_sin_kernel,
                  dict(POS="*i64", INV_FREQ=p32, COS=p16, SIN=p16, t=i32, attention_factor="fp32"),
                  dict(H=64, DP=128, BLOCK_T=16, SCALED=False, USE_LIBDEVICE=True), 4)
    rope = dict(QKV=p32, B=p16, QO=p16, K_POOL=p16, V_POOL=p16, SLOTS="*i64", QW=p16, KW=p16, C=p16, S=p16,
                n_rows=i32, n_cols=i32, n_q=i32, inv_d="fp32", eps="fp32") | ints(
        ("stride_qkv", "stride_qot", "stride_qoh", "stride_ps", "stride_ph", "stride_ct", "stride_st"), i32)
    yield compare("qkv_rope_write (partials)", fused._qkv_rope_write_kernel, rope,
                  dict(GROUPS=3, PTRS=False, HAS_BIAS=True, HAS_QNORM=False, HAS_KNORM=False, HALF=64), 1)
    attn = dict(Q=p16, K=p16, V=p16, BT="*i32", PREFIX="*i32", ORDER="*i32", COUNT="*i32", OUT=p16,
                CH_A=p32, CH_M=p32, CH_L=p32, TL_A=p32, TL_M=p32, TL_L=p32, SINKS=p32, T=i32, N_HEADS=i32, SPLIT_LEN=i32,
                SPLIT_PROGRAMS=i32, TILE_STRIDE=i32, qk_scale="fp32") | ints(
        ("stride_qt", "stride_qh", "stride_kb", "stride_ks", "stride_kh", "stride_vb", "stride_vs", "stride_vh",
         "stride_ot", "stride_oh"), i32)
    # AR, a prefill chunk (shared keys), and a tree (1.5B: GQA group 6) on the engine's caches (no
    # block table: whole prefix tiles through TMA descriptors where sm_90 runs them so), a tree through a
    # block table, and a big tree's tile programs launched apart (TAIL)
    modes = tree_attention.AR_MODE.value, tree_attention.TREE_MODE.value, tree_attention.CHUNK_MODE.value
    tail = tree_attention.TAIL_MODE.value
    for name, mode, paged in (("AR", modes[0], False), ("chunk", modes[2], False), ("tree", modes[1], False),
                              ("tree paged", modes[1], True), ("tail", tail, False)):
        consts = dict(GROUP=6, HEAD_DIM=128, BLOCK_SIZE=16, BLOCK_M=tree_attention.BLOCK_M,
                      BLOCK_N=tree_attention.BLOCK_N, MODE=mode, FLAT_TILES=tree_attention.FLAT_TILES, PAGED=paged,
                      PRECISION="tf32", WINDOW=0, HAS_SINKS=False, V_SPLIT=1,
                      TMA=not paged and tree_attention.tma_shape(128, ar=mode == modes[0]))
        desc = "tensordesc<bf16[64,128]>" if consts["TMA"] else p16
        yield compare(f"tree_attn {name}", tree_attention._tree_attn_kernel, attn | dict(K_DESC=desc, V_DESC=desc),
                      consts, tree_attention.NUM_WARPS,
                      {modes[0]: tree_attention.AR_NUM_STAGES, tail: tree_attention.TAIL_STAGES}.get(
                          mode, tree_attention.NUM_STAGES))  # as launched
    yield compare("merge", tree_attention._merge_kernel,
                  dict(OUT=p16, CH_A=p32, CH_M=p32, CH_L=p32, TL_A=p32, TL_M=p32, TL_L=p32, PREFIX="*i32",
                       COUNT="*i32", SINKS=p32, T=i32, N_HEADS=i32, stride_ot=i32, stride_oh=i32),
                  dict(HEAD_DIM=128, BLOCK_N=tree_attention.BLOCK_N, SPLIT_TILES=9, MODE=modes[1],
                       FLAT_TILES=tree_attention.FLAT_TILES, HAS_SINKS=False,
                       **tree_attention.merge_config(False, 1, 128, 9).constexprs()), 1)
    yield compare("merge AR (splits side by side)", tree_attention._merge_kernel,
                  dict(OUT=p16, CH_A=p32, CH_M=p32, CH_L=p32, TL_A=p32, TL_M=p32, TL_L=p32, PREFIX="*i32",
                       COUNT="*i32", SINKS=p32, T=i32, N_HEADS=i32, stride_ot=i32, stride_oh=i32),
                  dict(HEAD_DIM=128, BLOCK_N=tree_attention.BLOCK_N, SPLIT_TILES=9, MODE=modes[0], FLAT_TILES=0,
                       HAS_SINKS=False, **tree_attention.merge_config(True, 59, 128, 9).constexprs()),
                  tree_attention.AR_MERGE_WARPS)
    yield compare("visible_keys", key_order._visible_keys_kernel,
                  dict(MASK="*u8", ORDER="*i32", COUNT="*i32", T=i32, stride_row=i32, stride_col="constexpr"),
                  dict(stride_col=1, BLOCK=64), key_order.NUM_WARPS)  # a contiguous mask: Triton specialises 1
    groups = {"BLOCK_EXPERT": "*i32", "BLOCK_ROWS": "*i32", "ROW_ASSIGN": "*i32"}
    tile = moe.TILE
    # Qwen3's layout: the K stride is 1, a constexpr as Triton specialises it at launch
    yield compare("moe gate_up", moe._gate_up_kernel, {"X": p16, "WGU": p16, "BGU": p16, "INTER": p16, "IDS": "*i32"}
                  | groups | ints(("hidden", "inter_size", "stride_x", "stride_we", "stride_wn"), i32)
                  | {"stride_wk": "constexpr", "up_offset": i32, "stride_i": i32, "alpha": "fp32", "limit": "fp32"},
                  dict(stride_wk=1, TOP_K=8, BLOCK_M=moe.BLOCK_M, BLOCK_N=tile.gate_up_n, BLOCK_K=tile.block_k,
                       UPCAST=False, TOKEN=True, ACT=moe.SILU, LIBDEVICE=True),
                  tile.num_warps, tile.num_stages)


if __name__ == "__main__":
    for result in kernels():
        print(json.dumps(result), flush=True)

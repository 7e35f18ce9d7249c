"""Compile kernels/tree_attention.py's attention binaries for sm_90 without a GPU and print, per
head width and MODE, the launch configuration it gets (`tree_attention.tile_config`) and its
resources: registers, local memory (spills) and shared memory, bf16 as the engine runs it, and
the opcode counts of its tile loop (the shortest loop that issues a wgmma: what one key tile
costs a thread).
Run as a script (test_kernels.py does, in a subprocess: the compiler needs the real triton.jit,
not the interpreter's).

    python tests/kernels/sm90_tree_attention_compile.py HEAD_DIM ...

prints one JSON object per (head width, MODE) and three for the merge of a 32768-key cache's
splits (TREE, CHUNK, AR), one a line.
"""
from __future__ import annotations

import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sm90 import innermost_mma_loop, resource_usage, sass  # noqa: E402  (tests/kernels/sm90.py: the script's folder is on sys.path)
from jetspec_chat.kernels import tree_attention as ta  # noqa: E402

POINTERS = dict(Q="*bf16", K="*bf16", V="*bf16", BT="*i32", PREFIX="*i32", ORDER="*i32", COUNT="*i32", OUT="*bf16",
                CH_A="*fp32", CH_M="*fp32", CH_L="*fp32", TL_A="*fp32", TL_M="*fp32", TL_L="*fp32", SINKS="*bf16")
# The tile loop's instructions printed per binary: all of them, and the arithmetic of a tile's
# softmax and fold (fp32 multiplies, adds, FMAs, exp2 and max) beside its wgmmas.
TILE_LOOP_OPS = ("instructions", "HGMMA", "FMUL", "FADD", "FFMA", "MUFU", "FMNMX")
INTS = ("T", "N_HEADS", "SPLIT_LEN", "SPLIT_PROGRAMS", "TILE_STRIDE", "stride_qt", "stride_qh", "stride_kb", "stride_ks",
        "stride_kh", "stride_vb", "stride_vs", "stride_vh", "stride_ot", "stride_oh")


def compile_attention(head_dim: int, mode: int, window: int = 0, group: int = 8) -> dict:
    """One binary as the engine launches it for bf16, GROUP query heads a KV head (Gemma 4's 8
    for 16 over 2), no block table: whole prefix tiles through TMA descriptors where the shape
    allows (`tree_attention.tma_shape`)."""
    cfg = ta.tile_config(head_dim)
    tma = ta.tma_shape(head_dim, ar=mode == 0)
    consts = dict(GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=16, BLOCK_M=ta.BLOCK_M, BLOCK_N=cfg.block_n,
                  MODE=mode, FLAT_TILES=ta.FLAT_TILES if mode in (1, 3) else 0, PAGED=False, PRECISION="tf32",
                  WINDOW=window, HAS_SINKS=False, V_SPLIT=cfg.v_split, TMA=tma, PDL=True)
    desc = f"tensordesc<bf16[{cfg.block_n},{head_dim}]>" if tma else "*bf16"
    sig = (dict(POINTERS) | dict(K_DESC=desc, V_DESC=desc) | {n: "i32" for n in INTS} | {"qk_scale": "fp32"}
           | {n: "constexpr" for n in consts})
    sig = {n: sig[n] for n in ta._tree_attn_kernel.arg_names}
    aligned = list(POINTERS) + [i for i in INTS if i.startswith("stride")]
    src = ASTSource(fn=ta._tree_attn_kernel, signature=sig, constexprs=consts,
                    attrs={(list(sig).index(n),): [["tt.divisibility", 16]] for n in aligned})
    stages = {0: cfg.ar_stages, 3: ta.TAIL_STAGES}.get(mode, cfg.stages)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(
        num_warps=cfg.num_warps, num_stages=stages, enable_fp_fusion=False, launch_pdl=True))
    loop = innermost_mma_loop(sass(kernel))
    return dict(head_dim=head_dim, mode=("AR", "TREE", "CHUNK", "TAIL")[mode], window=window, block_n=cfg.block_n,
                warps=cfg.num_warps, tma=tma, stages=stages, v_split=cfg.v_split, **resource_usage(kernel),
                tile_loop={op: loop.get(op, 0) for op in TILE_LOOP_OPS})


def compile_merge(head_dim: int, mode: int, capacity: int = 32768) -> dict:
    """The merge kernel for a cache of `capacity` keys, as the wrapper launches it
    (`tree_attention.merge_config`): TREE or CHUNK (one warp a row and head, blocks of split
    states loaded at once), or AR (its splits folded side by side, on AR_MERGE_WARPS warps)."""
    cfg = ta.tile_config(head_dim)
    split_len = ta.split_len_for(capacity)
    split_tiles = split_len // cfg.block_n
    ar = mode == 0
    merge = ta.merge_config(ar, -(-capacity // split_len), head_dim, split_tiles)
    consts = dict(HEAD_DIM=head_dim, BLOCK_N=cfg.block_n, SPLIT_TILES=split_tiles, MODE=mode,
                  FLAT_TILES=ta.FLAT_TILES if mode == 1 else 0, HAS_SINKS=False, **merge.constexprs(), PDL=True)
    pointers = dict(OUT="*bf16", CH_A="*fp32", CH_M="*fp32", CH_L="*fp32", TL_A="*fp32", TL_M="*fp32", TL_L="*fp32",
                    PREFIX="*i32", COUNT="*i32", SINKS="*bf16")
    ints = ("T", "N_HEADS", "stride_ot", "stride_oh")
    sig = dict(pointers) | {n: "i32" for n in ints} | {n: "constexpr" for n in consts}
    sig = {n: sig[n] for n in ta._merge_kernel.arg_names}
    aligned = list(pointers) + ["stride_ot", "stride_oh"]
    src = ASTSource(fn=ta._merge_kernel, signature=sig, constexprs=consts,
                    attrs={(list(sig).index(n),): [["tt.divisibility", 16]] for n in aligned})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(
        num_warps=merge.num_warps, enable_fp_fusion=False, launch_pdl=True,
        **({} if merge.max_registers is None else {"maxnreg": merge.max_registers})))
    return dict(head_dim=head_dim, kernel="merge", mode=("AR", "TREE", "CHUNK")[mode], split_tiles=split_tiles,
                splits_block=merge.splits_block, parts=merge.parts, tiles_block=merge.tiles_block,
                warps=merge.num_warps, **resource_usage(kernel))


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        for mode in (0, 1, 2, 3):  # AR, TREE, CHUNK, TAIL
            print(json.dumps(compile_attention(int(arg), mode)), flush=True)
        for mode in (1, 2, 0):  # TREE, CHUNK, AR
            print(json.dumps(compile_merge(int(arg), mode)), flush=True)

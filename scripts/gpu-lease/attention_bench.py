"""Paged tree attention alone (bf16, one layer call, CUDA-graphed): the batch-invariant kernel
against the previous one, on the Qwen3-8B and Qwen2.5-1.5B head shapes.

The previous kernel is not in the tree any more; pass its file (`git show e8dd760:kernels/tree_attention.py`,
its `from .reference` import made absolute) as --old to time it side by side (ratios from one run). Random tree masks
in topological order, shuffled pages, a block table of the engine's size (`--capacity`).

    python3 scripts/gpu-lease/attention_bench.py [--capacity 8448] [--old FILE] [--json-out FILE]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
from pathlib import Path

import torch

from jetspec_chat.engine.bench.timing import graphed_ms
from jetspec_chat.kernels import paged_tree_attention_triton, split_len_for, visible_keys

# (name, n_heads, n_kv, T, context, mask)
CASES = [("8b", 32, 8, t, c, "tree") for t, c in [(1, 1024), (1, 4096), (1, 16384), (16, 4096), (64, 4096),
                                                  (128, 1024), (128, 4096), (128, 16384), (256, 4096)]]
CASES += [("8b", 32, 8, 512, c, "causal") for c in (0, 3000)]
CASES += [("1.5b", 12, 2, t, c, "tree") for t, c in [(1, 512), (1, 2048), (16, 512), (64, 512), (64, 2048), (256, 512)]]


def load_old(path: str | None):
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location("jetspec_chat.kernels.old_tree_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tree_mask(t: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    if kind == "causal":
        return torch.ones(t, t, dtype=torch.bool).tril()
    mask = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):  # random tree, topological order, depth grows like a real draft tree
        mask[i, i] = True
        if i:
            mask[i] |= mask[int(torch.randint(max(0, i - 8), i, (), generator=gen))]
    return mask


def graphed_us(fn, reps: int = 30) -> float:
    return statistics.median(graphed_ms(fn, reps)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--capacity", type=int, default=8448, help="block table positions (the engine's cache size)")
    ap.add_argument("--old", default=None, help="the previous kernel's file, timed side by side")
    ap.add_argument("--json-out", default=os.path.join(os.environ.get("OUT", "."), "attention_bench.json"))
    args = ap.parse_args()
    old = load_old(args.old)
    gen = torch.Generator().manual_seed(0)
    block_size, d = 16, 128
    rows = []
    print(f"capacity {args.capacity}, split_len {split_len_for(args.capacity)}; µs per call (CUDA graph, median of 30)")
    print(f"{'shape':>5} {'T':>4} {'ctx':>6} {'mask':>6} {'new':>8} {'old':>8} {'new/old':>8}")
    for name, n_heads, n_kv, t, ctx, kind in CASES:
        cap = max(args.capacity, ctx + t + block_size)
        blocks = -(-cap // block_size)
        k_pool = torch.randn(blocks, block_size, n_kv, d, device="cuda", dtype=torch.bfloat16)
        v_pool = torch.randn_like(k_pool)
        table = torch.randperm(blocks, device="cuda").to(torch.int32)
        q = torch.randn(t, n_heads, d, device="cuda", dtype=torch.bfloat16)
        mask = tree_mask(t, kind, gen).cuda()
        prefix = torch.tensor([ctx], dtype=torch.int32, device="cuda")
        out = torch.empty_like(q)
        keys = visible_keys(mask)
        new_us = graphed_us(lambda: paged_tree_attention_triton(q, k_pool, v_pool, table, prefix, keys, d**-0.5, out=out))
        old_us = None
        if old is not None:
            packed = old.pack_tree_mask(mask)
            old_us = graphed_us(lambda: old.paged_tree_attention_triton(q, k_pool, v_pool, table, prefix, packed, d**-0.5, out=out))
        rows.append({"shape": name, "t": t, "context": ctx, "mask": kind, "new_us": new_us, "old_us": old_us})
        ratio = f"{new_us / old_us:8.2f}" if old_us else f"{'':>8}"
        print(f"{name:>5} {t:>4} {ctx:>6} {kind:>6} {new_us:8.1f} {old_us or 0:8.1f} {ratio}")
    Path(args.json_out).write_text(json.dumps({"capacity": args.capacity, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

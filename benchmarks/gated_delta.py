"""The Gated DeltaNet tree-walk kernel (kernels/gated_delta.py) alone, at a hybrid target's
linear-attention shape: one layer's launch over a draft-shaped tree of N nodes (the engine's
accum_logp builder on random draft log-probs), CUDA-graphed, against the bound of reading the
committed state once; the commit's one-lane walk; and the work (updates = the leaves' depths).

    python benchmarks/gated_delta.py                       # Qwen3.6-35B-A3B: 16 key / 32 value heads of 128
    python benchmarks/gated_delta.py --v-heads 48          # Qwen3.8-27B
    python benchmarks/gated_delta.py --shapes 32x4,16x1    # program shapes: value columns x warps

Needs a CUDA GPU. Prints one line per (nodes, program shape): µs per launch against one read of
the committed state, and the updates walked. The engine runs one shape (BLOCK_V x WARPS in
kernels/gated_delta.py) for every call: the bits depend on it.
"""
from __future__ import annotations

import argparse

import torch

from jetspec_chat.engine.tree import build_accum_logp
from jetspec_chat.kernels.gated_delta import gated_delta_path_triton, gated_delta_tree_triton, tree_walk


def timed_us(fn, reps: int = 50) -> float:
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * 10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k-heads", type=int, default=16)
    ap.add_argument("--v-heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--nodes", default="1,16,64,128,256")
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--depth", type=int, default=15)
    ap.add_argument("--shapes", default="32x4", help="program shapes to time: VALUE_COLUMNSxWARPS, comma-separated")
    args = ap.parse_args()
    dev = torch.device("cuda")
    hk, h, d = args.k_heads, args.v_heads, args.dim
    gen = torch.Generator().manual_seed(0)
    state = (torch.randn(h, d, d, generator=gen) * 0.1).to(dev)
    bw_probe = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    copy_us = timed_us(lambda: bw_probe.clone(), reps=5)
    gb_s = 2 * bw_probe.numel() / (copy_us * 1e-6) / 1e9
    state_read_us = state.numel() * 4 / (gb_s * 1e9) * 1e6
    print(f"{torch.cuda.get_device_name()}: copy {gb_s:.0f} GB/s; state {state.numel() * 4 >> 20} MiB a layer, "
          f"read once {state_read_us:.1f} µs")
    for n in (int(x) for x in args.nodes.split(",")):
        logp = torch.log_softmax(torch.randn(args.depth, 1000, generator=gen), dim=-1).to(dev)
        tree = build_accum_logp(torch.tensor(1, device=dev), logp, n, args.width) if n > 1 else None
        mask = tree.ancestors if tree is not None else torch.ones(1, 1, dtype=torch.bool, device=dev)
        t = mask.shape[0]
        mixed = torch.randn(t, 2 * hk * d + h * d, generator=gen).to(torch.bfloat16).to(dev)
        q = mixed[:, : hk * d].unflatten(-1, (hk, d))
        k = mixed[:, hk * d : 2 * hk * d].unflatten(-1, (hk, d))
        v = mixed[:, 2 * hk * d :].unflatten(-1, (h, d))
        g = -torch.rand(t, h, generator=gen).to(dev)
        beta = torch.rand(t, h, generator=gen).to(dev)
        walk = tree_walk(mask)
        updates = int(walk.length.sum())
        for shape in args.shapes.split(","):
            bv, warps = (int(x) for x in shape.split("x"))
            us = timed_us(lambda: gated_delta_tree_triton(q, k, v, g, beta, mask, state, walk, block_v=bv, warps=warps))
            print(f"nodes {t:4d}  {bv:3d} cols x {warps} warps: tree walk {us:8.1f} µs ({us / state_read_us:5.1f}× state read), "
                  f"{updates} updates ({updates / t:.2f} a node), depth {int(walk.length.max()) - 1}")
        deepest = int(walk.length.argmax())
        path = walk.order[deepest].long()
        count = walk.length[deepest]
        out = torch.empty_like(state)
        us = timed_us(lambda: gated_delta_path_triton(q, k, v, g, beta, path, count, state, out))
        print(f"nodes {t:4d}  commit of {int(count)} nodes: {us:8.1f} µs")


if __name__ == "__main__":
    main()

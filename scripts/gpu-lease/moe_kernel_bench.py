"""The fused MoE block alone at Qwen3-30B-A3B shapes (bf16, random weights), against its bytes bound.

Runs LAYERS distinct MoE layers back to back in one CUDA graph (each layer's output feeds the next,
so routing changes and no layer's experts sit in L2 from the last replay) and reports, per row
count T, the time per layer, the distinct experts actually touched (and the uniform-routing
expectation E * (1 - (1 - k/E)^T)), and the time over bytes-read / copy-bandwidth.
--sweep also times a few tile shapes (kernels/moe.py's module constants) to pick from.

    python scripts/gpu-lease/moe_kernel_bench.py [--rows 1,16,64,128,256] [--layers 8] [--sweep]
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import json

import torch
import torch.nn.functional as F

from jetspec_chat.kernels import moe_route_ref, moe_triton

# The module itself: the package also exports a function named `moe`, which attribute lookup finds.
moe_module = importlib.import_module("jetspec_chat.kernels.moe")

H, I, E, K = 2048, 768, 128, 8


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    src = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    return 2 * nbytes * 10 / (start.elapsed_time(end) * 1e-3)  # bytes/s, read + write


def graphed_ms(fn, reps: int = 20) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,16,64,128,256")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    torch.manual_seed(0)
    dt = torch.bfloat16
    layers = [
        (torch.randn(E, H, device="cuda", dtype=dt) * 0.02, torch.randn(E, 2 * I, H, device="cuda", dtype=dt) * 0.02,
         torch.randn(E, H, I, device="cuda", dtype=dt) * 0.02)
        for _ in range(args.layers)
    ]
    expert_bytes = 3 * I * H * 2
    router_bytes = E * H * 2
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bw / 1e9:.0f} GB/s; {args.layers} layers per graph")
    configs = [dict(GATE_UP_BLOCK_N=moe_module.GATE_UP_BLOCK_N, DOWN_BLOCK_N=moe_module.DOWN_BLOCK_N,
                    BLOCK_K=moe_module.BLOCK_K)]
    if args.sweep:
        configs += [dict(GATE_UP_BLOCK_N=g, DOWN_BLOCK_N=d, BLOCK_K=k)
                    for g, d, k in itertools.product((32, 64), (64, 128), (64, 128)) if dict(GATE_UP_BLOCK_N=g, DOWN_BLOCK_N=d, BLOCK_K=k) != configs[0]]
    results = []
    for cfg in configs:
        for name, value in cfg.items():
            setattr(moe_module, name, value)
        for t in rows:
            x0 = torch.randn(t, H, device="cuda", dtype=dt)
            xs = [x0]
            for r, gu, d in layers:  # the inputs each layer sees in the graph, for the expert count
                xs.append(moe_triton(xs[-1], r, gu, d, K, True) * 30 + x0)
            touched = [int(moe_route_ref(x, r, K, True)[1].unique().numel()) for x, (r, _, _) in zip(xs, layers)]

            def chain():
                x = x0
                for r, gu, d in layers:
                    x = moe_triton(x, r, gu, d, K, True) * 30 + x0  # rescaled so the routing stays spread
                return x

            ms = graphed_ms(chain) / args.layers
            actual = sum(touched) / len(touched)
            expected = E * (1 - (1 - K / E) ** t)
            bound_ms = (actual * expert_bytes + router_bytes) / bw * 1e3
            expected_bound_ms = (expected * expert_bytes + router_bytes) / bw * 1e3
            row = dict(cfg, rows=t, ms_per_layer=round(ms, 4), experts_touched=actual, experts_expected=round(expected, 1),
                       bound_ms=round(bound_ms, 4), over_bound=round(ms / bound_ms, 2),
                       over_expected_bound=round(ms / expected_bound_ms, 2))
            results.append(row)
            print(json.dumps(row))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), copy_gb_s=bw / 1e9, results=results), f, indent=1)


if __name__ == "__main__":
    main()

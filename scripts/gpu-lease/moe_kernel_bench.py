"""The fused MoE block alone at Qwen3-30B-A3B shapes (bf16, random weights), against its bytes bound.

Runs LAYERS distinct MoE layers back to back in one CUDA graph (each layer's output feeds the next,
so routing changes and no layer's experts sit in L2 from the last replay) and reports, per row
count T, the time per layer, the distinct experts actually touched (and the uniform-routing
expectation E * (1 - (1 - k/E)^T)), the time over bytes-read / copy-bandwidth, and whether a
token's output alone equals its output among the T rows bitwise (batch invariance).

--old FILE: a previous kernels/moe.py (e.g. `git show 75853a5:kernels/moe.py > /tmp/old_moe.py`:
size-class tiles, CUDA-core GEMVs at few rows, not batch-invariant), timed side by side with its
own tile choice. --sweep: also times candidate tiles (kernels/moe.py's MoeTile) at every row count
and prints the best one as the TILE line to paste (~1-2 min more, --budget-s caps it). Without
--sweep the run takes well under 90 s on an H200 (compiles included).

    python scripts/gpu-lease/moe_kernel_bench.py [--rows 1,16,64,128,256] [--layers 8] [--old FILE] [--sweep]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time

import torch

from jetspec_chat.engine.bench.timing import graphed_ms, measure_copy_bandwidth
from jetspec_chat.kernels import moe_block_triton, moe_experts_ref, moe_route_ref, moe_route_triton
from jetspec_chat.kernels.moe import TILE, MoeTile, router_logits

H, I, E, K = 2048, 768, 128, 8

# Candidates for the one tile (BLOCK_M is 16 for all): N widths, K step, warps, stages.
CANDIDATES = [
    MoeTile(gate_up_n=16, down_n=32, block_k=128, num_warps=4, num_stages=4),
    MoeTile(gate_up_n=32, down_n=64, block_k=128, num_warps=4, num_stages=3),
    MoeTile(gate_up_n=32, down_n=32, block_k=64, num_warps=4, num_stages=4),
    MoeTile(gate_up_n=16, down_n=16, block_k=256, num_warps=4, num_stages=3),
    MoeTile(gate_up_n=64, down_n=64, block_k=64, num_warps=4, num_stages=4),
    MoeTile(gate_up_n=64, down_n=128, block_k=64, num_warps=8, num_stages=3),
]


def load_old(path: str | None):
    """A previous kernels/moe.py as module jetspec_chat.kernels.old_moe (its relative imports
    resolve inside the package)."""
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location("jetspec_chat.kernels.old_moe", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,16,64,128,256")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--old", default=None, help="a previous kernels/moe.py, timed side by side")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--json-out", default=None)
    p.add_argument("--budget-s", type=float, default=150.0, help="stop trying sweep candidates after this many seconds")
    args = p.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    old = load_old(args.old)
    torch.manual_seed(0)
    dt = torch.bfloat16
    layers = [
        (torch.randn(E, H, device="cuda", dtype=dt) * 0.02, torch.randn(E, 2 * I, H, device="cuda", dtype=dt) * 0.02,
         torch.randn(E, H, I, device="cuda", dtype=dt) * 0.02)
        for _ in range(args.layers)
    ]
    expert_bytes = 3 * I * H * 2
    router_bytes = E * H * 2
    bw = measure_copy_bandwidth(torch.device("cuda"), 1 << 30, 3, 10)[1] * 1e9  # bytes/s
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bw / 1e9:.0f} GB/s; {args.layers} layers per graph; TILE {TILE}")
    started = time.perf_counter()
    variants = [("new", lambda x, r, gu, d, tile=TILE: moe_block_triton(x, r, gu, d, K, True, tile=tile))]
    if old is not None:
        variants.append(("old", lambda x, r, gu, d, tile=None: old.moe_block_triton(x, r, gu, d, K, True)))
    results, sweep = [], {}
    for t in rows:
        x0 = torch.randn(t, H, device="cuda", dtype=dt)
        xs = [x0]
        for r, gu, d in layers:  # the inputs each layer sees in the graph, for the expert count
            xs.append(moe_block_triton(xs[-1], r, gu, d, K, True) * 30 + x0)
        touched = [int(moe_route_ref(x, r, K, True)[1].unique().numel()) for x, (r, _, _) in zip(xs, layers)]
        actual = sum(touched) / len(touched)
        expected = E * (1 - (1 - K / E) ** t)
        bound_ms = (actual * expert_bytes + router_bytes) / bw * 1e3
        r0, gu0, d0 = layers[0]
        routing = moe_route_triton(router_logits(x0, r0), K, True, dt)
        want = moe_experts_ref(x0, gu0, d0, routing.weights, routing.ids.long()).float()
        row = dict(rows=t, experts_touched=actual, experts_expected=round(expected, 1), bound_ms=round(bound_ms, 4))
        for name, block in variants:
            tiles = [TILE] + ([c for c in CANDIDATES if c != TILE] if args.sweep and name == "new" else [])
            for tile in tiles:
                if tile is not TILE and time.perf_counter() - started > args.budget_s:
                    continue

                def chain(tile=tile, block=block):
                    x = x0
                    for r, gu, d in layers:
                        x = block(x, r, gu, d, tile=tile) * 30 + x0  # rescaled: routing stays spread
                    return x

                # the answer on one layer against the plain-torch experts on the same routing
                # (bf16 tolerance, as tests/kernels/test_moe_kernel.py), bitwise invariance of
                # the first and last tokens, then the time
                got = block(x0, r0, gu0, d0, tile=tile)
                close = torch.allclose(got.float(), want, rtol=2e-2, atol=2e-2)
                invariant = all(torch.equal(block(x0[i:i + 1], r0, gu0, d0, tile=tile)[0], got[i]) for i in {0, t - 1})
                ms = statistics.median(graphed_ms(chain, 20)) / args.layers
                if tile is TILE:
                    row[name] = dict(ms_per_layer=round(ms, 4), over_bound=round(ms / bound_ms, 2), close=close, invariant=invariant)
                if args.sweep and name == "new":
                    sweep.setdefault(repr(tile), {})[t] = round(ms / bound_ms, 3)
                    print(f"  rows {t:4d} {tile}: {ms * 1e3:7.1f} us/layer, {ms / bound_ms:.2f}x bound, close {close}, invariant {invariant}")
        results.append(row)
        print(json.dumps(row))
    print(f"--- {time.perf_counter() - started:.0f} s; per layer (us), x bound:")
    print(f"{'rows':>5} {'experts':>8} {'bound':>8} {'new':>8} {'x':>6}" + (f" {'old':>8} {'x':>6} {'new/old':>8}" if old else ""))
    for row in results:
        line = f"{row['rows']:5d} {row['experts_touched']:8.1f} {row['bound_ms'] * 1e3:8.1f} {row['new']['ms_per_layer'] * 1e3:8.1f} {row['new']['over_bound']:6.2f}"
        if old:
            line += f" {row['old']['ms_per_layer'] * 1e3:8.1f} {row['old']['over_bound']:6.2f} {row['new']['ms_per_layer'] / row['old']['ms_per_layer']:8.2f}"
        print(line + f"  close {row['new']['close']} invariant {row['new']['invariant']}" + (f" (old {row['old']['invariant']})" if old else ""))
    if sweep:
        # the tile with the lowest mean x-bound over the row counts it ran at all of
        complete = {k: v for k, v in sweep.items() if len(v) == len(rows)}
        for tile, ratios in sorted(complete.items(), key=lambda kv: statistics.mean(kv[1].values())):
            print(f"mean {statistics.mean(ratios.values()):.3f}x bound: {tile}  {ratios}")
        if complete:
            print("TILE for kernels/moe.py:", min(complete, key=lambda k: statistics.mean(complete[k].values())))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), copy_gb_s=bw / 1e9, tile=repr(TILE), results=results,
                           sweep=sweep), f, indent=1)


if __name__ == "__main__":
    main()

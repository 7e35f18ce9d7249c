"""The fused MoE block alone at Qwen3-30B-A3B shapes (bf16, random weights), against its bytes bound.

Runs LAYERS distinct MoE layers back to back in one CUDA graph (each layer's output feeds the next,
so routing changes and no layer's experts sit in L2 from the last replay) and reports, per row
count T, the time per layer, the distinct experts actually touched (and the uniform-routing
expectation E * (1 - (1 - k/E)^T)), and the time over bytes-read / copy-bandwidth.
--sweep also times, per row count, a few candidate tiles (kernels/moe.py's MoeTile: GEMV or tensor
cores, block_m, the two BLOCK_Ns, BLOCK_K, warps, stages) in that row count's size class of
moe.TILES, prints the best with its x-bound and the TILES table to paste, and writes it all to
--json-out. ~22 candidates over the 5 default row counts (~2-3 min on an H200, compiles included);
a candidate that fails (compile error, out of resources, a result off the torch reference) is reported and skipped.

    python scripts/gpu-lease/moe_kernel_bench.py [--rows 1,16,64,128,256] [--layers 8] [--sweep]
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time
import traceback

import torch
import torch.nn.functional as F

from jetspec_chat.engine.bench.timing import graphed_ms, measure_copy_bandwidth
from jetspec_chat.kernels import moe_block_triton, moe_experts_ref, moe_route_ref, moe_route_triton
from jetspec_chat.kernels.moe import TILES, MoeTile, choose_tile

# The module itself, whose tile constants --sweep sets (the package re-exports only its functions).
moe_module = importlib.import_module("jetspec_chat.kernels.moe")

H, I, E, K = 2048, 768, 128, 8


def gemv(block_m, gate_up_n, down_n, block_k, warps=4, stages=3) -> MoeTile:
    return MoeTile(dot=False, block_m=block_m, gate_up_n=gate_up_n, down_n=down_n, block_k=block_k,
                   num_warps=warps, num_stages=stages)


def dot(block_m, gate_up_n, down_n, block_k, warps=4, stages=3) -> MoeTile:
    return MoeTile(dot=True, block_m=block_m, gate_up_n=gate_up_n, down_n=down_n, block_k=block_k,
                   num_warps=warps, num_stages=stages)


# Candidates per size class (index into moe.TILES), beside the table's own tile; 20 in all. Small
# classes: weights only, so GEMVs with long coalesced K rows, small per-thread tiles (registers in
# brackets: sm_90 cubins, gate_up/down) and enough programs to fill 132 SMs; one tensor-core tile as
# the baseline. Large classes: tensor-core tiles, bigger N and M, more warps.
CANDIDATES: dict[int, list[MoeTile]] = {
    0: [gemv(1, 4, 8, 256), gemv(1, 8, 16, 128), gemv(2, 8, 16, 256, 8), gemv(1, 16, 32, 256, 8)],  # 48/40 56/48 100/80 100/200
    1: [gemv(2, 8, 16, 256, 8), gemv(2, 8, 16, 128), gemv(1, 8, 16, 256), dot(16, 32, 32, 64)],  # 100/80 80/128 72/95 128/126
    2: [gemv(4, 8, 16, 128, 8), gemv(8, 8, 16, 64, 8), dot(16, 32, 32, 64), dot(16, 64, 64, 64, 8)],  # 98/127 80/126 128/126 106/120
    3: [dot(16, 64, 64, 64, 8), dot(32, 64, 64, 64, 8), dot(16, 32, 32, 64), dot(16, 32, 64, 128, 8)],  # 106/120 128/128 128/126 128/228
    4: [dot(32, 64, 64, 64, 8), dot(64, 64, 64, 64, 8), dot(16, 64, 64, 64, 8), dot(64, 64, 128, 64, 8, 4)],  # 128/128 182/188 106/120 182/254
}


def size_class(assignments: int) -> int:
    return next(i for i, (bound, _) in enumerate(TILES) if assignments <= bound)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,16,64,128,256")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--json-out", default=None)
    p.add_argument("--budget-s", type=float, default=190.0,
                   help="stop trying sweep candidates after this many seconds (the table tiles still run)")
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
    bw = measure_copy_bandwidth(torch.device("cuda"), 1 << 30, 3, 10)[1] * 1e9  # bytes/s
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bw / 1e9:.0f} GB/s; {args.layers} layers per graph")
    started = time.perf_counter()
    results, best, failed = [], {}, []
    for t in rows:
        x0 = torch.randn(t, H, device="cuda", dtype=dt)
        xs = [x0]
        for r, gu, d in layers:  # the inputs each layer sees in the graph (default tiles), for the expert count
            xs.append(moe_block_triton(xs[-1], r, gu, d, K, True) * 30 + x0)
        touched = [int(moe_route_ref(x, r, K, True)[1].unique().numel()) for x, (r, _, _) in zip(xs, layers)]
        actual = sum(touched) / len(touched)
        expected = E * (1 - (1 - K / E) ** t)
        bound_ms = (actual * expert_bytes + router_bytes) / bw * 1e3
        expected_bound_ms = (expected * expert_bytes + router_bytes) / bw * 1e3
        r0, gu0, d0 = layers[0]
        w0, ids0 = moe_route_triton(F.linear(x0, r0), K, True, dt)
        want = moe_experts_ref(x0, gu0, d0, w0, ids0.long()).float()
        cls = size_class(t * K)
        tiles = [choose_tile(t * K)]
        if args.sweep:
            tiles += [c for c in CANDIDATES.get(cls, []) if c != tiles[0]]
        for tile in tiles:
            if tile is not tiles[0] and time.perf_counter() - started > args.budget_s:
                failed.append(dict(rows=t, tile=vars(tile), error="skipped: --budget-s spent"))
                print(json.dumps(dict(rows=t, tile=vars(tile), skipped="--budget-s spent")))
                continue

            def chain(tile=tile):
                x = x0
                for r, gu, d in layers:
                    x = moe_block_triton(x, r, gu, d, K, True, tile=tile) * 30 + x0  # rescaled: routing stays spread
                return x

            try:
                # first the tile's answer on one layer against the plain-torch experts on the same
                # routing (bf16 tolerance, as tests/kernels/test_moe_kernel.py), then its time
                got = moe_block_triton(x0, r0, gu0, d0, K, True, tile=tile).float()
                torch.cuda.synchronize()
                if not torch.allclose(got, want, rtol=2e-2, atol=2e-2):
                    raise AssertionError(f"differs from moe_experts_ref: max |diff| {(got - want).abs().max():.3g}")
                ms = statistics.median(graphed_ms(chain, 20)) / args.layers
            except Exception as err:  # noqa: BLE001 - one bad candidate must not end the sweep
                torch.cuda.synchronize()
                msg = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
                failed.append(dict(rows=t, tile=vars(tile), error=msg))
                print(json.dumps(dict(rows=t, tile=vars(tile), failed=msg)))
                if tile == tiles[0]:
                    traceback.print_exc()
                continue
            row = dict(rows=t, size_class=cls, tile=vars(tile), ms_per_layer=round(ms, 4), experts_touched=actual,
                       experts_expected=round(expected, 1), bound_ms=round(bound_ms, 4), over_bound=round(ms / bound_ms, 2),
                       over_expected_bound=round(ms / expected_bound_ms, 2))
            results.append(row)
            print(json.dumps(row))
            if t not in best or row["ms_per_layer"] < best[t]["ms_per_layer"]:
                best[t] = row
    print(f"--- {time.perf_counter() - started:.0f} s; best per row count:")
    for t, row in best.items():
        print(f"rows {t:5d} (class {row['size_class']}): {row['ms_per_layer'] * 1e3:7.1f} us/layer, "
              f"{row['over_bound']:.2f}x bound ({row['over_expected_bound']:.2f}x expected) {row['tile']}")
    # the table with each class's winner (of the largest row count in it, if several)
    table = list(TILES)
    for t, row in sorted(best.items()):
        table[row["size_class"]] = (table[row["size_class"]][0], MoeTile(**row["tile"]))
    print("TILES for kernels/moe.py:")
    for bound, tile in table:
        print(f"    ({bound if bound < 1 << 40 else '1 << 62'}, {tile!r}),")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), copy_gb_s=bw / 1e9, results=results,
                           best={str(t): row for t, row in best.items()}, failed=failed,
                           tiles=[[bound, vars(tile)] for bound, tile in table]), f, indent=1)


if __name__ == "__main__":
    main()

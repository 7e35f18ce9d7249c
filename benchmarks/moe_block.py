"""The fused MoE block alone at Qwen3-30B-A3B shapes (bf16, random weights), against its bytes bound.

Runs LAYERS distinct MoE layers back to back in one CUDA graph (each layer's output feeds the next,
so routing changes and no layer's experts sit in L2 from the last replay) and reports, per row
count T and variant, the time per layer, the distinct experts actually touched (and the
uniform-routing expectation E * (1 - (1 - k/E)^T)), the time over bytes-read / copy-bandwidth,
whether the answer is close to the plain-torch experts, and whether it is batch-invariant: the
first and last of the T tokens computed alone, among the T, and among 256 tokens (the grouped
path) give the same bits.

Variants: `new` (kernels/moe.py's TILE: the per-token down + combine up to TILE.token_rows
tokens), `grouped` (the same kernels with token_rows = 0: grouped down + combine at every row
count), and with --old FILE a previous kernels/moe.py (e.g. `git show b8bab39:kernels/moe.py >
old_moe.py`: the first fused version, 6 launches at one row), timed in the same process.

With --old, `new == old bitwise` per row count: TILE keeps the first version's block_k, and the
routing fold and the per-token down change no bit, so it should read True everywhere.

Then the kernels of one layer at 1, 4, 16 and 256 rows, from the profiler (device time per launch, no
gaps): where the time over the bound goes.

--sweep: (1) the per-token down's knobs (token_n, token_warps, token_stages) at rows <= 4;
(2) the crossover: per-token vs grouped at 1, 2, 4, 8, 16 rows -> token_rows; (3) the grouped
tiles (as first tuned) at every row count; prints the TILE line to paste into kernels/moe.py
(~1-2 min more, --budget-s caps it).

--tiny: tiny shapes on the CPU (TRITON_INTERPRET=1) or GPU, wall-clock timing, no graphs: a
smoke test of this script, its numbers mean nothing (under the interpreter `invariant` may read
False: numpy's matmul sums tiles of other widths differently; the tests patch it, see
tests/kernels/test_moe_kernel.py).

    python benchmarks/moe_block.py [--rows 1,2,4,16,64,128,256] [--layers 8] [--old FILE] [--sweep]
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from jetspec_chat.bench.timing import graphed_ms, measure_copy_bandwidth, time_fn
from jetspec_chat.kernels import moe_block_triton, moe_experts_ref, moe_route_ref, moe_route_triton
from jetspec_chat.kernels.moe import TILE, MoeTile, router_logits

BIG = 256  # rows of the call each token's bits are compared with (the grouped path)

# (1) the per-token down: hidden columns per slot (x k slots per tl.dot), warps, pipeline depth
TOKEN_KNOBS = [(16, 4, 3), (16, 4, 4), (16, 4, 6), (16, 8, 4), (32, 4, 2), (32, 4, 3), (32, 8, 3), (64, 8, 2)]
# (2) row counts for the per-token vs grouped crossover (token_rows: the last where per-token wins)
CROSSOVER_ROWS = [1, 2, 4, 8, 16]
# (3) the grouped tiles (BLOCK_M is 16 for all): N widths, K step, warps, stages. block_k also
# sets the per-token down's K steps (the two paths share it: the bits of every row count).
# Deeper pipelines first: at one row a gate_up program keeps (stages - 1) x 16 KB in flight,
# 192 programs ~6 MB at 3 stages, about what 4.8 TB/s x ~1.3 us of loaded latency needs.
GROUPED_TILES = [
    (32, 64, 128, 4, 3),
    (32, 64, 128, 4, 4),
    (32, 64, 128, 4, 5),
    (32, 64, 128, 4, 6),
    (16, 64, 128, 4, 4),
    (16, 64, 128, 4, 6),
    (64, 64, 128, 8, 4),
    (32, 32, 64, 4, 6),
]


@dataclass
class Problem:
    """The shapes, the layers' weights and the input rows (row counts take the first T)."""

    hidden: int
    inter: int
    experts: int
    top_k: int
    layers: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    x: torch.Tensor  # [max(rows, BIG), H]
    bandwidth: float  # bytes/s
    graphs: bool  # CUDA graphs and CUDA events (else wall clock: --tiny on the CPU)

    @property
    def expert_bytes(self) -> int:
        return 3 * self.inter * self.hidden * self.x.element_size()

    @property
    def router_bytes(self) -> int:
        return self.experts * self.hidden * self.x.element_size()


Block = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


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


def tile_block(tile: MoeTile, top_k: int) -> Block:
    return lambda x, r, gu, d: moe_block_triton(x, r, gu, d, top_k, True, tile=tile)


def bound_ms(p: Problem, t: int) -> tuple[float, float]:
    """(expert-bytes bound in ms, experts touched per layer) for the graph's inputs at T rows."""
    xs = [p.x[:t]]
    for r, gu, d in p.layers:  # the inputs each layer sees in the graph, for the expert count
        xs.append(moe_block_triton(xs[-1], r, gu, d, p.top_k, True) + p.x[:t])
    touched = [int(moe_route_ref(x, r, p.top_k, True)[1].unique().numel()) for x, (r, _, _) in zip(xs, p.layers)]
    actual = sum(touched) / len(touched)
    return (actual * p.expert_bytes + p.router_bytes) / p.bandwidth * 1e3, actual


def time_layer(p: Problem, block: Block, t: int, reps: int = 20) -> float:
    """Median ms per layer of the layers chained in one graph (each output plus the first
    input is the next layer's input, as a residual would be; an earlier version rescaled the output by 30,
    which overflowed to NaN within 8 layers and emptied those layers' routing)."""
    x0 = p.x[:t]

    def chain():
        x = x0
        for r, gu, d in p.layers:
            x = block(x, r, gu, d) + x0
        return x

    samples = graphed_ms(chain, reps) if p.graphs else time_fn(chain, 1, 3, x0.device)
    return statistics.median(samples) / len(p.layers)


def check(p: Problem, block: Block, t: int, big: torch.Tensor) -> tuple[bool, bool]:
    """(close, invariant) on the first layer: the answer against the plain-torch experts on the
    same routing (bf16 tolerance, as tests/kernels/test_moe_kernel.py), and the first and last
    token alone == among the T == among BIG rows (`big`: the block on BIG rows), bitwise."""
    r, gu, d = p.layers[0]
    x0 = p.x[:t]
    routing = moe_route_triton(router_logits(x0, r), p.top_k, True, x0.dtype)
    want = moe_experts_ref(x0, gu, d, routing.weights, routing.ids.long()).float()
    got = block(x0, r, gu, d)
    close = torch.allclose(got.float(), want, rtol=2e-2, atol=2e-2)
    invariant = all(torch.equal(block(x0[i:i + 1], r, gu, d)[0], got[i]) and torch.equal(got[i], big[i]) for i in {0, t - 1})
    return close, invariant


def measure(p: Problem, block: Block, t: int, bound: float, big: torch.Tensor) -> dict:
    close, invariant = check(p, block, t, big)
    ms = time_layer(p, block, t)
    return dict(us=round(ms * 1e3, 2), x_bound=round(ms / bound, 3), close=close, invariant=invariant)


def big_of(p: Problem, block: Block) -> torch.Tensor:
    r, gu, d = p.layers[0]
    return block(p.x[:BIG], r, gu, d)


def profile_launches(p: Problem, block: Block, t: int) -> list[tuple[str, float]]:
    """(kernel, device us) of one layer's launches at T rows, in launch order (profiler, eager)."""
    from torch.profiler import ProfilerActivity, profile

    r, gu, d = p.layers[0]
    x0 = p.x[:t]
    for _ in range(3):
        block(x0, r, gu, d)
    torch.cuda.synchronize()
    reps = 20
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            block(x0, r, gu, d)
        torch.cuda.synchronize()
    order: dict[str, list[float]] = {}
    for ev in prof.events():
        if ev.device_type.name == "CUDA" and ev.device_time > 0:
            order.setdefault(ev.name, []).append(ev.device_time)
    return [(name, statistics.median(us)) for name, us in order.items()]


def print_breakdown(p: Problem, variants: dict[str, Block]) -> None:
    for t in (1, 4, 16, 256):
        bound, _ = bound_ms(p, t)
        for name, block in variants.items():
            try:
                launches = profile_launches(p, block, t)
            except Exception as exc:  # the profiler is a diagnostic; the table above stands without it
                print(f"  profiler unavailable: {exc!r}")
                return
            total = sum(us for _, us in launches)
            parts = ", ".join(f"{kernel.split('(')[0][:28]} {us:.1f}" for kernel, us in launches)
            print(f"rows {t} {name:8s}: {len(launches)} launches, {total:.1f} us of kernels (bound {bound * 1e3:.1f}): {parts}")


def sweep(p: Problem, rows: list[int], budget_s: float, started: float) -> dict[str, dict]:
    """The three sweeps of the module docstring; prints each result and the TILE line. Returns
    every measurement by label."""
    def in_budget() -> bool:
        return time.perf_counter() - started < budget_s

    bounds = {t: bound_ms(p, t)[0] for t in sorted(set(rows) | set(CROSSOVER_ROWS))}
    results: dict[str, dict] = {}

    def run(tile: MoeTile, ts: list[int], label: str) -> dict[int, float] | None:
        """x bound per row count, or None when the budget ran out first."""
        if not in_budget():
            print(f"  (budget spent: {label} skipped)")
            return None
        block = tile_block(tile, p.top_k)
        big = big_of(p, block)
        ratios = {}
        for t in ts:
            if not in_budget():
                print(f"  (budget spent: {label} skipped from rows {t})")
                return None
            m = measure(p, block, t, bounds[t], big)
            ratios[t] = m["x_bound"]
            print(f"  {label} rows {t:4d}: {m['us']:7.1f} us/layer, {m['x_bound']:.2f}x bound, close {m['close']}, invariant {m['invariant']}")
            results[f"{label} {t}"] = m
        return ratios

    # (1) per-token knobs at the rows it runs at
    small = [t for t in rows if t <= 4] or [1]
    best_knobs, best_mean = (TILE.token_n, TILE.token_warps, TILE.token_stages), None
    for n, warps, stages in TOKEN_KNOBS:
        tile = dataclasses.replace(TILE, token_rows=max(small), token_n=n, token_warps=warps, token_stages=stages)
        ratios = run(tile, small, f"token_n {n:3d} warps {warps} stages {stages}")
        if ratios:
            mean = statistics.mean(ratios.values())
            if best_mean is None or mean < best_mean:
                best_knobs, best_mean = (n, warps, stages), mean
    n, warps, stages = best_knobs
    print(f"per-token down: token_n={n}, token_warps={warps}, token_stages={stages} (mean {best_mean}x bound at rows {small})")

    # (2) crossover: the largest T up to which the per-token down is never slower
    token_tile = dataclasses.replace(TILE, token_rows=max(CROSSOVER_ROWS), token_n=n, token_warps=warps, token_stages=stages)
    per_token = run(token_tile, CROSSOVER_ROWS, "crossover per-token")
    grouped = run(dataclasses.replace(token_tile, token_rows=0), CROSSOVER_ROWS, "crossover grouped  ")
    if per_token and grouped:
        token_rows = 0
        for t in CROSSOVER_ROWS:
            if per_token[t] > grouped[t]:
                break
            token_rows = t
        print(f"token_rows={token_rows} (x bound, per-token vs grouped: "
              + ", ".join(f"{t}: {per_token[t]} vs {grouped[t]}" for t in CROSSOVER_ROWS) + ")")
    else:
        token_rows = TILE.token_rows
        print(f"token_rows={token_rows}: TILE's (crossover not measured)")

    # (3) grouped tiles at every row count, with the per-token knobs above
    means = {}
    for gate_up_n, down_n, block_k, nw, ns in GROUPED_TILES:
        tile = MoeTile(gate_up_n=gate_up_n, down_n=down_n, block_k=block_k, num_warps=nw, num_stages=ns,
                       token_rows=token_rows, token_n=n, token_warps=warps, token_stages=stages)
        ratios = run(tile, rows, repr(tile))
        if ratios:
            means[tile] = statistics.mean(ratios.values())
    for tile, mean in sorted(means.items(), key=lambda kv: kv[1]):
        print(f"mean {mean:.3f}x bound: {tile}")
    if means:
        best = min(means, key=means.get)
        print("TILE for kernels/moe.py:", best)
    return results


def make_problem(args) -> Problem:
    if args.tiny:
        hidden, inter, experts, top_k = 64, 32, 16, 4
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        hidden, inter, experts, top_k = 2048, 768, 128, 8
        device = torch.device("cuda")
    torch.manual_seed(0)
    dt = torch.bfloat16
    layers = [
        (torch.randn(experts, hidden, device=device, dtype=dt) * 0.02,
         torch.randn(experts, 2 * inter, hidden, device=device, dtype=dt) * 0.02,
         torch.randn(experts, hidden, inter, device=device, dtype=dt) * 0.02)
        for _ in range(args.layers)
    ]
    rows = max(BIG, *args.rows)
    x = torch.randn(rows, hidden, device=device, dtype=dt)
    if device.type == "cuda" and not args.tiny:
        bw = measure_copy_bandwidth(device, 1 << 30, 3, 10)[1] * 1e9
    else:
        bw = 1e11  # nominal: --tiny's numbers mean nothing
    return Problem(hidden, inter, experts, top_k, layers, x, bw, graphs=device.type == "cuda" and not args.tiny)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,2,4,16,64,128,256")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--old", default=None, help="a previous kernels/moe.py, timed side by side")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--tiny", action="store_true", help="tiny shapes, wall clock: a smoke test (also under TRITON_INTERPRET=1)")
    p.add_argument("--json-out", default=None)
    p.add_argument("--budget-s", type=float, default=240.0, help="stop sweeping after this many seconds")
    args = p.parse_args()
    args.rows = [int(r) for r in args.rows.split(",")]
    if args.tiny:
        args.layers = min(args.layers, 2)
    prob = make_problem(args)
    old = load_old(args.old)
    device_name = torch.cuda.get_device_name() if prob.x.is_cuda else "cpu"
    print(f"{device_name}: copy bandwidth {prob.bandwidth / 1e9:.0f} GB/s; {args.layers} layers per graph; TILE {TILE}")
    started = time.perf_counter()
    variants: dict[str, Block] = {"new": tile_block(TILE, prob.top_k),
                                  "grouped": tile_block(dataclasses.replace(TILE, token_rows=0), prob.top_k)}
    if old is not None:
        variants["old"] = lambda x, r, gu, d: old.moe_block_triton(x, r, gu, d, prob.top_k, True)
    bigs = {name: big_of(prob, block) for name, block in variants.items()}
    results = []
    for t in args.rows:
        bound, touched = bound_ms(prob, t)
        row = dict(rows=t, experts_touched=touched, experts_expected=round(prob.experts * (1 - (1 - prob.top_k / prob.experts) ** t), 1),
                   bound_us=round(bound * 1e3, 2))
        for name, block in variants.items():
            row[name] = measure(prob, block, t, bound, bigs[name])
        if old is not None:  # the same block_k as the first version: the same bits expected at every row count
            r, gu, d = prob.layers[0]
            row["new_equals_old"] = torch.equal(variants["new"](prob.x[:t], r, gu, d), variants["old"](prob.x[:t], r, gu, d))
        results.append(row)
        print(json.dumps(row))
    print(f"--- {time.perf_counter() - started:.0f} s; per layer (us), x the expert-bytes bound; "
          "invariant: first/last token alone == among T == among 256 rows")
    print(f"{'rows':>5} {'experts':>8} {'bound':>7}" + "".join(f" {n:>9} {'x':>5}" for n in variants)
          + (f" {'new/old':>8}" if old else ""))
    for row in results:
        line = f"{row['rows']:5d} {row['experts_touched']:8.1f} {row['bound_us']:7.1f}"
        line += "".join(f" {row[n]['us']:9.1f} {row[n]['x_bound']:5.2f}" for n in variants)
        if old:
            line += f" {row['new']['us'] / row['old']['us']:8.2f}"
        print(line + "  " + " ".join(f"{n}: close {row[n]['close']} invariant {row[n]['invariant']}" for n in variants)
              + (f"  new == old bitwise {row['new_equals_old']}" if old else ""))
    if prob.graphs:
        print("--- kernels of one layer (profiler, device us each, eager launches):")
        print_breakdown(prob, variants)
    swept = sweep(prob, args.rows, args.budget_s, time.perf_counter()) if args.sweep else None
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(dict(device=device_name, copy_gb_s=prob.bandwidth / 1e9, tile=repr(TILE), results=results, sweep=swept), f, indent=1)


if __name__ == "__main__":
    main()

"""The batch-invariant linear (kernels/matmul.py) against F.linear (cuBLAS) at Qwen2.5-0.5B / 1.5B,
Qwen3-8B and Qwen3-30B-A3B (its dense linears) shapes, bf16, M = 1, 16, 64, 128, 256.

Timing: µs per call inside a CUDA graph that calls the linear once on each of C copies of the
weight (C x weight >= 128 MB, so every call streams its weight from HBM as a decode step does,
not from the 50 MB L2); CUDA events around each replay, median of 25 replays (after 3 warm-up
replays), divided by C. x stays the same (activations live in L2 in the real model too).
GB/s at M=1 = (weight + x + y bytes) / time. `inv`: bitwise M-invariance, i.e. ours(x[:m]) equals
the first m rows of ours(x[:256]) for every m, and single rows 0, 100, 255 alone; the same check
for cuBLAS is shown beside it. `err`: |y - exact| / |exact| (Frobenius, exact = fp32 arithmetic)
for ours and for cuBLAS. `64-row µs` (M > 64, where `block_m_for` picks 128-row programs): the
same GEMM with 64-row programs, the faster of its split and fused launches (the first batch-invariant kernel).
(An earlier version also timed a gate_up GEMM with SiLU*up in its epilogue here: slower at every M, dropped;
docs/performance.md.)

--sweep also times, per shape, a handful of candidate configs (block_n, block_k, K groups,
warps, stages) at every M, each with both launches (split over K groups, groups summed in-kernel, and
fused) where it has more than one group, and checks each candidate's M-invariance and whether
it gives the table config's bits (`=tbl`: expected where block_k and the groups match); a split
launch is timed without its group-sum pass where the engine's consumer adds the groups as it
loads (qkv, o_proj, down); it prints
per shape the best launch per (candidate, M) and a pick (lowest sum over M of time / best time).
The tables alone: under a minute on an H200 (estimated, mostly compiles); with --sweep about
2 min more (split it with --models if it runs long).

    python3 benchmarks/linear.py [--sweep [--jobs 12] [--no-table]] [--ms 1,16,64,128,256]
        [--models 1.5B,8B] [--names qkv,o_proj,gate_up,down,lm_head]

Runs from the repository root without installing the package (engine/ and kernels/ are mapped
into jetspec_chat.* here, as setuptools maps them). JSON goes to $OUT/linear_bench.json when
$OUT is set (or to --json-out).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import jetspec_chat  # noqa: E402  (the repo's jetspec_chat/; kernels/ and engine/ join its path)

if str(REPO) not in jetspec_chat.__path__:
    jetspec_chat.__path__.append(str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from jetspec_chat.bench.timing import graphed_ms, measure_copy_bandwidth  # noqa: E402
from jetspec_chat.kernels import matmul  # noqa: E402
from jetspec_chat.kernels.matmul import (  # noqa: E402
    BLOCK_M,
    LinearConfig,
    block_m_for,
    choose_config,
    groups_for,
    linear_partials_triton,
    linear_triton,
    use_split,
)

SHAPES = [  # (model, projection, N, K, bias)
    ("0.5B", "qkv", 1152, 896, True),
    ("0.5B", "o_proj", 896, 896, False),
    ("0.5B", "gate_up", 9728, 896, False),
    ("0.5B", "down", 896, 4864, False),
    ("0.5B", "lm_head", 151936, 896, False),
    ("1.5B", "qkv", 2048, 1536, True),
    ("1.5B", "o_proj", 1536, 1536, False),
    ("1.5B", "gate_up", 17920, 1536, False),
    ("1.5B", "down", 1536, 8960, False),
    ("1.5B", "lm_head", 151936, 1536, False),
    ("8B", "qkv", 6144, 4096, False),
    ("8B", "o_proj", 4096, 4096, False),
    ("8B", "gate_up", 24576, 4096, False),
    ("8B", "down", 4096, 12288, False),
    ("8B", "lm_head", 151936, 4096, False),
    ("30B-A3B", "qkv", 5120, 2048, False),  # Qwen3-30B-A3B's dense linears (its experts: moe_block.py)
    ("30B-A3B", "o_proj", 2048, 4096, False),
    ("30B-A3B", "lm_head", 151936, 2048, False),
]
FLUSH_BYTES = 128 << 20
MAX_ROWS = 256
DTYPE = torch.bfloat16


def graphed_us(fn, weights, reps: int) -> float:
    """Median µs per call of fn(w) over one graph replay that calls it once per weight copy."""
    return statistics.median(graphed_ms(lambda: [fn(w) for w in weights], reps)) * 1e3 / len(weights)


def make_weights(n: int, k: int, bias: bool, seed: int, copies: int | None = None):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(n, k, device="cuda", generator=gen) * k ** -0.5).to(DTYPE)
    b = torch.randn(n, device="cuda", generator=gen).to(DTYPE) if bias else None
    copies = copies or max(1, min(32, -(-FLUSH_BYTES // w.nbytes)))
    return [w] + [w.clone() for _ in range(copies - 1)], b


def invariant(fn, x: torch.Tensor, ms) -> bool:
    full = fn(x)
    ok = all(torch.equal(fn(x[:m]), full[:m]) for m in ms)
    return ok and all(torch.equal(fn(x[i : i + 1])[0], full[i]) for i in (0, 100, MAX_ROWS - 1))


def rel_err(y: torch.Tensor, exact: torch.Tensor) -> float:
    return ((y.float() - exact).norm() / exact.norm()).item()


def main_table(ms, reps: int) -> list[dict]:
    rows = []
    print(f"{'shape':<16}{'N':>7}{'K':>6}{'G':>4} {'M':>4}{'ours µs':>9}{'cuBLAS µs':>10}{'ratio':>7}"
          f"{'launch':>10}{'64-row µs':>10}{'GB/s':>7}{'inv':>5}{'cuBLAS inv':>11}{'err':>9}{'cuBLAS err':>11}")
    for s_i, (model, name, n, k, bias) in enumerate(SHAPES):
        weights, b = make_weights(n, k, bias, seed=s_i)
        w = weights[0]
        config = choose_config(n, k)
        gen = torch.Generator(device="cuda").manual_seed(100 + s_i)
        x_all = torch.randn(MAX_ROWS, k, device="cuda", generator=gen).to(DTYPE)
        ours_inv = invariant(lambda xx: linear_triton(xx, w, b), x_all, ms)
        cublas_inv = invariant(lambda xx: F.linear(xx, w, b), x_all, ms)
        x64 = x_all[:64]
        exact = (x64.float() @ w.float().T + (b.float() if b is not None else 0))
        err = rel_err(linear_triton(x64, w, b), exact)
        cublas_err = rel_err(F.linear(x64, w, b), exact)
        for m in ms:
            x = x_all[:m]
            t_ours = graphed_us(lambda ww: linear_triton(x, ww, b), weights, reps)
            t_cublas = graphed_us(lambda ww: F.linear(x, ww, b), weights, reps)
            split = use_split(m, n, k, config)
            rows_per_program = block_m_for(m, config.num_groups(k), split)
            launch = f"{'split' if split else 'fused'}/{rows_per_program}"
            t_64 = None
            if rows_per_program != BLOCK_M:
                t_64 = min(graphed_us(lambda ww, sp=sp: linear_triton(x, ww, b, split=sp, block_m=BLOCK_M), weights, reps)
                           for sp in ((False, True) if config.num_groups(k) > 1 else (False,)))
            gbps = (w.nbytes + x.nbytes + m * n * 2) / (t_ours * 1e-6) / 1e9 if m == 1 else None
            row = dict(model=model, name=name, n=n, k=k, bias=bias, m=m, config=config.__dict__,
                       groups=config.num_groups(k), launch=launch, ours_us=t_ours, cublas_us=t_cublas,
                       rows64_us=t_64, gbps_m1=gbps, invariant=ours_inv,
                       cublas_invariant=cublas_inv, err=err, cublas_err=cublas_err, copies=len(weights))
            rows.append(row)
            print(f"{model + ' ' + name:<16}{n:>7}{k:>6}{config.num_groups(k):>4} {m:>4}{t_ours:>9.1f}{t_cublas:>10.1f}"
                  f"{t_ours / t_cublas:>7.2f}{launch:>10}{(f'{t_64:.1f}' if t_64 else ''):>10}{(f'{gbps:.0f}' if gbps else ''):>7}"
                  f"{'yes' if ours_inv else 'NO':>5}{'yes' if cublas_inv else 'no':>11}{err:>9.2e}{cublas_err:>11.2e}")
        del weights, w, b, x_all
        torch.cuda.empty_cache()
    return rows


def balanced_groups(tiles: int, k: int, block_k: int, max_per_sm: int = 4) -> set[int]:
    """K group counts whose (N tile, group) programs at M=1 load the SMs evenly: on average at
    least 95% of the busiest SM's count (the 8B qkv's 96 tiles in 3 groups put 3 programs on 24
    SMs and 2 on the rest, 73%; in 4 groups 97%), at most max_per_sm programs an SM."""
    out = set()
    for g in range(2, -(-k // block_k) // matmul.MIN_GROUP_BLOCKS + 1):
        if LinearConfig(64, block_k, g).num_groups(k) != g:  # rounds to another group count
            continue
        per_sm = tiles * g / matmul.SMS
        if per_sm <= max_per_sm and per_sm / -(-tiles * g // matmul.SMS) >= 0.95:
            out.add(g)
    return out


def candidates(n: int, k: int) -> list[LinearConfig]:
    """The table's config and its neighbourhood: 64 / 128-wide tiles, 64 / 128-deep K blocks, the
    rule's K groups, half and twice as many, one group, 2 or 4 groups for weights whose N tiles
    alone fill a wave (gate_up, lm_head: at M=1 their one-group launch ends on a partial wave), and
    the group counts that load the SMs evenly at M=1 (`balanced_groups`); the
    table's config at 3 and 6 stages. One group is left out where the N tiles fill under half the
    SMs (a handful of programs at M=1)."""
    base = choose_config(n, k)
    out = [base]
    for bk in (64, 128):
        k_blocks = -(-k // bk)
        for bn in (64, 128):
            tiles = -(-n // bn)
            rule = groups_for(n, k, bn, bk)
            gs = {1, rule, 2 * rule, max(1, rule // 2)} | ({2, 4} if tiles >= matmul.SMS else set())
            gs |= balanced_groups(tiles, k, bk)
            for g in sorted(gs):
                if (g == 1 and tiles < matmul.SMS // 2) or (g > 1 and g * matmul.MIN_GROUP_BLOCKS > k_blocks):
                    continue
                out.append(LinearConfig(bn, bk, g, 4, 4 if bk == 64 else 3))
    out += [dataclasses.replace(base, num_stages=s) for s in (3, 6)]
    seen, unique = set(), []
    for c in out:  # one of each launch: configs whose groups round to the same count are one
        key = (c.block_n, c.block_k, c.num_groups(k), c.num_warps, c.num_stages)
        if key not in seen:
            seen.add(key)
            unique.append(c)
    return unique


# The engine's consumers that add a split launch's group sums as they load: add_rms_norm after
# o_proj and down, qkv_rope_write after qkv (engine/model.py). There the sweep times the split
# launch alone. gate_up (silu_mul) and the lm_head (argmax) take the output, so they keep the pass.
SUMMED_BY_CONSUMER = {"qkv", "o_proj", "down"}


def run_linear(name: str, x, w, b, config: LinearConfig, split: bool):
    if split and name in SUMMED_BY_CONSUMER:
        return linear_partials_triton(x, w, b, config=config, split=True)
    return linear_triton(x, w, b, config=config, split=split)


_WARM_WEIGHTS: dict = {}


def _warm_one(task) -> None:
    """Compile one sweep launch in a worker process (Triton's disk cache is shared)."""
    name, n, k, bias, config, split, m = task
    if (n, k, bias) not in _WARM_WEIGHTS:
        _WARM_WEIGHTS.clear()
        _WARM_WEIGHTS[(n, k, bias)] = make_weights(n, k, bias, seed=0, copies=1)
    (w,), b = _WARM_WEIGHTS[(n, k, bias)]
    x = torch.randn(m, k, device="cuda").to(DTYPE)
    run_linear(name, x, w, b, LinearConfig(**config), split)
    torch.cuda.synchronize()


def warm_compiles(ms, jobs: int) -> None:
    """Every sweep launch compiled first in `jobs` processes, so that the timed pass finds them in
    the cache (one compile is ~1 s of CPU; a sweep has ~250)."""
    import concurrent.futures
    import multiprocessing

    tasks = []
    for model, name, n, k, bias in SHAPES:
        for c in candidates(n, k):
            for sp in ((True, False) if c.num_groups(k) > 1 else (False,)):
                for m in sorted({min(ms), max(ms)}):  # PDL up to 64 rows, 128-row programs beyond
                    tasks.append((name, n, k, bias, c.__dict__, sp, m))
    t0 = time.time()
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        failed = sum(1 for f in [pool.submit(_warm_one, t) for t in tasks] if f.exception() is not None)
    print(f"compiled {len(tasks)} launches in {time.time() - t0:.0f} s with {jobs} processes ({failed} failed)")


def label(c: LinearConfig, k: int) -> str:
    return f"{c.block_n}x{c.block_k} G{c.num_groups(k)} w{c.num_warps} s{c.num_stages}"


def sweep(ms, reps: int) -> list[dict]:
    results, paste = [], []
    for s_i, (model, name, n, k, bias) in enumerate(SHAPES):
        weights, b = make_weights(n, k, bias, seed=s_i)
        gen = torch.Generator(device="cuda").manual_seed(100 + s_i)
        x_all = torch.randn(MAX_ROWS, k, device="cuda", generator=gen).to(DTYPE)
        cublas = {m: graphed_us(lambda ww: F.linear(x_all[:m], ww, b), weights, reps) for m in ms}
        print(f"\n{model} {name} N={n} K={k}: µs per call (s = split launch, f = fused), cuBLAS first")
        print(f"{'config':<24}" + "".join(f"{'M=' + str(m):>11}" for m in ms) + f"{'inv':>5}{'=tbl':>6}{'score':>7}")
        print(f"{'cuBLAS':<24}" + "".join(f"{cublas[m]:>11.1f}" for m in ms))
        shape_rows = []
        table_y = linear_triton(x_all, weights[0], b)
        for c in candidates(n, k):
            entry = dict(model=model, name=name, n=n, k=k, config=c.__dict__, groups=c.num_groups(k), times={})
            try:
                for m in ms:
                    x = x_all[:m]
                    launches = (True, False) if c.num_groups(k) > 1 else (False,)
                    entry["times"][m] = {("split" if sp else "fused"): graphed_us(
                        lambda ww, sp=sp: run_linear(name, x, ww, b, c, sp), weights, reps) for sp in launches}
                w = weights[0]
                entry["same_bits_as_table"] = torch.equal(linear_triton(x_all, w, b, config=c), table_y)
                entry["invariant"] = all(
                    invariant(lambda xx, sp=sp: linear_triton(xx, w, b, config=c, split=sp), x_all, ms)
                    for sp in ((True, False) if c.num_groups(k) > 1 else (False,)))
            except Exception as err:  # noqa: BLE001 - a candidate that fails (resources, compile) is reported
                print(f"{label(c, k):<24}failed: {type(err).__name__}: {str(err).splitlines()[0][:80]}")
                continue
            shape_rows.append(entry)
        best = {m: min(min(e["times"][m].values()) for e in shape_rows) for m in ms}
        for e in shape_rows:
            e["score"] = sum(min(e["times"][m].values()) / best[m] for m in ms)
            cells = "".join(f"{min(e['times'][m].values()):>10.1f}{min(e['times'][m], key=e['times'][m].get)[0]}"
                            for m in ms)
            c = LinearConfig(**e["config"])
            print(f"{label(c, k):<24}{cells}{'yes' if e['invariant'] else 'NO':>5}"
                  f"{'yes' if e['same_bits_as_table'] else 'no':>6}{e['score']:>7.2f}")
        table = next((e for e in shape_rows if LinearConfig(**e["config"]) == choose_config(n, k)), None)
        if table is not None and table["groups"] > 1:  # use_split against the clock
            print("launch (use_split / faster measured): " + ", ".join(
                f"M={m} {'s' if use_split(m, n, k, choose_config(n, k)) else 'f'}/"
                f"{min(table['times'][m], key=table['times'][m].get)[0]}" for m in ms))
        pick = min((e for e in shape_rows if e["invariant"]), key=lambda e: e["score"], default=None)
        if pick is not None:
            print(f"pick: {label(LinearConfig(**pick['config']), k)}  (table: {label(choose_config(n, k), k)})")
        if pick is not None and LinearConfig(**pick["config"]) != choose_config(n, k):
            c = LinearConfig(**pick["config"])
            paste.append(f"    ({n}, {k}): LinearConfig(block_n={c.block_n}, block_k={c.block_k}, groups={c.groups}, "
                         f"num_warps={c.num_warps}, num_stages={c.num_stages}),  # {model} {name}")
        results.append(dict(model=model, name=name, n=n, k=k, cublas_us=cublas, candidates=shape_rows,
                            pick=pick["config"] if pick else None))
        del weights, b, x_all
        torch.cuda.empty_cache()
    print("\nmatmul.TUNED entries where the pick is not the rule's config:" if paste else "\npicks = the rule's configs")
    print("\n".join(paste))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--ms", default="1,16,64,128,256")
    ap.add_argument("--models", default="1.5B,8B", help="which SHAPES to run (comma-separated: 0.5B,1.5B,8B,30B-A3B)")
    ap.add_argument("--names", default=None, help="which projections (comma-separated, e.g. gate_up,down)")
    ap.add_argument("--jobs", type=int, default=12, help="processes compiling the sweep's launches first (0: none)")
    ap.add_argument("--no-table", action="store_true", help="the sweep alone")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    ms = [int(v) for v in args.ms.split(",")]
    models = set(args.models.split(","))
    names = set(args.names.split(",")) if args.names else None
    SHAPES[:] = [s for s in SHAPES if s[0] in models and (names is None or s[1] in names)]
    assert max(ms) <= MAX_ROWS
    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    bw = measure_copy_bandwidth(torch.device("cuda"), 1 << 30, 3, 10)[1] * 1e9  # bytes/s
    print(f"{props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}; kernels from "
          f"{Path(matmul.__file__).parent}; copy bandwidth {bw / 1e9:.0f} GB/s (read + write)")
    print("µs per call in a CUDA graph, weights streamed from HBM; median of 25 replays")
    report = dict(device=props.name, sms=props.multi_processor_count, copy_gbps=bw / 1e9,
                  timing="CUDA graph, one call per weight copy (>= 128 MB of copies), median of replays",
                  table=[] if args.no_table else main_table(ms, reps=25))
    if args.sweep:
        if args.jobs:
            warm_compiles(ms, args.jobs)
        report["sweep"] = sweep(ms, reps=15)
    report["seconds"] = time.time() - t0
    print(f"\n{report['seconds']:.0f} s")
    path = args.json_out or (os.path.join(os.environ["OUT"], "linear_bench.json") if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
        print("wrote", path)


if __name__ == "__main__":
    main()

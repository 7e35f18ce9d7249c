"""Each batch-invariant kernel beside its vendor reference and its bound, with a bitwise check.

GEMM (x [M, K] @ W[N, K].T, bf16) at every linear shape of Qwen2.5-1.5B, Qwen3-8B and
Qwen3-30B-A3B (the dense linears; its experts run in kernels/moe.py) for M in {1, 16, 64, 128, 256}:
  base   kernels.matmul.linear_triton(tma=False): the pointer-fed kernel (split or fused launch)
  tma*   kernels.matmul.linear_tma variants (kernels/matmul_tma.py: persistent grid, TMA-fed), same arithmetic
         (with --tma)
  ws*    kernels.matmul.linear_ws variants (kernels/matmul_ws.py: persistent, warp-specialized
         producer/consumer, in Gluon), same arithmetic: ws the default (split over K groups and
         rows per program where the engine's launch has them: use_split, block_m_for), wsS
         always split (weights with K groups), wsF always fused, wsW fused in 128-row programs
         past 64 rows, wsN twice as wide tiles (at most 256), ws2 two 64-row programs an SM
  engine linear_triton as the engine calls it (the TMA form where matmul.use_tma picks it)
  cublas torch.matmul (its algorithm depends on M: not batch-invariant)
  bound  max(weight + activation + output bytes / copy bandwidth, 2MNK / matmul rate), both
         measured here first (a large device copy; an 8192^3 bf16 torch.matmul)
  bits   'ok' when every variant's output equals base's bitwise and base's rows at M equal its
         rows computed alone (M = 1, the AR step) for the first, middle and last row.
  ws/cub, ws/bnd  the fastest ws variant against cuBLAS and against the bound.
Times: median over CUDA-graph replays of 16 back-to-back calls, rotating over enough weight
copies to exceed the L2, in µs per call.

--wide sweeps instead the tiles of the weights in one K group (kernels.matmul.WideTile: the
gate_ups and lm_heads of the three models, WIDE_SHAPES): at M up to 64 (the AR step, small trees)
the ROW64_CANDIDATES (one warpgroup, other widths, depths, stage counts, the TMA form), past 64 the
WIDE_CANDIDATES (two warpgroups): cuBLAS, the engine's launch and every candidate (g:
`_linear_kernel`'s grid, t: the persistent TMA-fed form; BLOCK_M x BLOCK_N [x BLOCK_K] s stages
[p programs an SM] [+ the tail's tile: the columns past the last whole wave]) in µs, the fastest candidate against both, and `bits`: 'ok' when every
candidate's output equals the engine's launch bitwise at that M and the engine's first, middle and
last rows equal their M = 1 calls (else the candidates that differ). Each launch is timed once a
round for --rounds rounds in turn (default 3; the table shows the median, `spread` the widest
max / min over one launch's rounds at that shape: the long lm_head GEMMs varied by up to 15%
between single timings). It ends with the WIDE_PICKS
entries the timings suggest (the fastest candidate with equal bits, where it beats the engine's
launch by >= 5%), as Python, and writes the table and its JSON to --out (default $OUT/wide_tiles
when $OUT is set).

--grouped sweeps the launches of the weights in K groups (qkv, o, down) at M up to 64, as the
engine runs them there (the split launch's group sums handed to their consumer, no sum pass):
the engine's launch against GROUPED_CANDIDATES, the same K blocks and groups (the same sum, so
`bits` must say ok) in other tile widths (n) and stage counts (s).

  python3 benchmarks/kernels_vs_vendor.py [--models 1.5b,8b,30b] [--rows 1,16,64,128,256] [--tma] [--no-ws]
  python3 benchmarks/kernels_vs_vendor.py --wide [--models 1.5b,8b,30b] [--rows 1,16,32,64,128,192,256]
      [--linears gate_up,lm_head] [--rounds 3] [--out DIR]
  python3 benchmarks/kernels_vs_vendor.py --grouped [--models 1.5b,8b,30b] [--rows 1,16,64]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
from pathlib import Path

import torch

from jetspec_chat.kernels import matmul_ws
from jetspec_chat.kernels.matmul import (Partials, WideTile, choose_config, linear_partials_triton, linear_tma,
                                         linear_triton, linear_ws, use_split)

SHAPES = {  # (name, N, K)
    "1.5b": [("qkv", 2048, 1536), ("o", 1536, 1536), ("gate_up", 17920, 1536), ("down", 1536, 8960),
             ("lm_head", 151936, 1536)],
    "8b": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 24576, 4096), ("down", 4096, 12288),
           ("lm_head", 151936, 4096)],
    "30b": [("qkv", 5120, 2048), ("o", 2048, 4096), ("lm_head", 151936, 2048)],
}
TMA_VARIANTS = {
    "tma1": dict(programs_per_sm=1),
    "tma2": dict(programs_per_sm=2),
}
# Wider tiles (BLOCK_N 256, same BLOCK_K and K groups): a different wgmma N per warpgroup. Whether
# that changes a single bit is what the 'wideN' column reports (vs base); not used by the engine.
WIDE_VARIANTS = {
    "w256": dict(programs_per_sm=1, num_stages=3),
}
WS_VARIANTS = {  # name -> linear_ws keywords, from (config, M)
    "ws": lambda config, m: dict(),
    "wsS": lambda config, m: dict(split=True),
    "wsF": lambda config, m: dict(split=False),
    "wsW": lambda config, m: dict(split=False, block_m=128 if m > 64 else 64),
    "wsN": lambda config, m: dict(block_n=min(256, 2 * config.block_n)),
    "ws2": lambda config, m: dict(programs_per_sm=2, block_m=64),
}
# The weights in one K group (gate_up, lm_head: `WideTile`'s) and the wide tiles swept over them.
WIDE_SHAPES = {
    "1.5b": [("gate_up", 17920, 1536), ("lm_head", 151936, 1536)],
    "8b": [("gate_up", 24576, 4096), ("lm_head", 151936, 4096)],
    "30b": [("lm_head", 151936, 2048)],
}


def _wide_name(t: WideTile) -> str:
    name = f"{'t' if t.tma else 'g'}{t.block_m}x{t.block_n}" + (f"x{t.block_k}" if t.block_k != 64 else "")
    name += f"s{t.stages}" + (f"p{t.programs_per_sm}" if t.programs_per_sm != 1 else "")
    return name + (f"+{_wide_name(t.tail)}" if t.tail else "")


def _tile_code(t: WideTile) -> str:
    """The WideTile as Python, for the suggested WIDE_PICKS."""
    tail = f", tail={_tile_code(t.tail)}" if t.tail else ""
    return (f"WideTile({t.block_m}, {t.block_n}, {t.block_k}, {t.stages}, tma={t.tma}, "
            f"programs_per_sm={t.programs_per_sm}{tail})")


WIDE_CANDIDATES = {_wide_name(t): t for t in [
    WideTile(128, 256, 64, 2), WideTile(128, 256, 64, 3), WideTile(128, 256, 64, 4),
    WideTile(256, 128, 64, 3), WideTile(256, 128, 64, 4),
    WideTile(128, 256, 128, 2), WideTile(256, 128, 128, 2),
    WideTile(128, 128, 64, 4),
    WideTile(128, 256, 64, 3, tma=True), WideTile(128, 256, 64, 4, tma=True),
    WideTile(256, 128, 64, 3, tma=True), WideTile(256, 128, 64, 4, tma=True),
    WideTile(128, 256, 128, 2, tma=True),
    WideTile(128, 128, 64, 4, tma=True), WideTile(128, 128, 64, 2, tma=True, programs_per_sm=2),
    # The columns past the last whole wave in smaller tiles (`WideTile.tail`, `head_columns`).
    *(dataclasses.replace(head, tail=tail)
      for head in (WideTile(128, 256, 64, 4, tma=True), WideTile(256, 128, 64, 4, tma=True),
                   WideTile(128, 128, 64, 4, tma=True))
      for tail in (WideTile(64, 64, 64, 4), WideTile(128, 64, 64, 3), WideTile(128, 128, 64, 3))),
]}
# One warpgroup (64 rows, 4 warps: the AR step's and small trees' programs) in other tiles than the
# config's: the widths, depths and stage counts that fit two or three programs an SM, and the
# persistent TMA form.
ROW64_CANDIDATES = {_wide_name(t): t for t in [
    WideTile(64, 64, 64, 4), WideTile(64, 64, 64, 6), WideTile(64, 64, 128, 3),
    WideTile(64, 128, 64, 4), WideTile(64, 128, 64, 6), WideTile(64, 128, 128, 3),
    WideTile(64, 256, 64, 3), WideTile(64, 256, 64, 4),
    WideTile(64, 64, 64, 6, tma=True, programs_per_sm=2), WideTile(64, 64, 64, 4, tma=True, programs_per_sm=3),
    WideTile(64, 128, 64, 4, tma=True, programs_per_sm=2), WideTile(64, 128, 64, 6, tma=True),
    WideTile(64, 256, 64, 4, tma=True),
]}
# The launches of weights in K groups at up to 64 rows: (BLOCK_N, stages), the config's K blocks and groups.
GROUPED_CANDIDATES = {f"n{bn}s{st}": (bn, st) for bn in (32, 64, 128) for st in (3, 4, 6)}
GROUPED_SHAPES = {model: [s for s in shapes if s[0] in ("qkv", "o", "down")] for model, shapes in SHAPES.items()}
PICK_GAIN = 0.95  # a suggested pick beats the engine's launch by >= 5%
CALLS = 16  # calls per graph replay
L2_BYTES = 50e6


def graph_time_us(fn, copies: int) -> float:
    """Median µs per call: a graph of CALLS calls (call i on copy i mod copies), replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(3):
            fn(i % copies)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS):
            fn(i % copies)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(15):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS)
    return statistics.median(times)


def weight_copies(n: int, k: int) -> list[torch.Tensor]:
    """Random [N, K] bf16 weights, enough copies (3x the L2's bytes, at most 32) that calls rotating
    over them stream each weight from HBM, as a decode step does."""
    copies = max(1, min(32, int(3 * L2_BYTES // (2 * n * k)) + 1))
    return [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]


def ceilings() -> tuple[float, float]:
    """(copy bytes/s counting read + write, bf16 matmul FLOP/s) measured on this device."""
    src = torch.randn(1 << 29, device="cuda", dtype=torch.bfloat16)  # 1 GiB
    dst = torch.empty_like(src)
    t = graph_time_us(lambda i: dst.copy_(src), 1)
    print(f"device copy {2 * src.numel() * 2 / (t * 1e-6) / 1e12:.2f} TB/s (read + write)")
    t = graph_time_us(lambda i: torch.sum(src, dtype=torch.float32), 1)
    bw = src.numel() * 2 / (t * 1e-6)  # a GEMM streams its weight: read bandwidth is its ceiling
    del src, dst
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t = graph_time_us(lambda i: a @ b, 1)
    return bw, 2 * 8192**3 / (t * 1e-6)


def wide_sweep(models: list[str], rows: list[int], out_dir: Path | None, linears: list[str], rounds: int) -> None:
    """The --wide table (module docstring): every candidate tile beside cuBLAS and the engine's
    launch at the one-group shapes, with the bits column and the suggested picks; the
    ROW64_CANDIDATES at up to 64 rows, the WIDE_CANDIDATES past them."""
    lines, records = [], []
    for group, candidates in (([m for m in rows if m <= 64], ROW64_CANDIDATES),
                              ([m for m in rows if m > 64], WIDE_CANDIDATES)):
        if group:
            sweep_tiles(models, group, candidates, lines, records, out_dir, rows, linears, rounds)
    print("\n".join(write_wide(out_dir, lines, records, rows)[len(lines):]))


def sweep_tiles(models: list[str], rows: list[int], candidates: dict[str, WideTile], lines: list[str],
                records: list[dict], out_dir: Path | None, all_rows: list[int], linears: list[str],
                rounds: int) -> None:
    """One table of `wide_sweep`: these candidates at these rows, appended to lines and records."""
    names = list(candidates)
    w = max(map(len, names))
    head = f"{'model':5} {'linear':8} {'N':>6} {'K':>5} {'M':>4} {'cublas':>7} {'engine':>7}"
    head += "".join(f" {v:>{w}}" for v in names) + f" {'best':>{w}} {'best/cub':>8} {'best/eng':>8} {'spread':>6}  bits"
    print(head, flush=True)
    lines.append(head)
    for model in models:
        for name, n, k in WIDE_SHAPES[model]:
            if linears and name not in linears:
                continue
            if choose_config(n, k).num_groups(k) != 1:
                print(f"  {model} {name}: its weight has K groups, no wide tile", flush=True)
                continue
            weights = weight_copies(n, k)
            copies = len(weights)
            for m in rows:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
                engine_y = linear_triton(x, weights[0])
                engine_ok = all(torch.equal(linear_triton(x[r:r + 1], weights[0])[0], engine_y[r])
                                for r in sorted({0, m // 2, m - 1}))
                calls = {"engine": lambda i: linear_triton(x, weights[i], out=outs[i]),
                         "cublas": lambda i: torch.matmul(x, weights[i].T, out=outs[i])}
                same = {}
                for v, tile in candidates.items():
                    try:
                        same[v] = torch.equal(linear_triton(x, weights[0], wide=tile), engine_y)
                        calls[v] = lambda i, t=tile: linear_triton(x, weights[i], out=outs[i], wide=t)
                    except Exception as e:  # a candidate that does not compile or run here: reported, not fatal
                        print(f"  {v} failed at {name} M={m}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                        same[v] = None
                graph_time_us(calls["engine"], copies)  # a warm-up: the first timing at a row count read up to 6% slow
                # Every launch timed once a round, rounds in turn: a slow spell of the GPU falls on
                # all of them alike, and the median over rounds is what the table shows.
                runs = {v: [] for v in calls}
                for _ in range(rounds):
                    for v, call in calls.items():
                        runs[v].append(graph_time_us(call, copies))
                times = {v: statistics.median(runs[v]) if v in runs else float("nan") for v in names}
                t_engine, t_cublas = statistics.median(runs["engine"]), statistics.median(runs["cublas"])
                spread = max(max(r) / min(r) for r in runs.values())
                ok = [v for v in names if same[v] and times[v] == times[v]]
                best = min(ok, key=times.get) if ok else None
                t_best = times[best] if best else float("nan")
                differ = [v for v in names if same[v] is False]
                bits = "ok" if engine_ok and not differ else ("ROWS " if not engine_ok else "") + " ".join(differ)
                line = f"{model:5} {name:8} {n:6} {k:5} {m:4} {t_cublas:7.1f} {t_engine:7.1f}"
                line += "".join(f" {times[v]:{w}.1f}" for v in names)
                line += f" {best or '-':>{w}} {t_best / t_cublas:8.2f} {t_best / t_engine:8.2f} {spread:6.2f}  {bits}"
                print(line, flush=True)
                lines.append(line)
                records.append(dict(model=model, linear=name, n=n, k=k, m=m, cublas_us=t_cublas, engine_us=t_engine,
                                    candidates={v: dict(us=times[v], same_bits=same[v], rounds_us=runs.get(v))
                                                for v in names},
                                    engine_rounds_us=runs["engine"], cublas_rounds_us=runs["cublas"], spread=spread,
                                    engine_rows_equal_m1=engine_ok, best=best))
            del weights
            torch.cuda.empty_cache()
            write_wide(out_dir, lines, records, all_rows)  # after every shape: a run cut short keeps what it measured


def write_wide(out_dir: Path | None, lines: list[str], records: list[dict], rows: list[int]) -> list[str]:
    """The table so far with the suggested picks, written with its JSON to out_dir (if given)."""
    text = lines + ["", f"device {torch.cuda.get_device_name()}", "",
                    "suggested WIDE_PICKS (fastest candidate with equal bits, >= 5% faster than the engine's launch):",
                    suggested_picks(records, rows)]
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "wide_sweep.txt").write_text("\n".join(text) + "\n")
        tiles = {**ROW64_CANDIDATES, **WIDE_CANDIDATES}
        (out_dir / "wide_sweep.json").write_text(json.dumps(dict(
            device=torch.cuda.get_device_name(), tiles={v: dataclasses.asdict(t) for v, t in tiles.items()},
            rows=records), indent=1))
    return text


def suggested_picks(records: list[dict], rows: list[int]) -> str:
    """WIDE_PICKS entries, as Python: per shape and measured M, the fastest candidate with equal
    bits where it beats the engine's launch by >= 5%, for rows (previous measured M, M] on the
    same side of 64."""
    text = []
    tiles = {**ROW64_CANDIDATES, **WIDE_CANDIDATES}
    for (n, k) in dict.fromkeys((r["n"], r["k"]) for r in records):
        entries = []
        for r in (r for r in records if (r["n"], r["k"]) == (n, k) and r["best"]):
            if r["candidates"][r["best"]]["us"] <= PICK_GAIN * r["engine_us"]:
                side = 64 if r["m"] > 64 else 0
                after = max([m for m in rows if side < m < r["m"]] + [side])
                entries.append(f"        WidePick({after}, {r['m']}, {_tile_code(tiles[r['best']])}),"
                               f"  # {r['engine_us']:.1f} -> {r['candidates'][r['best']]['us']:.1f} us")
        if entries:
            text += [f"    ({n}, {k}): ("] + entries + ["    ),"]
    return "\n".join(text) if text else "    (none)"


def grouped_sweep(models: list[str], rows: list[int]) -> None:
    """The --grouped table (module docstring): the engine's launch of each weight in K groups
    beside GROUPED_CANDIDATES at up to 64 rows, as the engine runs it (`linear_partials_triton`:
    a split launch's group sums unsummed), with the bits column (the group sums themselves)."""
    names = list(GROUPED_CANDIDATES)
    head = f"{'model':5} {'linear':8} {'N':>6} {'K':>5} {'M':>4} {'launch':>6} {'cublas':>7} {'engine':>7}"
    head += "".join(f" {v:>6}" for v in names) + f" {'best':>6} {'best/eng':>8}  bits"
    print(head, flush=True)
    lines = [head]
    for model in models:
        for name, n, k in GROUPED_SHAPES[model]:
            config = choose_config(n, k)
            weights = weight_copies(n, k)
            copies = len(weights)
            for m in rows:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                split = use_split(m, n, k, config)

                def run(i, cfg=None):
                    got = linear_partials_triton(x, weights[i], config=cfg, split=None if cfg is None else split)
                    return got.stacked() if isinstance(got, Partials) else got

                engine_y = run(0)
                t_engine = graph_time_us(run, copies)
                t_cublas = graph_time_us(lambda i: torch.matmul(x, weights[i].T), copies)
                times, differ = {}, []
                for v, (bn, st) in GROUPED_CANDIDATES.items():
                    cfg = dataclasses.replace(config, block_n=bn, num_stages=st)
                    try:
                        if not torch.equal(run(0, cfg), engine_y):
                            differ.append(v)
                        times[v] = graph_time_us(lambda i, cfg=cfg: run(i, cfg), copies)
                    except Exception as e:  # a candidate that does not compile or run here: reported, not fatal
                        print(f"  {v} failed at {name} M={m}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                        times[v] = float("nan")
                ok = [v for v in names if v not in differ and times[v] == times[v]]
                best = min(ok, key=times.get) if ok else None
                t_best = times[best] if best else float("nan")
                launch = "split" if split else "fused"
                line = f"{model:5} {name:8} {n:6} {k:5} {m:4} {launch:>6} {t_cublas:7.1f} {t_engine:7.1f}"
                line += "".join(f" {times[v]:6.1f}" for v in names)
                line += f" {best or '-':>6} {t_best / t_engine:8.2f}  {'ok' if not differ else ' '.join(differ)}"
                print(line, flush=True)
                lines.append(line)
            del weights
            torch.cuda.empty_cache()
    print("\n".join(["", f"device {torch.cuda.get_device_name()}", "config per shape: " + ", ".join(
        f"{name} n{choose_config(n, k).block_n}s{choose_config(n, k).num_stages}g{choose_config(n, k).num_groups(k)}"
        for model in models for name, n, k in GROUPED_SHAPES[model])] + lines))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="1.5b,8b,30b")
    ap.add_argument("--rows", default=None, help="row counts (default 1,16,64,128,256; with --wide 64,128,192,256)")
    ap.add_argument("--tma", action="store_true", help="also the TMA-fed kernel's variants")
    ap.add_argument("--no-ws", action="store_true", help="leave out the warp-specialized kernel")
    ap.add_argument("--wide", action="store_true", help="sweep the tiles of the one-group weights instead")
    ap.add_argument("--grouped", action="store_true", help="sweep the K-grouped weights' launches at up to 64 rows")
    ap.add_argument("--linears", default=None, help="with --wide: only these linears (gate_up, lm_head)")
    ap.add_argument("--out", default=None, help="folder for the --wide table and JSON (default $OUT/wide_tiles)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="with --wide: rounds of timing every launch once, in turn (the table: their median)")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.wide:
        out = args.out or (os.path.join(os.environ["OUT"], "wide_tiles") if os.environ.get("OUT") else None)
        wide_sweep(args.models.split(","), [int(r) for r in (args.rows or "1,16,32,64,128,192,256").split(",")],
                   Path(out) if out else None, args.linears.split(",") if args.linears else [], args.rounds)
        return
    if args.grouped:
        grouped_sweep(args.models.split(","), [int(r) for r in (args.rows or "1,16,64").split(",")])
        return
    args.rows = args.rows or "1,16,64,128,256"
    bw, rate = ceilings()
    print(f"device {torch.cuda.get_device_name()}  read {bw / 1e12:.2f} TB/s  bf16 matmul {rate / 1e12:.0f} TFLOP/s")
    tma_v = {**TMA_VARIANTS, **WIDE_VARIANTS} if args.tma else {}
    ws_v = {} if args.no_ws or not matmul_ws.available(torch.device("cuda")) else WS_VARIANTS
    head = f"{'model':5} {'linear':8} {'N':>6} {'K':>5} {'M':>4} {'bound':>7} {'cublas':>7} {'base':>7} {'engine':>7}"
    head += "".join(f" {v:>7}" for v in [*tma_v, *ws_v])
    head += f" {'base/bnd':>8} {'cub/bnd':>7} {'ws/bnd':>6} {'ws/cub':>6} {'ws/eng':>6} {'bits':>5} {'wideN':>5}"
    rows_out = [head]
    print(head, flush=True)
    for model in args.models.split(","):
        for name, n, k in SHAPES[model]:
            wbytes = 2 * n * k
            weights = weight_copies(n, k)
            copies = len(weights)
            config = choose_config(n, k)
            for m in [int(r) for r in args.rows.split(",")]:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
                base_y = linear_triton(x, weights[0], tma=False)
                bits = True
                for r in sorted({0, m // 2, m - 1}):
                    bits &= torch.equal(linear_triton(x[r:r + 1], weights[0], tma=False)[0], base_y[r])
                t_base = graph_time_us(lambda i: linear_triton(x, weights[i], out=outs[i], tma=False), copies)
                t_engine = graph_time_us(lambda i: linear_triton(x, weights[i], out=outs[i]), copies)
                t_cublas = graph_time_us(lambda i: torch.matmul(x, weights[i].T, out=outs[i]), copies)
                times = {}
                wide_bits = True
                for v in [*tma_v, *ws_v]:
                    if v in ws_v:
                        fn, kw = linear_ws, ws_v[v](config, m)
                    elif v in WIDE_VARIANTS:
                        fn, kw = linear_tma, dict(WIDE_VARIANTS[v], config=dataclasses.replace(config, block_n=256))
                    else:
                        fn, kw = linear_tma, TMA_VARIANTS[v]
                    try:
                        y = fn(x, weights[0], **kw)
                        torch.cuda.synchronize()
                        same = torch.equal(y, base_y)
                        if v in WIDE_VARIANTS:
                            wide_bits &= same
                        else:
                            bits &= same
                        if not same:
                            print(f"  {v} differs from base at {name} M={m}", flush=True)
                        times[v] = graph_time_us(lambda i, fn=fn, kw=kw: fn(x, weights[i], out=outs[i], **kw), copies)
                    except Exception as e:  # a variant that does not compile here: reported, not fatal
                        print(f"  {v} failed at {name} M={m}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                        times[v] = float("nan")
                bound = max((wbytes + 2 * m * k + 2 * m * n) / bw, 2 * m * n * k / rate) * 1e6
                best = min((times[v] for v in ws_v if times[v] == times[v]), default=float("nan"))
                line = f"{model:5} {name:8} {n:6} {k:5} {m:4} {bound:7.1f} {t_cublas:7.1f} {t_base:7.1f} {t_engine:7.1f}"
                line += "".join(f" {times[v]:7.1f}" for v in [*tma_v, *ws_v])
                line += f" {t_base / bound:8.2f} {t_cublas / bound:7.2f} {best / bound:6.2f} {best / t_cublas:6.2f}"
                line += f" {best / t_engine:6.2f} {'ok' if bits else 'DIFF':>5} {'same' if wide_bits else 'DIFF':>5}"
                rows_out.append(line)
                print(line, flush=True)
            del weights
            torch.cuda.empty_cache()
    print("\n".join(["", "summary (µs per call)"] + rows_out))


if __name__ == "__main__":
    main()

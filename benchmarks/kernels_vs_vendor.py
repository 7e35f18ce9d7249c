"""Each batch-invariant kernel beside its vendor reference and its bound, with a bitwise check.

GEMM (x [M, K] @ W[N, K].T, bf16) at every linear shape of Qwen2.5-1.5B, Qwen3-8B and
Qwen3-30B-A3B (the dense linears; its experts run in kernels/moe.py) for M in {1, 16, 64, 128, 256}:
  base   kernels.matmul.linear_triton(tma=False) in the config's own tile width: the pointer-fed
         kernel (split or fused launch)
  tma*   kernels.matmul.linear_tma variants (kernels/matmul_tma.py: persistent grid, TMA-fed), same arithmetic
  s128 .. launches of the pointer-fed kernel past 64 rows (LAUNCH_VARIANTS: split or fused, 64 or
         128 rows a program; 'w' = 128-wide tiles for a 64-wide config, matmul.block_n_for); the
         split ones include the group-sum pass, except 'ws128-' (the partials a consumer sums)
  old    the launch choice before block_n_for (config width; TMA where use_tma picks it)
  engine linear_triton as the engine calls it (use_split, block_m_for, block_n_for, use_tma)
  cublas torch.matmul (its algorithm depends on M: not batch-invariant)
  bound  max(weight + activation + output bytes / copy bandwidth, 2MNK / matmul rate), both
         measured here first (a large device copy; an 8192^3 bf16 torch.matmul)
  bits   'ok' when every variant's output equals base's bitwise and base's rows at M equal its
         rows computed alone (M = 1, the AR step) for the first, middle and last row.
Times: median over CUDA-graph replays of 16 back-to-back calls, rotating over enough weight
copies to exceed the L2, in µs per call.

  python3 benchmarks/kernels_vs_vendor.py [--models 1.5b,8b,30b] [--rows 1,16,64,128,256]
"""
from __future__ import annotations

import argparse
import statistics

import torch

from jetspec_chat.kernels.matmul import (
    BLOCK_M,
    SMS,
    SPLIT_MAX_PARTIAL_RATIO,
    choose_config,
    linear_partials_triton,
    linear_tma,
    linear_triton,
)

SHAPES = {  # (name, N, K)
    "1.5b": [("qkv", 2048, 1536), ("o", 1536, 1536), ("gate_up", 17920, 1536), ("down", 1536, 8960),
             ("lm_head", 151936, 1536)],
    "8b": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 24576, 4096), ("down", 4096, 12288),
           ("lm_head", 151936, 4096)],
    "30b": [("qkv", 5120, 2048), ("o", 2048, 4096), ("lm_head", 151936, 2048)],
}
TMA_VARIANTS = {
    "tma2": dict(programs_per_sm=2),
}
# The pointer-fed kernel's launches past 64 rows (speed only: all give base's bits).
# The 'w' ones only for 64-wide configs (128-wide ones are their base).
LAUNCH_VARIANTS = {
    "s128": dict(split=True, block_m=128, block_n=64),
    "f128": dict(split=False, block_m=128, block_n=64),
    "ws64": dict(split=True, block_m=64, block_n=128),
    "ws128": dict(split=True, block_m=128, block_n=128),
    "wf64": dict(split=False, block_m=64, block_n=128),
    "wf128": dict(split=False, block_m=128, block_n=128),
}
MIN_VARIANT_ROWS = 64


def old_split(m: int, n: int, k: int, config) -> bool:
    """matmul.use_split as it was before block_n_for (the 'old' column)."""
    groups = config.num_groups(k)
    fused_programs = -(-m // BLOCK_M) * -(-n // config.block_n)
    return groups > 1 and fused_programs <= SMS and 8 * groups * m * n <= SPLIT_MAX_PARTIAL_RATIO * 2 * n * k
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="1.5b,8b,30b")
    ap.add_argument("--rows", default="1,16,64,128,256")
    args = ap.parse_args()
    torch.manual_seed(0)
    bw, rate = ceilings()
    print(f"device {torch.cuda.get_device_name()}  read {bw / 1e12:.2f} TB/s  bf16 matmul {rate / 1e12:.0f} TFLOP/s")
    cols = ["cublas", "base", *TMA_VARIANTS, *LAUNCH_VARIANTS, "ws128-", "old", "engine"]
    head = f"{'model':5} {'linear':8} {'N':>6} {'K':>5} {'M':>4} {'bound':>7}" + "".join(f" {c:>7}" for c in cols)
    head += f" {'eng/old':>7} {'eng/cub':>7} {'eng/bnd':>7} {'bits':>5}"
    rows_out = [head]
    print(head, flush=True)
    for model in args.models.split(","):
        for name, n, k in SHAPES[model]:
            wbytes = 2 * n * k
            copies = max(1, min(32, int(3 * L2_BYTES // wbytes) + 1))
            weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
            for m in [int(r) for r in args.rows.split(",")]:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
                config = choose_config(n, k)
                bn = config.block_n
                base_y = linear_triton(x, weights[0], tma=False, block_n=bn)
                bits = True
                for r in sorted({0, m // 2, m - 1}):
                    bits &= torch.equal(linear_triton(x[r:r + 1], weights[0])[0], base_y[r])
                calls = {  # column -> (fn(i) for weight copy i, whose output is checked against base)
                    "cublas": lambda i: torch.matmul(x, weights[i].T, out=outs[i]),
                    "base": lambda i: linear_triton(x, weights[i], out=outs[i], tma=False, block_n=bn),
                    "old": lambda i: linear_triton(x, weights[i], out=outs[i], block_n=bn, split=old_split(m, n, k, config)),
                    "engine": lambda i: linear_triton(x, weights[i], out=outs[i]),
                }
                calls |= {v: lambda i, kw=kw: linear_tma(x, weights[i], out=outs[i], **kw) for v, kw in TMA_VARIANTS.items()}
                if m >= MIN_VARIANT_ROWS:
                    calls |= {v: lambda i, kw=kw: linear_triton(x, weights[i], out=outs[i], tma=False, **kw)
                              for v, kw in LAUNCH_VARIANTS.items() if bn == 64 or not v.startswith("w")}
                    if bn == 64:
                        calls["ws128-"] = lambda i: linear_partials_triton(x, weights[i], split=True, block_m=128, block_n=128)
                times = {}
                for v, fn in calls.items():
                    try:
                        if v not in ("cublas", "ws128-"):
                            fn(0)
                            torch.cuda.synchronize()
                            bits &= torch.equal(outs[0], base_y)
                        times[v] = graph_time_us(fn, copies)
                    except Exception as e:  # a variant that does not compile here: reported, not fatal
                        print(f"  {v} failed at {name} M={m}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                        times[v] = float("nan")
                bound = max((wbytes + 2 * m * k + 2 * m * n) / bw, 2 * m * n * k / rate) * 1e6
                line = f"{model:5} {name:8} {n:6} {k:5} {m:4} {bound:7.1f}" + "".join(f" {times.get(c, float('nan')):7.1f}" for c in cols)
                line += f" {times['engine'] / times['old']:7.2f} {times['engine'] / times['cublas']:7.2f}"
                line += f" {times['engine'] / bound:7.2f} {'ok' if bits else 'DIFF':>5}"
                rows_out.append(line)
                print(line, flush=True)
            del weights
            torch.cuda.empty_cache()
    print("\n".join(["", "summary (µs per call)"] + rows_out))


if __name__ == "__main__":
    main()

"""The persistent linear whose K groups meet in order (kernels/matmul_ordered.py) beside cuBLAS, the
engine's launch and the bound, with a bitwise check at every point.

GEMM (x [M, K] @ W[N, K].T, bf16) at every dense linear shape of Qwen3-8B, Qwen2.5-1.5B and
Qwen3-30B-A3B for M in {1, 16, 64, 128, 256}:
  bound   max(weight + activation + output bytes / read bandwidth, 2MNK / matmul rate), both
          measured here first (kernels_vs_vendor.ceilings)
  cublas  torch.matmul (its algorithm depends on M: not batch-invariant)
  engine  linear_triton as the engine calls it (split / fused / TMA / warp-specialized picks)
  o*      kernels.matmul.linear_ordered at speed-only options (VARIANTS): o64 / o128 rows per
          program (default programs an SM: as many as fit), o64p1 / o64p2 one or two 64-row
          programs an SM, o64n128 / o128n128 128-wide tiles
  best/cub, best/eng, best/bnd  the fastest o* variant against cuBLAS, the engine, the bound
  bits    'ok' when every o* variant's output equals the engine's bitwise and the engine's rows
          at M equal its rows computed alone (M = 1, the AR step) for the first, middle and last row
Times: median over CUDA-graph replays of 16 back-to-back calls, rotating over enough weight
copies to exceed the L2, in µs per call (kernels_vs_vendor.graph_time_us).

  python3 benchmarks/linear_ordered.py [--models 8b,1.5b,30b] [--rows 1,16,64,128,256] [--variants o64,o128]
  python3 benchmarks/linear_ordered.py --smoke   one launch (the 8B qkv at 128 rows, 3 K groups) against
                                                 the engine's; run it under a timeout first on a new GPU
                                                 or Triton: a persistent grid that deadlocked hangs its process
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # kernels_vs_vendor.py, also when loaded by path
from kernels_vs_vendor import L2_BYTES, SHAPES, ceilings, graph_time_us  # noqa: E402

from jetspec_chat.kernels.matmul import linear_ordered, linear_triton  # noqa: E402

VARIANTS = {  # name -> linear_ordered keywords
    "o64": dict(block_m=64),
    "o64p1": dict(block_m=64, programs_per_sm=1),
    "o64p2": dict(block_m=64, programs_per_sm=2),
    "o64n128": dict(block_m=64, block_n=128),
    "o128": dict(block_m=128),
    "o128n128": dict(block_m=128, block_n=128),
}


def smoke() -> None:
    """One launch against the engine's: prints 'smoke ok' or 'smoke DIFF'."""
    x = torch.randn(128, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(6144, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    y = linear_ordered(x, w)
    torch.cuda.synchronize()
    print("smoke ok" if torch.equal(y.view(torch.int16), linear_triton(x, w).view(torch.int16)) else "smoke DIFF", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="8b,1.5b,30b")
    ap.add_argument("--rows", default="1,16,64,128,256")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--smoke", action="store_true", help="one launch, checked; nothing timed")
    args = ap.parse_args()
    if args.smoke:
        smoke()
        return
    torch.manual_seed(0)
    variants = {v: VARIANTS[v] for v in args.variants.split(",")}
    bw, rate = ceilings()
    print(f"device {torch.cuda.get_device_name()}  read {bw / 1e12:.2f} TB/s  bf16 matmul {rate / 1e12:.0f} TFLOP/s")
    head = f"{'model':5} {'linear':8} {'N':>6} {'K':>5} {'M':>4} {'bound':>7} {'cublas':>7} {'engine':>7}"
    head += "".join(f" {v:>8}" for v in variants)
    head += f" {'best/cub':>8} {'best/eng':>8} {'best/bnd':>8} {'bits':>5}"
    lines = [head]
    print(head, flush=True)
    for model in args.models.split(","):
        for name, n, k in SHAPES[model]:
            wbytes = 2 * n * k
            copies = max(1, min(32, int(3 * L2_BYTES // wbytes) + 1))
            weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
            for m in [int(r) for r in args.rows.split(",")]:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
                engine_y = linear_triton(x, weights[0])
                ok = all(torch.equal(linear_triton(x[r:r + 1], weights[0])[0], engine_y[r]) for r in sorted({0, m // 2, m - 1}))
                t_engine = graph_time_us(lambda i: linear_triton(x, weights[i], out=outs[i]), copies)
                t_cublas = graph_time_us(lambda i: torch.matmul(x, weights[i].T, out=outs[i]), copies)
                times = {}
                for v, kw in variants.items():
                    try:
                        y = linear_ordered(x, weights[0], **kw)
                        torch.cuda.synchronize()
                        same = torch.equal(y.view(torch.int16), engine_y.view(torch.int16))
                        ok &= same
                        if not same:
                            print(f"  {v} differs from the engine at {name} M={m}", flush=True)
                        times[v] = graph_time_us(lambda i, kw=kw: linear_ordered(x, weights[i], out=outs[i], **kw), copies)
                    except Exception as e:  # a variant that does not compile here: reported, not fatal
                        print(f"  {v} failed at {name} M={m}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                        times[v] = float("nan")
                bound = max((wbytes + 2 * m * k + 2 * m * n) / bw, 2 * m * n * k / rate) * 1e6
                best = min((t for t in times.values() if t == t), default=float("nan"))
                line = f"{model:5} {name:8} {n:6} {k:5} {m:4} {bound:7.1f} {t_cublas:7.1f} {t_engine:7.1f}"
                line += "".join(f" {times[v]:8.1f}" for v in variants)
                line += f" {best / t_cublas:8.2f} {best / t_engine:8.2f} {best / bound:8.2f} {'ok' if ok else 'DIFF':>5}"
                lines.append(line)
                print(line, flush=True)
            del weights
            torch.cuda.empty_cache()
    print("\n".join(["", "summary (µs per call)"] + lines))


if __name__ == "__main__":
    main()

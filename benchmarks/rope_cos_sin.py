"""RoPE's cos/sin table: the one Triton launch (kernels/rope.py) against torch's formula
(`rope_cos_sin_ref`, ~7 kernels), CUDA-graphed, and whether the two tables are equal bit for bit.

    python3 benchmarks/rope_cos_sin.py [--rows 1,16,64,257] [--dims 64,128] [--reps 50]

Each time is µs per call: a CUDA graph of REPEAT calls back to back (as inside a forward's
graph, launch gaps included), replayed `--reps` times, the median divided by REPEAT. Output
bf16 (the engine's dtype); "factor" is YaRN's attention factor (1.0: the multiply is skipped).
`equal` compares both tables of the timed shape bit for bit; `differing of 0..200k` counts the
elements that differ in any bit among the tables at every position 0..200,000 (cos and sin, fp32
and bf16, frequencies of theta 1e6 and log-uniform random ones: 0 is bitwise equality).
"""
from __future__ import annotations

import argparse

import torch

from jetspec_chat.bench.timing import graphed_us_per_call
from jetspec_chat.kernels import rope_cos_sin_ref, rope_cos_sin_triton

REPEAT = 20


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def differing(a, b) -> int:
    """Elements of the (cos, sin) tables a and b that differ in any bit."""
    return sum(int((x.view(torch.int16 if x.dtype == torch.bfloat16 else torch.int32)
                    != y.view(torch.int16 if y.dtype == torch.bfloat16 else torch.int32)).sum()) for x, y in zip(a, b))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="1,16,64,257")
    p.add_argument("--dims", default="64,128")
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args()
    device = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    print(f"{torch.cuda.get_device_name(device)}; µs per call (CUDA graph of {REPEAT}), bf16 tables")
    print(f"{'T':>4} {'D':>4} {'factor':>6} {'torch µs':>9} {'triton µs':>10}  equal  differing of 0..200k")
    every = torch.arange(200_001, device=device)
    for d in (int(x) for x in args.dims.split(",")):
        theta = (1.0 / 1e6 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)).float().to(device)
        rand = torch.exp(torch.empty(d // 2).uniform_(-18.5, 0.0, generator=g)).to(device)
        for factor in (1.0, 1.3):
            wide = sum(
                differing(rope_cos_sin_triton(every, f, factor, dt), rope_cos_sin_ref(every, f, factor, dt))
                for f in (theta, rand) for dt in (torch.float32, torch.bfloat16)
            )
            for t in (int(x) for x in args.rows.split(",")):
                pos = torch.randint(0, 100_000, (t,), device=device)
                ref = lambda: rope_cos_sin_ref(pos, theta, factor, torch.bfloat16)  # noqa: E731
                fused = lambda: rope_cos_sin_triton(pos, theta, factor, torch.bfloat16)  # noqa: E731
                us_ref = graphed_us_per_call(ref, args.reps, REPEAT)
                us_fused = graphed_us_per_call(fused, args.reps, REPEAT)
                print(f"{t:>4} {d:>4} {factor:>6} {us_ref:9.2f} {us_fused:10.2f}  {str(same(ref(), fused())):5}  {wide}")


if __name__ == "__main__":
    main()

"""What an L2-resident weight would save each linear: the engine's GEMM (and cuBLAS) at the
Qwen2.5-1.5B and Qwen3-8B decoder shapes, M = 1 and 64, with the weight streamed from HBM
(rotating copies past the 50 MB L2, as a decode step reads it) against the same weight called
16 times in a row (from L2 wherever it fits). The ratio bounds what prefetching a weight into L2
while the GPU's memory is idle (norms, attention, the merges) could take off that GEMM.

    python3 benchmarks/weights_in_l2.py [--reps 25]

Runs from the repository root (benchmarks/linear.py's shapes, weights and graph timing).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import linear as L  # noqa: E402

from jetspec_chat.kernels import linear_triton  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=25)
    args = p.parse_args()
    print(f"{torch.cuda.get_device_name()}; µs per call, CUDA-graphed; HBM: rotating weight copies, L2: one weight 16 times")
    print(f"{'model':6} {'weight':8} {'M':>3} {'MB':>7}  {'ours HBM':>9} {'ours L2':>8} {'L2/HBM':>6}  {'cuBLAS HBM':>10} {'cuBLAS L2':>9}")
    for model, name, n, k, bias in L.SHAPES:
        if model not in ("1.5B", "8B"):
            continue
        cold, b = L.make_weights(n, k, bias, seed=0)
        warm = [cold[0]] * 16
        for m in (1, 64):
            x = torch.randn(m, k, device="cuda").to(L.DTYPE)
            ours = lambda w: linear_triton(x, w, b)  # noqa: E731
            vendor = lambda w: torch.nn.functional.linear(x, w, b)  # noqa: E731
            c, h = L.graphed_us(ours, cold, args.reps), L.graphed_us(ours, warm, args.reps)
            cb, hb = L.graphed_us(vendor, cold, args.reps), L.graphed_us(vendor, warm, args.reps)
            print(f"{model:6} {name:8} {m:3d} {cold[0].nbytes / 1e6:7.1f}  {c:9.2f} {h:8.2f} {h / c:6.2f}  {cb:10.2f} {hb:9.2f}",
                  flush=True)


if __name__ == "__main__":
    main()

"""A target for Nsight Compute: the tree attention at the Qwen3-8B shape (bf16, the engine's
33,792-position cache), each case compiled and warmed first, then run once between
cudaProfilerStart and cudaProfilerStop, and flash `scaled_dot_product_attention` at the first
case's shape after them. The cases: verify(128) at 8,192 and 512 keys, the AR call at 8,192,
verify(256) at 8,192.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section LaunchStats \\
        --section Occupancy --section WarpStateStats python3 benchmarks/tree_attention_ncu.py

Runs from the repository root (benchmarks/tree_attention.py builds the inputs).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402

import tree_attention as bench  # noqa: E402  (benchmarks/tree_attention.py)

CASES = [bench.Case("8b", 128, 8192), bench.Case("8b", 128, 512), bench.Case("8b", 1, 8192),
         bench.Case("8b", 256, 8192)]


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    inputs = [bench.Inputs(case, 33792, bench.tree_attention, gen) for case in CASES]
    for x in inputs:
        for _ in range(3):
            x.new()
    sdpa = bench.Sdpa(CASES[0], inputs[0])
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for x in inputs:
        x.new()
    sdpa()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# The Qwen3.5-family hybrids (Gated DeltaNet) on one GPU: the recurrent tree-walk kernel's tests
# and the hybrid engine test (fp32 speculative = transformers, bf16 speculative = AR, greedy
# rounds CUDA-graphed), then `bench --engine-only` at the real shapes with random weights: AR step
# and verify(1..256) against their bounds (weights + the recurrent state read and written), the
# tree stash per tree size, peak memory; `kernel`: the tree-walk kernel alone per layer
# (benchmarks/gated_delta.py) at both shapes and four program shapes.
# Usage: hybrid_check.sh [tests|kernel|35b|27b|all] (default all). Not timed yet on a GPU: each
# step has its own timeout (tests 240 s, kernel 2 × 120 s, each bench 280 s); if `all` runs past
# one call's limit, run the verbs in separate calls.
# Results go to $OUT (the run tool's output folder) or ./gpu-out.
set -uo pipefail
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
verb=${1:-all}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
bench() {  # $1: model id, $2: output name
  timeout 280 python3 -m jetspec_chat bench "random:$1" --draft-head random:1 --engine-only --contexts 512 \
    --tree-sizes 1,16,64,128,256 --warmup 2 --reps 5 --json-out "$OUT/$2.json" 2>&1 | tee "$OUT/$2.txt" | tail -40
}
case $verb in tests|all)
  timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_gated_delta_kernel.py \
    tests/engine/test_gpu.py -k "gated or hybrid" 2>&1 | tee "$OUT/tests.txt" | tail -8 ;;
esac
case $verb in kernel|all)
  for vh in 32 48; do
    timeout 120 python3 benchmarks/gated_delta.py --v-heads $vh --shapes 32x4,16x1,16x2,64x4 2>&1 | tee -a "$OUT/kernel.txt"
  done ;;
esac
case $verb in 35b|all) bench Qwen/Qwen3.6-35B-A3B bench35b ;; esac
case $verb in 27b|all) bench Qwen/Qwen3.8-27B bench27b ;; esac

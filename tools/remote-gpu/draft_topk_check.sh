#!/usr/bin/env bash
# The draft's per-depth top-k in one fused kernel (kernels/top_logprobs.py), on one GPU (≤ 150 s),
# from the repository root, results under $OUT/drafttopk/:
#   1. its GPU tests (the engine's shape 15 x 151,936 at k = 8 / 32 / 64, fp32 and bf16, against the
#      reference's ids; a CUDA-graph replay) and the tree build's;
#   2. benchmarks/draft_topk.py: the fused kernel (chunk 2048 / 4096 / 8192) against torch's
#      log_softmax + topk, µs per call CUDA-graphed, `same ids` against the reference;
#   3. the engine-only bench of the 1.5B shape (random weights, a random 2-layer head): draft ms
#      and the round at budgets 32 and 64;
#   4. in the time left, the graphed engine GPU tests (lossless, graphed = eager).
#
#   PY="python3" bash tools/remote-gpu/draft_topk_check.sh
set -u
PY=${PY:-python3}
dir=${OUT:-.}/drafttopk
mkdir -p "$dir"
start=$SECONDS
budget=150
left() { echo $((budget - (SECONDS - start))); }

echo "== kernel tests" | tee "$dir/tests.txt"
timeout 40 $PY -m pytest -q -x -p no:cacheprovider tests/kernels/test_top_logprobs_kernel.py 2>&1 | tail -6 | tee -a "$dir/tests.txt"

echo "== kernel benchmark, at $((SECONDS - start)) s" | tee "$dir/bench_kernel.txt"
timeout 40 $PY benchmarks/draft_topk.py --reps 30 2>&1 | tail -20 | tee -a "$dir/bench_kernel.txt"

echo "== engine bench, at $((SECONDS - start)) s" | tee "$dir/bench_engine.txt"
timeout $(($(left) - 15)) $PY -m jetspec_chat bench random:Qwen/Qwen2.5-Coder-1.5B-Instruct --draft-head random:2 \
  --engine-only --contexts 512 --tree-sizes 1,32,64 --json-out "$dir/engine.json" > "$dir/engine.log" 2>&1 \
  || echo "engine bench failed or ran out of time" | tee -a "$dir/bench_engine.txt"
tail -30 "$dir/engine.log" | tee -a "$dir/bench_engine.txt"

l=$(left)
echo "== engine GPU tests, at $((SECONDS - start)) s (${l} s left)" | tee "$dir/engine_tests.txt"
if [ "$l" -gt 10 ]; then
  timeout "$l" $PY -m pytest -q -p no:cacheprovider tests/engine/test_gpu.py \
    -k "graphed_fp32_is_lossless or graphed_greedy_equals_eager_greedy or launches_only" 2>&1 | tail -8 | tee -a "$dir/engine_tests.txt"
fi
echo "done at $((SECONDS - start)) s" | tee -a "$dir/engine_tests.txt"

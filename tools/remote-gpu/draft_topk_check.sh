#!/usr/bin/env bash
# The draft's per-depth top-k in one fused kernel (kernels/top_logprobs.py), on one GPU (BUDGET s,
# 150 by default), from the repository root, results under $OUT/draft_topk/:
#   1. its GPU tests (the engine's shape 15 x 151,936 at k = 8 / 32 / 64, fp32 and bf16, against the
#      reference's ids; a CUDA-graph replay; the small interpreter shapes compiled);
#   2. benchmarks/draft_topk.py: the fused kernel against torch's log_softmax + topk, µs per call
#      CUDA-graphed, `same ids` against the reference: chunk 2048 / 4096 / 8192 at k = 32, then the
#      engine's chunk at k = 8 and 64;
#   3. the graphed engine GPU tests that run the new draft graph: fp32 lossless against transformers,
#      graphed = eager, bf16 speculative = bf16 AR (tiny dense models);
#   4. in the time left, the engine-only bench of the 1.5B shape (random weights, a random 2-layer
#      head): the round at budgets 32 and 64 (its draft phase holds the tree build).
#
#   PY="python3" [BUDGET=150] bash tools/remote-gpu/draft_topk_check.sh
set -u
PY=${PY:-python3}
dir=${OUT:-.}/draft_topk
mkdir -p "$dir"
start=$SECONDS
budget=${BUDGET:-150}
left() { echo $((budget - (SECONDS - start))); }

echo "== kernel tests" | tee "$dir/tests.txt"
timeout 45 $PY -m pytest -q -p no:cacheprovider tests/kernels/test_top_logprobs_kernel.py -k "not sm90" 2>&1 \
  | tail -6 | tee -a "$dir/tests.txt"

echo "== kernel benchmark, at $((SECONDS - start)) s" | tee "$dir/bench_kernel.txt"
timeout 30 $PY benchmarks/draft_topk.py --depths 15,16 --ks 32 --reps 30 2>&1 | tail -8 | tee -a "$dir/bench_kernel.txt"
timeout 20 $PY benchmarks/draft_topk.py --depths 15 --ks 8,64 --chunks 4096 --reps 30 2>&1 | tail -6 | tee -a "$dir/bench_kernel.txt"

echo "== engine GPU tests, at $((SECONDS - start)) s" | tee "$dir/engine_tests.txt"
timeout 45 $PY -m pytest -q -p no:cacheprovider tests/engine/test_gpu.py \
  -k "(graphed_fp32_is_lossless or graphed_greedy_equals_eager_greedy) and not moe or bf16_speculation_equals_bf16_ar and (qwen3] or llama])" \
  2>&1 | tail -8 | tee -a "$dir/engine_tests.txt"

l=$(left)
echo "== engine bench, at $((SECONDS - start)) s (${l} s left)" | tee "$dir/bench_engine.txt"
if [ "$l" -gt 20 ]; then
  timeout "$l" $PY -m jetspec_chat bench random:Qwen/Qwen2.5-Coder-1.5B-Instruct --draft-head random:2 \
    --engine-only --contexts 512 --tree-sizes 1,32,64 --json-out "$dir/engine.json" > "$dir/engine.log" 2>&1 \
    || echo "engine bench failed or ran out of time" | tee -a "$dir/bench_engine.txt"
  tail -30 "$dir/engine.log" | tee -a "$dir/bench_engine.txt"
fi
echo "done at $((SECONDS - start)) s" | tee -a "$dir/bench_engine.txt"

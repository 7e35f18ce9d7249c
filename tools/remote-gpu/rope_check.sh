#!/usr/bin/env bash
# RoPE's cos/sin table in one Triton launch (kernels/rope.py), on one GPU (BUDGET s, 280 by
# default), from the repository root, results under $OUT/rope/:
#   1. its GPU tests: bit for bit against torch's formula at positions 0..200,000 for the engine's
#      rotaries (theta 1e6, Llama 3, YaRN, Gemma 4 proportional, the hybrid's partial rotary) and
#      random frequencies, fp32 and bf16 tables, int64 and int32 positions; a CUDA-graph replay;
#   2. benchmarks/rope_cos_sin.py: the one launch against torch's ~7 kernels, µs per call
#      CUDA-graphed, at T = 1 / 16 / 64 / 257 rows, D = 64 / 128;
#   3. the graphed engine GPU tests whose forwards now build their tables with it (bf16
#      speculative = bf16 AR, fp32 lossless, YaRN and proportional targets, the hybrid);
#   4. in the time left, where OLD_SRC names an extracted tree of the revision before (or git can
#      `git archive` it: OLD_REV, de0718a by default), the engine-only A/B of the 1.5B shape.
#
#   PY="python3" [BUDGET=280] [OLD_REV=de0718a] [OLD_SRC=DIR] bash tools/remote-gpu/rope_check.sh
set -u
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
dir=${OUT:-.}/rope
mkdir -p "$dir"
start=$SECONDS
budget=${BUDGET:-280}
left() { echo $((budget - (SECONDS - start))); }

$PY -c "import jetspec_chat.kernels.rope" 2>/dev/null \
  || $PY -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
  || { echo "install failed"; exit 9; }
$PY -c "import torch, triton, jetspec_chat.kernels.rope as r; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__, r.__file__)" \
  | tee "$dir/device.txt"

echo "== kernel tests" | tee "$dir/tests.txt"
timeout 90 $PY -m pytest -q -p no:cacheprovider tests/kernels/test_rope_kernel.py 2>&1 | tail -15 | tee -a "$dir/tests.txt"

echo "== kernel benchmark, at $((SECONDS - start)) s" | tee "$dir/bench_kernel.txt"
timeout 45 $PY benchmarks/rope_cos_sin.py --reps 30 2>&1 | tail -20 | tee -a "$dir/bench_kernel.txt"

echo "== engine GPU tests, at $((SECONDS - start)) s" | tee "$dir/engine_tests.txt"
timeout 70 $PY -m pytest -q -p no:cacheprovider tests/engine/test_gpu.py \
  -k "bf16_speculation_equals_bf16_ar and (qwen3] or llama] or gpt-oss]) or graphed_fp32_is_lossless and not moe or windowed_targets or hybrid_targets_on_cuda and not moe" \
  2>&1 | tail -8 | tee -a "$dir/engine_tests.txt"

l=$(left)
echo "== engine A/B, at $((SECONDS - start)) s (${l} s left)" | tee "$dir/engine_ab.txt"
old=${OLD_REV:-de0718a}
src_arg=()
[ -n "${OLD_SRC:-}" ] && src_arg=(--old-src "$OLD_SRC")
if [ "$l" -lt 60 ]; then
  echo "skipped: too little time left" | tee -a "$dir/engine_ab.txt"
elif [ -z "${OLD_SRC:-}" ] && ! git cat-file -e "$old^{commit}" 2>/dev/null; then
  echo "skipped: no OLD_SRC and no git history holding $old" | tee -a "$dir/engine_ab.txt"
else
  timeout "$((l - 5))" $PY tools/remote-gpu/engine_ab.py "$old" ${src_arg[@]+"${src_arg[@]}"} --rounds 2 --out "$dir/ab" -- \
    random:Qwen/Qwen2.5-Coder-1.5B-Instruct --draft-head random:2 --contexts 512 --tree-sizes 1,64 \
    > "$dir/engine_ab.log" 2>&1 || echo "engine A/B failed or ran out of time" | tee -a "$dir/engine_ab.txt"
  tail -14 "$dir/engine_ab.log" | tee -a "$dir/engine_ab.txt"
fi
echo "done at $((SECONDS - start)) s" | tee -a "$dir/engine_ab.txt"

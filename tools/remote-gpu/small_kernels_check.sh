#!/usr/bin/env bash
# The round's one-launch small steps on one GPU, from the repository root, results under
# $OUT/small_kernels/ (BUDGET s, 300 by default):
#   1. their GPU tests: the greedy argmax (kernels/argmax.py), the acceptance and packing
#      (kernels/accept.py), the attention's key order (kernels/key_order.py), RoPE's cos/sin table
#      (kernels/rope.py), each bit for bit against the torch code it replaces, CUDA-graph replays;
#   2. their benchmarks against that torch code, µs per call CUDA-graphed (benchmarks/accept_pack.py,
#      visible_keys.py, rope_cos_sin.py);
#   3. the graphed engine GPU tests whose rounds go through them (fp32 lossless, bf16 speculative =
#      AR, graphed = eager, no stream sync, the windowed and hybrid targets);
#   4. in the time left, where OLD_SRC names an extracted tree of an older revision (or git can
#      `git archive` OLD_REV), the engine-only A/B of the 1.5B shape (AR round, round at budget 64).
#
#   PY="python3" [BUDGET=300] [OLD_REV=REV | OLD_SRC=DIR] bash tools/remote-gpu/small_kernels_check.sh
set -u
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
dir=${OUT:-.}/small_kernels
mkdir -p "$dir"
start=$SECONDS
left() { echo $((${BUDGET:-300} - (SECONDS - start))); }

$PY -c "import jetspec_chat.kernels.argmax" 2>/dev/null \
  || $PY -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
  || { echo "install failed"; exit 9; }
$PY -c "import torch, triton; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__)" \
  | tee "$dir/device.txt"

echo "== kernel tests" | tee "$dir/tests.txt"
timeout 150 $PY -m pytest -q -p no:cacheprovider tests/kernels/test_argmax_kernel.py tests/kernels/test_accept_kernel.py \
  tests/kernels/test_key_order.py tests/kernels/test_rope_kernel.py 2>&1 | tail -8 | tee -a "$dir/tests.txt"

echo "== kernel benchmarks, at $((SECONDS - start)) s" | tee "$dir/bench.txt"
for b in "accept_pack.py --reps 30" "visible_keys.py --reps 30" "rope_cos_sin.py --reps 30"; do
  timeout 45 $PY benchmarks/$b 2>&1 | tail -14 | tee -a "$dir/bench.txt"
done

echo "== engine GPU tests, at $((SECONDS - start)) s" | tee "$dir/engine_tests.txt"
timeout 120 $PY -m pytest -q -p no:cacheprovider tests/engine/test_gpu.py \
  -k "(graphed_fp32_is_lossless or bf16_speculation_equals_bf16_ar or graphed_greedy_equals_eager_greedy or never_syncs or windowed_targets or hybrid_targets_on_cuda) and not moe" \
  2>&1 | tail -8 | tee -a "$dir/engine_tests.txt"

l=$(left)
echo "== engine A/B, at $((SECONDS - start)) s (${l} s left)" | tee "$dir/engine_ab.txt"
if [ "$l" -lt 60 ] || { [ -z "${OLD_SRC:-}" ] && [ -z "${OLD_REV:-}" ]; }; then
  echo "skipped: no OLD_SRC / OLD_REV, or too little time left" | tee -a "$dir/engine_ab.txt"
else
  src_arg=(); [ -n "${OLD_SRC:-}" ] && src_arg=(--old-src "$OLD_SRC")
  timeout "$((l - 5))" $PY tools/remote-gpu/engine_ab.py "${OLD_REV:-HEAD}" ${src_arg[@]+"${src_arg[@]}"} --rounds 2 \
    --out "$dir/ab" -- random:Qwen/Qwen2.5-Coder-1.5B-Instruct --draft-head random:2 --contexts 512 --tree-sizes 1,64 \
    --round-budget 64 > "$dir/engine_ab.log" 2>&1 || echo "engine A/B failed or ran out of time" | tee -a "$dir/engine_ab.txt"
  tail -14 "$dir/engine_ab.log" | tee -a "$dir/engine_ab.txt"
fi
echo "done at $((SECONDS - start)) s" | tee -a "$dir/engine_ab.txt"

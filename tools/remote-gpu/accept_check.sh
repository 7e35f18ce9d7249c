#!/usr/bin/env bash
# The round's acceptance and packing in one Triton launch (kernels/accept.py), on one GPU (BUDGET s,
# 285 by default), from the repository root, results under $OUT/accept/:
#   1. its GPU tests: bit for bit against engine/accept.py's torch code (accept + pack_round) on
#      random and bucket-padded trees of 1-1024 nodes, a CUDA-graph replay, finish_round on CUDA
#      against the CPU's;
#   2. benchmarks/accept_pack.py: the one launch against the torch code, µs per call CUDA-graphed,
#      at the verify buckets (1 ... 256 nodes);
#   3. the graphed engine GPU tests whose rounds go through finish_round (fp32 lossless, graphed =
#      eager greedy and sampling, no stream sync, the round's launches, the hybrid's path commit),
#      on the dense tiny targets;
#   4. in the time left, where OLD_SRC names an extracted tree of the revision before (or git can
#      `git archive` it: OLD_REV, de0718a by default), the engine-only A/B of the 1.5B shape
#      (AR round and the round at budget 64).
#
#   PY="python3" [BUDGET=285] [OLD_REV=de0718a] [OLD_SRC=DIR] bash tools/remote-gpu/accept_check.sh
set -u
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
dir=${OUT:-.}/accept
mkdir -p "$dir"
start=$SECONDS
budget=${BUDGET:-285}
left() { echo $((budget - (SECONDS - start))); }

$PY -c "import jetspec_chat.kernels.accept" 2>/dev/null \
  || $PY -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
  || { echo "install failed"; exit 9; }
$PY -c "import torch, triton, jetspec_chat.kernels.accept as a; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__, a.__file__)" \
  | tee "$dir/device.txt"

echo "== kernel tests" | tee "$dir/tests.txt"
timeout 70 $PY -m pytest -q -p no:cacheprovider tests/kernels/test_accept_kernel.py 2>&1 | tail -15 | tee -a "$dir/tests.txt"

echo "== kernel benchmark, at $((SECONDS - start)) s" | tee "$dir/bench_kernel.txt"
timeout 40 $PY benchmarks/accept_pack.py --reps 30 2>&1 | tail -12 | tee -a "$dir/bench_kernel.txt"

echo "== engine GPU tests, at $((SECONDS - start)) s" | tee "$dir/engine_tests.txt"
timeout 100 $PY -m pytest -q -p no:cacheprovider tests/engine/test_gpu.py --durations=5 \
  -k "(graphed_fp32_is_lossless or graphed_greedy_equals_eager_greedy or graphed_sampling_is_reproducible or never_syncs or launches_only_its_graphs or hybrid_targets_on_cuda) and not moe" \
  2>&1 | tail -14 | tee -a "$dir/engine_tests.txt"

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
  timeout "$((l - 5))" $PY tools/remote-gpu/engine_ab.py "$old" "${src_arg[@]}" --rounds 2 --out "$dir/ab" -- \
    random:Qwen/Qwen2.5-Coder-1.5B-Instruct --draft-head random:2 --contexts 512 --tree-sizes 1,64 \
    > "$dir/engine_ab.log" 2>&1 || echo "engine A/B failed or ran out of time" | tee -a "$dir/engine_ab.txt"
  tail -14 "$dir/engine_ab.log" | tee -a "$dir/engine_ab.txt"
fi
echo "done at $((SECONDS - start)) s" | tee -a "$dir/engine_ab.txt"

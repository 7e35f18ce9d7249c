#!/usr/bin/env bash
# The tensor-parallel exchange's consumer reading the peers' slots in place, on 2 GPUs, from the
# repository root, results under $OUT/tp_in_place/ (BUDGET s, 295 by default):
#   1. the kernels' GPU tests of Partials read in place through an address table
#      (tests/kernels/test_partials_in_place.py: bitwise the stacked form's outputs);
#   2. the exchange's GPU test (the peers' slots read in place by add_rms_norm = the NCCL
#      all-gather's bits, eager and CUDA-graphed) and bf16 speculative = AR under --tp 2;
#   3. tools/tp_exchange_bench.py: µs per exchange + consumer, in place vs the stacked form;
#   4. in the time left, where OLD_SRC names an extracted tree of an older revision (or git can
#      `git archive` OLD_REV), the 8B-shape engine-only A/B at --tp 2 (AR step, verify(128),
#      round@128), alternating runs (else this tree's --tp 2 bench alone); then the same bench at
#      --tp 1 for the TP=2 / TP=1 ratios.
#
#   PY="python3" [BUDGET=295] [OLD_REV=REV | OLD_SRC=DIR] bash tools/remote-gpu/tp_in_place_check.sh
set -u
dir=${OUT:-.}/tp_in_place
mkdir -p "$dir"
budget=295
source "$(dirname "$0")/tp_check_env.sh"

echo "== kernel tests (parts read in place)" | tee "$dir/tests.txt"
timeout "$(cap 60)" $PY -m pytest -q -p no:cacheprovider tests/kernels/test_partials_in_place.py 2>&1 | tail -5 | tee -a "$dir/tests.txt"

echo "== exchange and engine GPU tests, at $((SECONDS - start)) s" | tee -a "$dir/tests.txt"
timeout "$(cap 100)" $PY -m pytest -q -p no:cacheprovider tests/engine/test_gpu_parallel.py \
  -k "symmetric_exchange or (bf16_speculation_equals_bf16_ar and 64 and not nccl)" 2>&1 | tail -6 | tee -a "$dir/tests.txt"

echo "== exchange bench, at $((SECONDS - start)) s" | tee "$dir/exchange.txt"
timeout "$(cap 70)" $PY -m torch.distributed.run --nproc-per-node 2 tools/tp_exchange_bench.py 2>"$dir/exchange.err" \
  | tee -a "$dir/exchange.txt" || tail -c 2000 "$dir/exchange.err"

# OLD_REV without OLD_SRC needs it in git history (a copied tree may have none).
if [ -n "${OLD_REV:-}" ] && [ -z "${OLD_SRC:-}" ] && ! git cat-file -e "${OLD_REV}^{commit}" 2>/dev/null; then
  echo "OLD_REV $OLD_REV is not in this tree's git history: no A/B"; OLD_REV=
fi
BENCH=(random:Qwen/Qwen3-8B --draft-head random:5 --contexts 512 --tree-sizes 1,128 --round-budget 128 --reps 10 --profile-rounds 0)
l=$(left)
echo "== engine A/B at --tp 2, at $((SECONDS - start)) s (${l} s left)" | tee "$dir/engine_ab.txt"
mkdir -p "$dir/ab"
if [ "$l" -lt 80 ] || { [ -z "${OLD_SRC:-}" ] && [ -z "${OLD_REV:-}" ]; }; then
  echo "no A/B (no OLD_SRC / OLD_REV, or too little time left): this tree at --tp 2 alone" | tee -a "$dir/engine_ab.txt"
  timeout "$(cap 75)" $PY -m jetspec_chat bench "${BENCH[@]}" --engine-only --tp 2 --json-out "$dir/ab/new-0.json" \
    > "$dir/tp2.log" 2>&1 || { echo "the --tp 2 bench failed or ran out of time"; tail -c 2000 "$dir/tp2.log"; } | tee -a "$dir/engine_ab.txt"
else
  src_arg=(); [ -n "${OLD_SRC:-}" ] && src_arg=(--old-src "$OLD_SRC")
  rounds=2; [ "$l" -lt 200 ] && rounds=1  # ~35 s a bench; ~45 s kept for --tp 1
  timeout "$((l - 45))" $PY tools/remote-gpu/engine_ab.py "${OLD_REV:-HEAD}" ${src_arg[@]+"${src_arg[@]}"} --rounds "$rounds" \
    --out "$dir/ab" -- "${BENCH[@]}" --tp 2 > "$dir/engine_ab.log" 2>&1 || echo "engine A/B failed or ran out of time" | tee -a "$dir/engine_ab.txt"
  tail -10 "$dir/engine_ab.log" | tee -a "$dir/engine_ab.txt"
fi

l=$(left)
echo "== --tp 1 for the ratios, at $((SECONDS - start)) s (${l} s left)" | tee "$dir/tp1.txt"
if [ "$l" -lt 45 ]; then
  echo "skipped: too little time left" | tee -a "$dir/tp1.txt"
else
  timeout "$((l - 3))" $PY -m jetspec_chat bench "${BENCH[@]}" --engine-only --tp 1 --json-out "$dir/tp1.json" \
    > "$dir/tp1.log" 2>&1 || { echo "the --tp 1 bench failed or ran out of time"; tail -c 2000 "$dir/tp1.log"; } | tee -a "$dir/tp1.txt"
  $PY - "$dir" <<'PY' 2>&1 | tee -a "$dir/tp1.txt"
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
one = json.loads((d / "tp1.json").read_text())["models"][0]["bars"]
print(f"tp=1: AR step {one['ar_step_ms']:.3f} ms, round@{one['round_budget']} {one['round_ms']:.3f} ms, verify {one['verify_ms']}")
for run in sorted((d / "ab").glob("new-*.json")):
    two = json.loads(run.read_text())["models"][0]["bars"]
    print(f"tp=2 ({run.stem}): AR step {two['ar_step_ms']:.3f} ms = {two['ar_step_ms'] / one['ar_step_ms']:.3f}x (bar 0.6), "
          f"round {two['round_ms']:.3f} ms = {two['round_ms'] / one['round_ms']:.3f}x (bar 0.65)")
PY
fi
echo "done at $((SECONDS - start)) s" | tee -a "$dir/tp1.txt"

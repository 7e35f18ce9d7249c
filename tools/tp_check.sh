#!/usr/bin/env bash
# Tensor parallelism on a machine with >= 2 GPUs, in one run, every step under its own timeout
# (a step that hangs gets SIGUSR1 first: with JETSPEC_TP_STACKS set every rank prints its Python
# stacks, then it is killed) and the run goes on to the next step:
#  1. generate --tp N on random:tiny-qwen3: fp32 against transformers, bf16 speculative = AR;
#  2. the engine-only bench on the Qwen3-8B shape (random weights, 5-layer random head) at
#     --tp 1 and --tp N, context 512, trees of 1 and 128 nodes: AR step, verify, round@128;
#  3. tools/tp_exchange_bench.py: microseconds per rank-sum exchange (graphed, 1 and 128 rows);
#  4. the GPU test file (STEPS=... picks steps: gen, bench, exchange, tests; default all four).
# The TP=N / TP=1 ratios are printed at the end; every log and JSON goes into $OUT/tp_check.tgz.
# The 235B shape on 4 H200s (about 120 GB of weights per GPU; it does not fit 80 GB cards):
#   MODEL=random:Qwen/Qwen3-235B-A22B TP=4 STEPS=bench BENCH_TPS=4 TREES=1,16,64,128,256 BENCH_S=480 tools/tp_check.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 JETSPEC_TP_STACKS=1 PYTHONUNBUFFERED=1
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
OUT=${OUT:-tp_check_out}; mkdir -p "$OUT"
LOGS=$(mktemp -d)
trap 'tar -czf "$OUT/tp_check.tgz" -C "$LOGS" .' EXIT
MODEL=${MODEL:-random:Qwen/Qwen3-8B}
TP=${TP:-2}
STEPS=${STEPS:-gen,bench,exchange,tests}
REPS=${REPS:-10}  # bench: timed repetitions (BENCH_TPS="1 2": the TP sizes benched)

step() {  # step NAME SECONDS CMD...: stdout -> NAME.out, stderr -> NAME.err
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout -s USR1 -k 15 "$limit" "$@" >"$LOGS/$name.out" 2>"$LOGS/$name.err"
  local rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - t0)) s (limit $limit s)"
  if [ $rc -ne 0 ]; then tail -c 4000 "$LOGS/$name.err"; fi
  tail -n 4 "$LOGS/$name.out" | cut -c1-400
}

PROMPT="Write a function that reverses a list, then explain it."
if [[ $STEPS == *gen* ]]; then
  step gen_fp32 "${GEN_S:-150}" python3 -m jetspec_chat generate random:tiny-qwen3 --tp "$TP" --device cuda --dtype float32 \
    --raw --budget 16 --max-new-tokens 48 --prompt "$PROMPT" --json --check-lossless
  step gen_bf16 "${GEN_S:-90}" python3 -m jetspec_chat generate random:tiny-qwen3-moe --tp "$TP" --device cuda --dtype bfloat16 \
    --raw --budget 64 --max-new-tokens 64 --prompt "$PROMPT" --json --check-lossless=ar
fi
if [[ $STEPS == *bench* ]]; then
  for tp in ${BENCH_TPS:-1 $TP}; do
    step "bench_tp$tp" "${BENCH_S:-120}" python3 -m jetspec_chat bench "$MODEL" --draft-head random:5 --engine-only --tp "$tp" \
      --contexts 512 --tree-sizes "${TREES:-1,128}" --reps "$REPS" --profile-rounds 0 --json-out "$LOGS/bench_tp$tp.json"
  done
  python3 - "$LOGS" "$TP" <<'PY'
import json, sys
out, tp = sys.argv[1], sys.argv[2]
try:
    bars = {t: json.load(open(f"{out}/bench_tp{t}.json"))["models"][0]["bars"] for t in ("1", tp)}
except (OSError, KeyError, IndexError, ValueError) as err:
    sys.exit(f"no bench comparison: {err}")
one, n = bars["1"], bars[tp]
print(f"AR step: tp=1 {one['ar_step_ms']:.3f} ms, tp={tp} {n['ar_step_ms']:.3f} ms = {n['ar_step_ms'] / one['ar_step_ms']:.3f}x (bar 0.6)")
print(f"round@{one['round_budget']}: tp=1 {one['round_ms']:.3f} ms, tp={tp} {n['round_ms']:.3f} ms = "
      f"{n['round_ms'] / one['round_ms']:.3f}x (bar 0.65)")
for t in ("1", tp):
    print(f"tp={t} verify ms {bars[t]['verify_ms']}, round phases {bars[t].get('round_phases_ms')}")
PY
fi
if [[ $STEPS == *exchange* ]]; then
  step exchange "${EXCHANGE_S:-60}" python3 -m torch.distributed.run --nproc-per-node "$TP" tools/tp_exchange_bench.py

fi
if [[ $STEPS == *tests* ]]; then
  step tests "${TESTS_S:-300}" python3 -m pytest -x -q tests/engine/test_gpu_parallel.py ${PYTEST_K:+-k "$PYTEST_K"}
fi

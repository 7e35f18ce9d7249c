#!/usr/bin/env bash
# Tensor parallelism on a machine with >= 2 GPUs, in one run, every step under its own timeout
# (a step that hangs gets SIGUSR1 first: with JETSPEC_TP_STACKS set every rank prints its Python
# stacks, then it is killed) and the run goes on to the next step:
#  1. generate --tp N on random:tiny-qwen3: fp32 against transformers, bf16 speculative = AR;
#  2. the engine-only bench on the Qwen3-8B shape (random weights, 5-layer random head) at
#     --tp 1 and --tp N, context 512, trees of 1 and 128 nodes: AR step, verify, round@128;
#  3. tools/tp_exchange_bench.py: the engine's two exchanges give the same bits, and microseconds
#     per rank-sum exchange (ours with its consumer, read in place and stacked; NCCL's all-gather,
#     torch's one-shot; graphed, 1 and 128 rows);
#  4. the GPU test file (PYTEST_K picks cases).
# STEPS=... picks the steps and their order (default gen,bench,exchange,tests).
# The TP=N / TP=1 ratios and each GPU's peak memory (nvidia-smi, sampled every second) are
# printed; every log and JSON goes into $OUT/tp_check.tgz. TEE=1 also streams each step's stdout
# and stderr (progress). JETSPEC_TP_EXCHANGE=nccl: the engine exchanges
# through NCCL's all-gather only (the A/B against the symmetric-memory exchange).
# The 235B shape on 4 H200s (about 120 GB of weights per GPU; it does not fit 80 GB cards):
#   MODEL=random:Qwen/Qwen3-235B-A22B TP=4 STEPS=bench BENCH_TPS=4 TREES=1,16,64,128,256 REPS=3 BENCH_S=370 \
#     TEE=1 LOGS=$OUT/logs tools/tp_check.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 JETSPEC_TP_STACKS=1 PYTHONUNBUFFERED=1
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
OUT=${OUT:-tp_check_out}; mkdir -p "$OUT"
LOGS=${LOGS:-$(mktemp -d)}  # LOGS=$OUT/logs: the logs come back even from a run cut short
mkdir -p "$LOGS"
trap 'tar -czf "$OUT/tp_check.tgz" -C "$LOGS" .' EXIT
MODEL=${MODEL:-random:Qwen/Qwen3-8B}
TP=${TP:-2}
STEPS=${STEPS:-gen,bench,exchange,tests}
REPS=${REPS:-10}  # bench: timed repetitions (BENCH_TPS="1 2": the TP sizes benched)

step() {  # step NAME SECONDS CMD...: stdout -> NAME.out, stderr -> NAME.err
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  if [ -n "${TEE:-}" ]; then
    timeout -s USR1 -k 15 "$limit" "$@" 2> >(tee "$LOGS/$name.err" >&2) | tee "$LOGS/$name.out"
  else
    timeout -s USR1 -k 15 "$limit" "$@" >"$LOGS/$name.out" 2>"$LOGS/$name.err"
  fi
  local rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - t0)) s (limit $limit s)"
  if [ $rc -ne 0 ]; then tail -c 4000 "$LOGS/$name.err"; fi
  tail -n 4 "$LOGS/$name.out" | cut -c1-400
}

PROMPT="Write a function that reverses a list, then explain it."
run_gen() {
  step gen_fp32 "${GEN_S:-150}" python3 -m jetspec_chat generate random:tiny-qwen3 --tp "$TP" --device cuda --dtype float32 \
    --raw --budget 16 --max-new-tokens 48 --prompt "$PROMPT" --json --check-lossless
  step gen_bf16 "${GEN_S:-90}" python3 -m jetspec_chat generate random:tiny-qwen3-moe --tp "$TP" --device cuda --dtype bfloat16 \
    --raw --budget 64 --max-new-tokens 64 --prompt "$PROMPT" --json --check-lossless=ar
}
run_bench() {
  for tp in ${BENCH_TPS:-1 $TP}; do
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -l 1 >"$LOGS/memory_tp$tp.csv" 2>/dev/null &
    smi=$!
    step "bench_tp$tp" "${BENCH_S:-120}" python3 -m jetspec_chat bench "$MODEL" --draft-head random:5 --engine-only --tp "$tp" \
      --contexts 512 --tree-sizes "${TREES:-1,128}" --reps "$REPS" --profile-rounds 0 --json-out "$LOGS/bench_tp$tp.json"
    kill "$smi" 2>/dev/null
    awk -F', ' '{ if ($2 > m[$1]) m[$1] = $2 } END { for (g in m) printf "tp=%s: GPU %s peak %.1f GiB used (nvidia-smi)\n", tp, g, m[g] / 1024 }' \
      tp="$tp" "$LOGS/memory_tp$tp.csv" | sort
  done
  python3 - "$LOGS" "$TP" <<'PY'
import json, sys
out, tp = sys.argv[1], sys.argv[2]
for t in sorted({"1", tp}):
    try:
        print(f"tp={t} bars: {json.load(open(f'{out}/bench_tp{t}.json'))['models'][0]['bars']}")
    except (OSError, KeyError, IndexError, ValueError) as err:
        print(f"tp={t}: no bench result ({err})")
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
}
run_exchange() {
  step exchange "${EXCHANGE_S:-60}" python3 -m torch.distributed.run --nproc-per-node "$TP" tools/tp_exchange_bench.py
}
run_tests() {
  step tests "${TESTS_S:-300}" python3 -m pytest -x -q tests/engine/test_gpu_parallel.py ${PYTEST_K:+-k "$PYTEST_K"}
}
for s in ${STEPS//,/ }; do
  case $s in
    gen|bench|exchange|tests) "run_$s" ;;
    *) echo "unknown step: $s (gen, bench, exchange, tests)"; exit 2 ;;
  esac
done

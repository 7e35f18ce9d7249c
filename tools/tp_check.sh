#!/usr/bin/env bash
# Tensor parallelism on a machine with >= 2 GPUs, in one run:
#  1. the GPU tests (generate --tp 2: fp32 lossless against transformers, bf16 speculative = AR);
#  2. the engine-only bench on the Qwen3-8B shape (random weights, 5-layer random head) at
#     --tp 1 and --tp 2: AR step, verify(1..256), round@128 (tables, and JSON in $OUT);
#  3. bf16 speculative = AR on the 8B shape under --tp 2 (generate --check-lossless=ar).
# TP=N AR step / TP=1 AR step and the round@128 ratio are printed at the end.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
OUT=${OUT:-tp_check_out}; mkdir -p "$OUT"
MODEL=${MODEL:-random:Qwen/Qwen3-8B}
TP=${TP:-2}
python -m pytest -q tests/engine/test_gpu_parallel.py
for tp in 1 "$TP"; do
  python -m jetspec_chat bench "$MODEL" --draft-head random:5 --engine-only --tp "$tp" --contexts 512 \
    --json-out "$OUT/bench_tp$tp.json"
done
python -m jetspec_chat generate "$MODEL" --draft-head random:5 --tp "$TP" --raw --budget 64 --max-new-tokens 256 \
  --prompt "Write a Python function that parses an ISO 8601 date and explain each step." --json --check-lossless=ar \
  > "$OUT/lossless_tp$TP.json"
python - "$OUT" "$TP" <<'PY'
import json, sys
out, tp = sys.argv[1], sys.argv[2]
bars = {t: json.load(open(f"{out}/bench_tp{t}.json"))["models"][0]["bars"] for t in ("1", tp)}
one, n = bars["1"], bars[tp]
print(f"AR step: tp=1 {one['ar_step_ms']:.3f} ms, tp={tp} {n['ar_step_ms']:.3f} ms = {n['ar_step_ms'] / one['ar_step_ms']:.3f}x")
print(f"round@{one['round_budget']}: tp=1 {one['round_ms']:.3f} ms, tp={tp} {n['round_ms']:.3f} ms = {n['round_ms'] / one['round_ms']:.3f}x")
d = json.loads(open(f"{out}/lossless_tp{tp}.json").read().strip().splitlines()[-1])
print(f"bf16 speculative = AR under tp={tp}: {d['lossless']} ({d['new_tokens']} tokens, tau {d['mean_accept_length']})")
PY

#!/usr/bin/env bash
# Tensor parallelism on a machine with >= 2 GPUs: the GPU tests, then TP=1 against TP=2 on the
# Qwen3-8B shape (random weights, 5-layer random head) in one run: plain AR and speculative
# decoding at budget 128, each with its bf16 check against the engine's own AR answer.
# Prints one line per run: tp, mode, tokens/s, ms per round, lossless.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
python -m pytest -q tests/engine/test_gpu_parallel.py
MODEL=${MODEL:-random:Qwen/Qwen3-8B}
PROMPT="Write a Python function that parses an ISO 8601 date and explain each step."
for tp in 1 2; do
  for mode in ar spec; do
    extra=(--budget 128); [ "$mode" = ar ] && extra=(--no-spec)
    python -m jetspec_chat generate "$MODEL" --draft-head random:5 --tp "$tp" --raw --prompt "$PROMPT" \
      --max-new-tokens 256 --json --check-lossless=ar "${extra[@]}" |
      python -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); \
print(f\"tp={d['tp']} $mode tok/s={d['tokens_per_second']:.1f} ms/round={1e3*(d['seconds']-d['prefill_seconds'])/max(d['rounds'],1):.2f} lossless={d['lossless']}\")"
  done
done

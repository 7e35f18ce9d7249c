#!/usr/bin/env bash
# gpt-oss on one GPU, in one run:
#  1. the GPU tests of its MoE kernels (real gpt-oss-20b shapes: bf16 against the reference,
#     batch invariance, fp32, CUDA-graph capture) and of the engine on random:tiny-gpt-oss
#     (fp32 speculative = transformers, bf16 speculative = bf16 AR);
#  2. the engine-only bench on the gpt-oss-20b shape (random weights, 5-layer random head, ~42 GB
#     in bf16): AR step and verify(1..256) against their active-weight bounds (JSON in $OUT);
#  3. bf16 speculative = AR on the gpt-oss-20b shape (generate --check-lossless=ar);
#  4. the MoE block alone (benchmarks/moe_gpt_oss.py): its experts as stored and K-contiguous.
# The closing lines print AR and verify(N) as multiples of their weight-bytes bounds.
#     tools/gpt_oss_check.sh [all|tests|model]   (tests: step 1; model: steps 2-4)
set -euo pipefail
OUT=${OUT:-gpt_oss_check_out}; mkdir -p "$OUT"
MODEL=${MODEL:-random:openai/gpt-oss-20b}
PART=${1:-all}
if [ "$PART" != model ]; then
  python -m pytest -q tests/kernels/test_moe_gpt_oss_kernel.py
  python -m pytest -q tests/engine/test_gpu.py -k gpt
fi
[ "$PART" = tests ] && exit 0
python -m jetspec_chat bench "$MODEL" --draft-head random:5 --engine-only --contexts 512 \
  --tree-sizes 1,16,64,128,256 --json-out "$OUT/bench.json"
python -m jetspec_chat generate "$MODEL" --draft-head random:5 --raw --budget 64 --max-new-tokens 128 \
  --prompt "Write a Python function that parses an ISO 8601 date and explain each step." --json --check-lossless=ar \
  > "$OUT/lossless.json"
python benchmarks/moe_gpt_oss.py --rows 1,4,16,64,256 | tee "$OUT/moe_block.txt"
python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
m = json.load(open(f"{out}/bench.json"))["models"][0]
c = m["contexts"][0]
print(f"active weight bytes per AR step: {m['weight_bytes_per_ar_step'] / 1e9:.2f} GB")
print(f"AR step {c['ar_step_ms']['median']:.3f} ms = {c['ar_step_over_bound']:.2f}x its {c['ar_bound_ms']:.3f} ms bound")
for v in c["verify"]:
    print(f"verify({v['nodes']}) {v['ms']['median']:.3f} ms, {v['experts_per_layer']:.1f} experts/layer, "
          f"{v['over_bound']:.2f}x its {v['bound_ms']:.3f} ms bound")
d = json.loads(open(f"{out}/lossless.json").read().strip().splitlines()[-1])
print(f"bf16 speculative = AR: {d['lossless']} ({d['new_tokens']} tokens, tau {d['mean_accept_length']})")
PY

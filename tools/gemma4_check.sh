#!/usr/bin/env bash
# Gemma 4 on one GPU, in one run:
#  1. the GPU tests of its MoE kernel options (real gemma-4-26B-A4B shapes: bf16 against the
#     reference, batch invariance, fp32, CUDA-graph capture), of the tree attention kernel at its
#     head shapes in bf16 (head_dim 512 global layers, 32-key tiles and V split over two programs:
#     against the reference and each row bitwise its AR step; windowed 256 sliding layers), the
#     q/k norm + RoPE and KV write kernels at 512, the offline sm_90 compile of the 512 binaries
#     (shared memory, registers, spills), and of the
#     engine on random:tiny-gemma4 (fp32 speculative = transformers, bf16 speculative = bf16 AR,
#     prompts past its 8-key window);
#  2. the engine-only bench on the gemma-4-26B-A4B shape (random weights, 1-layer random head,
#     ~52 GB in bf16): AR step and verify(1..256) against their active-weight bounds, peak memory
#     (JSON in $OUT); then where a verify(128)'s time goes, kernel by kernel (benchmarks/step_profile.py).
# The closing lines print AR and verify(N) as multiples of their weight-bytes bounds.
#     tools/gemma4_check.sh [all|tests|model]   (tests: step 1; model: step 2)
# STEP_TIMEOUT (seconds, default 0: none) bounds each step; a step that fails or times out is
# reported and the next one runs.
set -uo pipefail
OUT=${OUT:-gemma4_check_out}; mkdir -p "$OUT"
MODEL=${MODEL:-random:google/gemma-4-26B-A4B-it}
PART=${1:-all}
T=${STEP_TIMEOUT:-0}
step() { echo "== $*"; timeout "$T" "$@" || echo "== FAILED ($?): $*"; }
if [ "$PART" != model ]; then
  step python -m pytest -q tests/kernels/test_moe_gemma4_kernel.py
  step python -m pytest -q tests/kernels/test_kernels.py -k "gemma4 or write_kv"
  step python tests/kernels/sm90_tree_attention_compile.py 512
  step python -m pytest -q tests/kernels/test_fused_kernels.py -k "qk_norm_rope_triton and 512"
  step python -m pytest -q tests/engine/test_gpu.py -k gemma4
fi
[ "$PART" = tests ] && exit 0
step python -m jetspec_chat bench "$MODEL" --draft-head random:1 --engine-only --contexts 512 \
  --tree-sizes 1,16,64,128,256 --json-out "$OUT/g4.json"
[ -f "$OUT/g4.json" ] || exit 1
python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
m = json.load(open(f"{out}/g4.json"))["models"][0]
c = m["contexts"][0]
print(f"active weight bytes per AR step: {m['weight_bytes_per_ar_step'] / 1e9:.2f} GB; peak memory "
      f"{(m.get('peak_memory_bytes') or 0) / 2**30:.1f} GiB")
print(f"AR step {c['ar_step_ms']['median']:.3f} ms = {c['ar_step_over_bound']:.2f}x its {c['ar_bound_ms']:.3f} ms bound")
for v in c["verify"]:
    print(f"verify({v['nodes']}) {v['ms']['median']:.3f} ms, {v['experts_per_layer']:.1f} experts/layer, "
          f"{v['over_bound']:.2f}x its {v['bound_ms']:.3f} ms bound")
PY
step python benchmarks/step_profile.py "$MODEL" --context 512 --nodes 128

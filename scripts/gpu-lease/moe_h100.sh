#!/usr/bin/env bash
# One GPU lease (~5 min) for the MoE target (issue 14): the MoE kernel's GPU tests and the engine's
# CUDA-path tests on random:tiny-qwen3-moe, the fused MoE block alone against its bytes bound, then
# the engine-only bench on random:Qwen/Qwen3-30B-A3B (bf16, random weights allocated on the GPU in
# bf16: ~61 GB; random 5-layer head): AR step vs its active-weight floor, verify(N) vs the expected
# expert-bytes bound, the whole round at budgets 64 and 16, peak memory. Results in $OUT (or ./gpu-out).
# Keep the working tree under 64 MiB: scripts/gpu-lease/heads_aside.sh out before the lease, in after.
set -uo pipefail
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" | tee -a "$OUT/gpu.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2

# 1. correctness on the GPU (~1 min): kernel vs reference at real shapes, graphs, determinism;
#    the graphed engine on the tiny MoE model (lossless vs transformers, one sync per round).
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_moe_kernel.py \
  tests/engine/test_gpu.py -k moe 2>&1 | tee "$OUT/tests.txt" | tail -12

# 2. the MoE block alone, 8 layers per graph (< 2 min), beside the previous kernel when its file is
#    in the tree (before the lease: git show b8bab39:kernels/moe.py > old_moe.py, untracked);
#    --sweep: the per-token down's knobs, its crossover, the grouped tiles (<= 4 min more).
OLD=(); [ -f old_moe.py ] && OLD=(--old old_moe.py)
timeout 240 python3 scripts/gpu-lease/moe_kernel_bench.py "${OLD[@]}" --json-out "$OUT/moe_kernel.json" 2>&1 | tee "$OUT/moe_kernel.txt"

# 3. Qwen3-30B-A3B engine-only (~2 min each): round at budget 64 with every verify size, then a
#    second run for the round at budget 16 (one tree size, the model is reloaded: ~10 s on the GPU).
B="python3 -m jetspec_chat bench random:Qwen/Qwen3-30B-A3B --draft-head random:5 --engine-only --dtype bfloat16 --contexts 512"
timeout 240 $B --tree-sizes 1,16,64,128,256 --round-budget 64 --json-out "$OUT/bench30b_b64.json" 2>&1 \
  | tee "$OUT/bench30b_b64.txt" | tail -45
timeout 150 $B --tree-sizes 1 --round-budget 16 --json-out "$OUT/bench30b_b16.json" 2>&1 \
  | tee "$OUT/bench30b_b16.txt" | tail -14
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
for name in ("bench30b_b64", "bench30b_b16"):
    try:
        m = json.load(open(f"{out}/{name}.json"))["models"][0]
    except (OSError, ValueError, KeyError, IndexError) as err:
        print(name, "missing:", err); continue
    c = m["contexts"][0]
    print(f"{name}: AR step {c['ar_step_ms']['median']:.3f} ms / active-weight floor {c['ar_bound_ms']:.3f} ms "
          f"= {c['ar_step_over_bound']:.2f}x; round@{m['bars']['round_budget']} {c['round_ms']['median']:.3f} ms; "
          f"peak {m['peak_memory_bytes'] / 2**30:.1f} GiB")
    for v in c["verify"]:
        print(f"  verify({v['nodes']}): {v['ms']['median']:.3f} ms, {v['experts_per_layer']:.1f} experts/layer, "
              f"bound {v['bound_ms']:.3f} ms, {v['over_bound']:.2f}x bound")
PY

#!/usr/bin/env bash
# The warp-specialized linear (kernels/matmul_ws.py) on an sm_90 GPU, one remote call. Verbs, any
# of them in order (default: tests sweep):
#   tests  its GPU tests: bitwise equal to the linear at the real shapes, M = 1-256, split and
#          fused, and with matmul.USE_WS on the engine's entry points M-invariant and as exact as cuBLAS
#   sweep  benchmarks/kernels_vs_vendor.py: every 1.5B / 8B / 30B-A3B linear shape x M = 1, 16, 64,
#          128, 256: cuBLAS, today's kernel, the engine's launch and the ws variants, in µs, with
#          the bound, the ratios and the bitwise check
#   ab     the 8B engine-only bench with USE_WS on against the same tree with it off (engine_ab.py;
#          the working copy's USE_WS is switched on here, never committed)
# Results go to $OUT (the run tool's output folder) or ./gpu-out.
set -uo pipefail
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
for verb in "${@:-tests sweep}"; do
  for v in $verb; do
    case "$v" in
      tests)
        timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_matmul_ws.py 2>&1 \
          | tee "$OUT/ws_tests.txt" | tail -15 ;;
      sweep)
        timeout 300 python3 benchmarks/kernels_vs_vendor.py --models 8b,1.5b,30b 2>&1 \
          | tee "$OUT/ws_sweep.txt" | grep -v "^  .* failed" | tail -80 ;;
      ab)
        old=$(mktemp -d); cp -r . "$old/src"
        sed -i 's/^USE_WS = False/USE_WS = True/' kernels/matmul.py
        grep -q '^USE_WS = True' kernels/matmul.py || { echo "USE_WS not found"; exit 3; }
        timeout 400 python3 tools/remote-gpu/engine_ab.py HEAD --old-src "$old/src" --rounds 2 --out "$OUT/ab" -- \
          random:Qwen/Qwen3-8B --draft-head random:5 --contexts 512 --tree-sizes 1,64,128,256 2>&1 \
          | tee "$OUT/ws_ab.txt" | tail -30
        sed -i 's/^USE_WS = True/USE_WS = False/' kernels/matmul.py ;;
      *) echo "unknown verb $v (tests, sweep, ab)"; exit 2 ;;
    esac
  done
done

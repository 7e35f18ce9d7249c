#!/usr/bin/env bash
# The wide tiles of the weights in one K group (kernels/matmul.py WideTile: gate_up, lm_head) on
# an sm_90 GPU, one remote call, <= 240 s, from the tree's root. $PY: the python prefix (default
# python3); WIDE_ARGS: more sweep arguments (e.g. "--rows 128,192,256 --linears gate_up");
# TESTS_S / SWEEP_S: the tests' and the sweep's time limits (95 / 130 s). Results under
# $OUT/wide_tiles (or ./gpu-out/wide_tiles):
#   tests.txt        tests/kernels/test_matmul_kernel.py on the GPU (not the offline compiles):
#                    every row at M = 1-256 equal to its own M = 1 call at the real shapes, and
#                    every GPU_WIDE_TILES tile equal to the engine's launch there, bitwise
#   wide_sweep.txt   benchmarks/kernels_vs_vendor.py --wide: the candidate tiles beside cuBLAS and
#   wide_sweep.json  the engine's launch at M = 64-256, the bits column and the suggested WIDE_PICKS
set -uo pipefail
PY=${PY:-python3}
R=${OUT:-./gpu-out}/wide_tiles; mkdir -p "$R"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$R/gpu.txt"
$PY -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "install failed"; exit 9; }
$PY -c "import torch, triton, jetspec_chat.kernels.matmul as m; print(torch.__version__, triton.__version__, m.__file__)" \
  | tee -a "$R/gpu.txt"
timeout ${TESTS_S:-95} $PY -m pytest -q -x -p no:cacheprovider tests/kernels/test_matmul_kernel.py -k "not sm90" > "$R/tests.txt" 2>&1
echo "===== tests rc=$?"; tail -8 "$R/tests.txt"
timeout ${SWEEP_S:-130} $PY benchmarks/kernels_vs_vendor.py --wide --out "$R" ${WIDE_ARGS:-} > "$R/wide_sweep_log.txt" 2>&1
echo "===== wide sweep rc=$?"; grep -v "failed at" "$R/wide_sweep_log.txt" | tail -40; grep -c "failed at" "$R/wide_sweep_log.txt"

#!/usr/bin/env bash
# One GPU lease: install, kernel + engine tests on the GPU, then the engine-only bench on
# Qwen3-8B shapes. Results go to $OUT (device tool) or ./gpu-out.
set -uo pipefail
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" | tee -a "$OUT/gpu.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
python3 -m pytest -q -x -p no:cacheprovider tests/test_kernels.py tests/test_gpu.py 2>&1 | tee "$OUT/tests.txt" | tail -15

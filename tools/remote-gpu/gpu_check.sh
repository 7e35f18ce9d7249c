#!/usr/bin/env bash
# One remote GPU call: install, the CUDA-path engine tests, then the engine-only bench on Qwen3-8B
# shapes (random weights, random 5-layer head). Results go to $OUT (the run tool's output folder) or ./gpu-out.
# Keep the working tree under 64 MiB: tools/remote-gpu/heads_aside.sh out before the remote calls, in after.
set -uo pipefail
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" | tee -a "$OUT/gpu.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/engine/test_gpu.py tests/kernels/test_fused_kernels.py 2>&1 | tee "$OUT/tests.txt" | tail -8
timeout 300 python3 -m jetspec_chat bench random:Qwen/Qwen3-8B --draft-head random:5 --engine-only \
  --contexts 512,2048,8192 --tree-sizes 1,16,32,64,128,256 --json-out "$OUT/bench8b.json" 2>&1 | tee "$OUT/bench8b.txt" | tail -60

#!/usr/bin/env bash
# One GPU lease (device tool) that measures the engine before/after a change in one run:
#   setup                 installs this checkout and stages the carried GGUF chunk
#   stage                 copies the carried chunk(s) into /root/stage
#   measure MODEL HEADDIR (carry HEADDIR and, for a baseline, its source in .stage/old, e.g.
#                         `git archive BASE | tar -x -C .stage/old`) assembles /root/stage/MODEL.gguf.part*, then: the engine-only bench on
#                         Qwen3-8B shapes; end to end on MODEL with HEADDIR (ar, spec, hf) for this
#                         checkout and the baseline; the greedy mismatch rate of spec vs AR (bf16)
#                         on the coding, chat and math sets. Results in $OUT.
# Keep the working tree under 64 MiB: scripts/heads_aside.sh out (and in afterwards); carry the head.
set -uo pipefail
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site JETSPEC_CHAT_CACHE=/root/cache
STAGE=/root/stage APP=/root/app
verb=${1:?verb}; shift

case $verb in
setup)
  mkdir -p $STAGE
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  rm -rf $APP && mkdir -p $APP && tar --exclude=./.stage --exclude=./.whl -cf - . | tar -xf - -C $APP
  python3 -m pip install -q --no-deps --no-build-isolation --target /root/newsite $APP 2>&1 | tail -2
  cp .stage/c*/* $STAGE/ 2>/dev/null; ls $STAGE
  ;;
stage)
  cp .stage/c*/* $STAGE/ && ls $STAGE | wc -l
  ;;
measure)
  model=${1:?model} head=${2:?head dir}
  if [ -d .stage/old ] && [ ! -d /root/oldsite ]; then
    python3 -m pip install -q --no-deps --no-build-isolation --target /root/oldsite ./.stage/old 2>&1 | tail -2
  fi
  gguf=/root/models/$model.gguf; mkdir -p /root/models
  [ -f $gguf ] || { cat $STAGE/$model.gguf.part* > $gguf && rm -f $STAGE/$model.gguf.part*; }
  sha256sum $gguf | tee "$OUT/gguf.sha256"
  cd $APP
  new="env PYTHONPATH=/root/newsite:/tmp/site python3 -P -m jetspec_chat"
  old="env PYTHONPATH=/root/oldsite:/tmp/site python3 -P -m jetspec_chat"
  for v in newsite oldsite; do PYTHONPATH=/root/$v python3 -c "import jetspec_chat.engine.engine as e; print(e.__file__)"; done
  PYTHONPATH=/root/newsite:/tmp/site timeout 240 python3 -P -m pytest -q -x -p no:cacheprovider tests/test_gpu.py \
    tests/test_fused_kernels.py $(ls tests/test_tree_build_kernel.py 2>/dev/null) 2>&1 | tail -15 | tee "$OUT/gpu_tests.txt"
  e2e="bench $gguf --draft-head $OLDPWD/$head --budgets 16,64,256 --prompt-sets coding,chat --prompts-n 4 --max-new-tokens 128 --warmup 1 --reps 1"
  timeout 200 $new $e2e --modes ar,spec,hf --json-out "$OUT/e2e_new.json" 2>&1 | grep -v "^\[bench\]" | tee "$OUT/e2e_new.txt"
  [ -d /root/oldsite ] && timeout 120 $old $e2e --modes ar,spec --json-out "$OUT/e2e_old.json" 2>&1 | grep -v "^\[bench\]" | tee "$OUT/e2e_old.txt"
  timeout 150 $new bench $gguf --draft-head $OLDPWD/$head --modes ar,spec --budgets 64 --prompt-sets coding,chat,math \
    --max-new-tokens 96 --warmup 1 --reps 1 --json-out "$OUT/mismatch.json" 2>&1 | grep -v "^\[bench\]" | tee "$OUT/mismatch.txt"
  timeout 200 $new bench random:Qwen/Qwen3-8B --draft-head random:5 --engine-only --contexts 512,8192 \
    --tree-sizes 1,16,64,128,256 --json-out "$OUT/bench8b.json" 2>&1 | tee "$OUT/bench8b.txt" | tail -40
  ;;
*) echo "unknown verb $verb"; exit 2 ;;
esac

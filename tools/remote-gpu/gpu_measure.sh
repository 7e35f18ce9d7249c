#!/usr/bin/env bash
# Remote GPU calls that measure the engine before/after a change in one run:
#   setup                 installs this checkout and stages the carried GGUF chunk
#   stage                 copies the carried chunk(s) into /root/stage
#   assemble MODEL        (carry, for a baseline, its source in .stage/old, e.g. `git archive BASE |
#                         tar -x -C .stage/old`, heads excluded) assembles /root/stage/MODEL.gguf.part*,
#                         installs the baseline, runs the GPU tests
#   e2e MODEL HEADDIR     (carry HEADDIR) end to end on MODEL (ar, spec, hf) for this checkout and the baseline
#   engine MODEL HEADDIR  engine-only bench on Qwen3-8B shapes and on MODEL (bars, GPU idle, kernel table)
#   mismatch MODEL HEADDIR the greedy mismatch rate of spec vs AR (bf16) on the coding, chat and math sets
#   datagen MODEL BATCH N the data stage of train-head alone on N prompts (its tokens/s)
# Each verb fits one device call (<10 min); issue them back to back. Results in $OUT.
# Keep the working tree under 64 MiB: tools/remote-gpu/heads_aside.sh out (and in afterwards); carry the head.
set -uo pipefail
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site JETSPEC_CHAT_CACHE=/root/cache
STAGE=/root/stage APP=/root/app
NEW="env PYTHONPATH=/root/newsite:/tmp/site python3 -P -m jetspec_chat"
OLD="env PYTHONPATH=/root/oldsite:/tmp/site python3 -P -m jetspec_chat"
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
assemble)
  model=${1:?model}
  gguf=/root/models/$model.gguf; mkdir -p /root/models
  [ -f $gguf ] || { cat $STAGE/$model.gguf.part* > $gguf && rm -f $STAGE/$model.gguf.part*; }
  sha256sum $gguf | tee "$OUT/gguf.sha256"
  if [ -d .stage/old ] && [ ! -d /root/oldsite ]; then
    python3 -m pip install -q --no-deps --no-build-isolation --target /root/oldsite ./.stage/old 2>&1 | tail -2
  fi
  cd $APP
  for v in newsite oldsite; do PYTHONPATH=/root/$v python3 -c "import jetspec_chat.engine.engine as e; print(e.__file__)"; done
  PYTHONPATH=/root/newsite:/tmp/site timeout 400 python3 -P -m pytest -q -x -p no:cacheprovider tests/engine/test_gpu.py \
    tests/kernels/test_fused_kernels.py tests/kernels/test_tree_build_kernel.py 2>&1 | tail -15 | tee "$OUT/gpu_tests.txt"
  ;;
e2e)
  model=${1:?model} head=$PWD/${2:?head dir}; gguf=/root/models/$model.gguf
  cd $APP
  e2e="bench $gguf --draft-head $head --budgets 16,64,256 --prompt-sets coding,chat --prompts-n 4 --max-new-tokens 128 --warmup 1 --reps 1"
  timeout 270 $NEW $e2e --modes ar,spec,hf --json-out "$OUT/e2e_new.json" 2>&1 | grep -v "^\[bench\]" | tee "$OUT/e2e_new.txt"
  [ -d /root/oldsite ] && timeout 200 $OLD $e2e --modes ar,spec --json-out "$OUT/e2e_old.json" 2>&1 | grep -v "^\[bench\]" | tee "$OUT/e2e_old.txt"
  ;;
engine)
  model=${1:?model} head=$PWD/${2:?head dir}; gguf=/root/models/$model.gguf
  cd $APP
  timeout 200 $NEW bench random:Qwen/Qwen3-8B --draft-head random:5 --engine-only --contexts 512,8192 \
    --tree-sizes 1,16,64,128,256 --json-out "$OUT/bench8b.json" 2>&1 | tee "$OUT/bench8b.txt" | tail -45
  timeout 120 $NEW bench $gguf --draft-head $head --engine-only --contexts 512 --tree-sizes 1,16,64 \
    --round-budget 64 --json-out "$OUT/engine_small.json" 2>&1 | tee "$OUT/engine_small.txt" | tail -30
  ;;
mismatch)
  model=${1:?model} head=$PWD/${2:?head dir}; gguf=/root/models/$model.gguf
  cd $APP
  timeout 250 $NEW bench $gguf --draft-head $head --modes ar,spec --budgets 64 --prompt-sets coding,chat,math \
    --max-new-tokens 96 --warmup 1 --reps 1 --json-out "$OUT/mismatch.json" 2>&1 | grep -v "^\[bench\]" | tee "$OUT/mismatch.txt"
  ;;
datagen)  # the data stage's throughput: datagen MODEL BATCH PROMPTS
  model=${1:?model} bs=${2:?batch} n=${3:?prompts}; gguf=/root/models/$model.gguf
  cd $APP
  rm -rf /root/dgen-$bs
  timeout 300 $NEW train-head $gguf --out /root/dgen-$bs --stage data --num-prompts $n --gen-batch-size $bs \
    --max-new-tokens 256 --max-prompt-tokens 768 --quiet 2>&1 | tail -8 | tee "$OUT/datagen-$bs.txt"
  cp /root/dgen-$bs/summary.json "$OUT/datagen-$bs.json"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader | tee -a "$OUT/datagen-$bs.txt"
  ;;
*) echo "unknown verb $verb"; exit 2 ;;
esac

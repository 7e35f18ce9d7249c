#!/usr/bin/env bash
# Batch-invariant kernels checked and timed on a remote GPU machine, then the bf16 lossless sweep
# and the engine-only timings on the real Qwen2.5-Coder-1.5B. Reuses train_heads.sh for the
# remote plumbing (setup: wheels + the app copied to /root/app; stage: the GGUF chunks).
#
#   here:   bash tools/remote-gpu/train_heads.sh prepare q15      (.stage/c-q15-00..17, .stage/h-q15, .stage/c-hq15-00..01)
#           python3 tools/remote-gpu/heldout_prompts.py > .stage/heldout/heldout.jsonl
#           git show OLD:kernels/tree_attention.py > .stage/oldattn/old_tree_attention.py  (OLD: the revision to beat)
#           git show OLD:kernels/moe.py > .stage/oldmoe/old_moe.py
#   remote: train_heads.sh setup (carry .whl .stage/h-q15 .stage/heldout .stage/oldattn .stage/oldmoe);
#           bf16_exact.sh tests; bf16_exact.sh kernels
#           train_heads.sh stage (carry .stage/c-q15-NN, .stage/c-hq15-N) x 20
#           bf16_exact.sh ab OLD ; bf16_exact.sh sweep builtin ; bf16_exact.sh sweep heldout ; bf16_exact.sh moe
#           (bf16_exact.sh moe-tune: the MoE tile sweep, no staging; setup carrying .whl is enough)
# No staging at all for the bundled shapes (random weights): here
#           mkdir -p .stage/old-OLD && git archive OLD | tar -x -C .stage/old-OLD --exclude='engine/models/heads'
#   remote: train_heads.sh setup (carry .whl .stage/old-OLD); bf16_exact.sh shapes-ab OLD 1.5b (then 8b, moe)
#           (bf16_exact.sh trees-ab NEW OLD 1.5b: two staged older trees, .stage/old-NEW against .stage/old-OLD;
#            ROUNDS=4 for more alternations)
set -uo pipefail
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site JETSPEC_CHAT_CACHE=/root/cache
STAGE=/root/stage APP=/root/app
verb=${1:?verb}; shift
cd $APP

case $verb in
tests)  # the GPU tests of the kernels (one call) ...
  timeout 570 python3 -P -m pytest -q -p no:cacheprovider tests/kernels/test_kernels.py tests/kernels/test_matmul_kernel.py \
    tests/kernels/test_fused_kernels.py tests/kernels/test_launch_fusion.py tests/kernels/test_moe_kernel.py \
    2>&1 | tee $OUT/tests.txt | tail -15
  ;;
engine-tests)  # ... and of the engine's CUDA path (another call)
  timeout 570 python3 -P -m pytest -q -p no:cacheprovider tests/engine/test_gpu.py 2>&1 | tee $OUT/engine-tests.txt | tail -15
  ;;
kernels)  # kernel timings, old vs new in one run: the attention (+ its MAX_SPLITS sweep), the MoE block
  timeout 330 python3 benchmarks/tree_attention.py --old $STAGE/oldattn/old_tree_attention.py --sweep \
    --json-out $OUT/attention_bench.json 2>&1 | tee $OUT/attention_bench.txt | tail -45
  timeout 200 python3 benchmarks/moe_block.py --old $STAGE/oldmoe/old_moe.py --json-out $OUT/moe_bench.json \
    2>&1 | tee $OUT/moe_bench.txt | tail -22
  ;;
ab)  # whole-engine A/B against revision OLD in one run (engine_ab.py): the real 1.5B, then Qwen3-8B shapes
  old=${1:?old revision}
  gguf=$(bash tools/remote-gpu/train_heads.sh assemble q15 | tail -1)
  bash tools/remote-gpu/train_heads.sh join q15 || exit 1
  timeout 280 python3 tools/remote-gpu/engine_ab.py $old --out $OUT/ab-q15 -- $gguf --draft-head $STAGE/h-q15 \
    --dtype bfloat16 --contexts 512 --tree-sizes 1,16,64,128 2>&1 | tail -25
  timeout 300 python3 tools/remote-gpu/engine_ab.py $old --out $OUT/ab-8b -- random:Qwen/Qwen3-8B --draft-head random:5 \
    --contexts 512 --tree-sizes 1,16,64,128 2>&1 | tail -25
  ;;
shapes-ab|trees-ab)  # whole-engine A/B against OLD on a bundled shape (random weights, no staging): 1.5b, 8b or moe
  # trees-ab NEW OLD WHICH: the staged tree old-NEW stands in for the working tree (two older commits compared)
  if [ $verb = trees-ab ]; then
    new=${1:?new revision}; shift
    site=/tmp/site-$new
    [ -d $site ] || python3 -m pip install -q --no-deps --no-build-isolation --target $site $STAGE/old-$new || exit 1
    export PYTHONPATH=$site:$PYTHONPATH  # engine_ab's "new" bench imports it; its "old" one puts OLD first
  fi
  old=${1:?old revision} which=${2:?1.5b, 8b or moe}
  case $which in
  1.5b) args="random:Qwen/Qwen2.5-Coder-1.5B-Instruct --draft-head random --tree-sizes 1,16,32,64,128 --round-budget 64" rounds=2 ;;
  8b)   args="random:Qwen/Qwen3-8B --draft-head random:5 --tree-sizes 1,16,64,128" rounds=2 ;;
  moe)  args="random:Qwen/Qwen3-30B-A3B --draft-head random:5 --tree-sizes 1,16,64,128,256" rounds=1 ;;
  *) echo "shapes-ab: 1.5b, 8b or moe" >&2; exit 2 ;;
  esac
  timeout 560 python3 tools/remote-gpu/engine_ab.py $old --rounds ${ROUNDS:-$rounds} --old-src $STAGE/old-$old \
    --out $OUT/ab-$which -- $args --contexts 512 2>&1 | tail -30
  ;;
moe)  # Qwen3-30B-A3B shapes (random weights, random 5-layer head): steps, verifies vs their expert bytes, rounds
  timeout 400 python3 -m jetspec_chat bench random:Qwen/Qwen3-30B-A3B --draft-head random:5 --engine-only \
    --contexts 512 --tree-sizes 1,16,64,128,256 --json-out $OUT/engine-moe.json 2>&1 | tail -30
  for b in 16 64; do  # the whole round at budgets 16 and 64 (the run above: 128)
    timeout 150 python3 -m jetspec_chat bench random:Qwen/Qwen3-30B-A3B --draft-head random:5 --engine-only \
      --contexts 512 --tree-sizes 1 --round-budget $b --json-out $OUT/engine-moe-r$b.json 2>&1 \
      | grep -E "whole round|peak"
  done
  ;;
moe-tune)  # the MoE tile sweep; its best tile written into this copy's kernels/moe.py; old vs new, then the engine
  cp kernels/moe.py /root/old_moe.py
  timeout 230 python3 benchmarks/moe_block.py --sweep --budget-s 150 --json-out $OUT/moe-sweep.json \
    > $OUT/moe-sweep.txt 2>&1; grep -E "^ +(token|crossover)|per-token down:|token_rows=|^mean|TILE for" $OUT/moe-sweep.txt
  tile=$(sed -n 's/^TILE for kernels\/moe.py: //p' $OUT/moe-sweep.txt)
  [ -n "$tile" ] || { echo "the sweep chose no tile" >&2; exit 1; }
  python3 -c "import re, sys; p = 'kernels/moe.py'; s = open(p).read()
open(p, 'w').write(re.sub(r'TILE = MoeTile\([^)]*\)', 'TILE = ' + sys.argv[1], s, count=1))" "$tile"
  grep -n "^TILE" kernels/moe.py
  timeout 120 python3 benchmarks/moe_block.py --rows 1,2,4,16,64 --old /root/old_moe.py --json-out $OUT/moe-ab.json 2>&1 \
    | tee $OUT/moe-ab.txt | grep -A9 "^---" | head -10
  bash tools/remote-gpu/bf16_exact.sh moe
  ;;
profile)  # where an AR step and a verify(64) spend their time, kernel by kernel (1.5B, 8B shapes)
  bash tools/remote-gpu/train_heads.sh assemble q15 > /dev/null || exit 1
  timeout 300 python3 benchmarks/step_profile.py /root/models/q15.gguf random:Qwen/Qwen3-8B \
    --json $OUT/profile.json > $OUT/profile.txt 2>&1; grep -A12 "^==" $OUT/profile.txt
  ;;
refresh)  # this call's working tree replaces /root/app (a code change while the machine stays warm)
  cd - > /dev/null && rm -rf $APP && mkdir -p $APP && tar --exclude=./.stage --exclude=./.whl -cf - . | tar -xf - -C $APP
  cd $APP && python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
  ;;
sweep)  # bf16 greedy: every speculative answer against the same engine's AR answer (=AR column)
  which=${1:?builtin or heldout}
  prompts="--prompt-sets coding,chat,math"
  [ $which = heldout ] && prompts="--prompts $STAGE/heldout/heldout.jsonl"
  gguf=$(bash tools/remote-gpu/train_heads.sh assemble q15 | tail -1)
  bash tools/remote-gpu/train_heads.sh join q15 || exit 1
  timeout 570 python3 -m jetspec_chat bench $gguf --draft-head $STAGE/h-q15 --device cuda --dtype bfloat16 \
    --modes ar,spec --budgets 16,64,256 $prompts --max-new-tokens 256 --warmup 1 --reps 1 \
    --json-out $OUT/sweep-$which.json 2>&1 | tee $OUT/sweep-$which.txt | tail -40
  ;;
engine)  # engine-only step and round timings: the real 1.5B, then Qwen3-8B shapes (random weights)
  gguf=$(bash tools/remote-gpu/train_heads.sh assemble q15 | tail -1)
  bash tools/remote-gpu/train_heads.sh join q15 || exit 1
  timeout 240 python3 -m jetspec_chat bench $gguf --draft-head $STAGE/h-q15 --engine-only --dtype bfloat16 \
    --contexts 512,2048 --tree-sizes 1,16,64,128,256 --json-out $OUT/engine-q15.json 2>&1 | tail -30
  timeout 300 python3 -m jetspec_chat bench random:Qwen/Qwen3-8B --draft-head random:5 --engine-only \
    --contexts 512,2048,8192 --tree-sizes 1,16,64,128,256 --json-out $OUT/engine-8b.json 2>&1 | tail -30
  ;;
*) echo "unknown verb $verb" >&2; exit 2 ;;
esac

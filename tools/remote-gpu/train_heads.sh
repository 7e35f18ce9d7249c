#!/usr/bin/env bash
# REMOTE-GPU WORKFLOW SCRIPT: trains the embedded models' draft heads on a remote GPU machine
# reached by a run-one-command tool (each call sends the working tree, at most 64 MiB; the
# machine starts bare, reaches nothing, and is given back 30 s after a call). Not part of the
# app; docs/training.md explains the recipe, this file only moves files and starts runs.
#
# Here, before the remote calls (CPU, no GPU):
#   tools/remote-gpu/train_heads.sh prepare KEY [GGUF] [HEAD]   split the model's GGUF (default: assembled
#       from the installed weight packages) into .stage/c-KEY-NN/ (one <=60 MiB chunk a folder; a head
#       over 40 MiB likewise into .stage/c-hKEY-NN/), make the
#       mixed training contexts (half ShareGPT, half built-in; train-head --stage prompts, the `train`
#       extra) gzipped into .stage/prompts-KEY/, copy the shipped head (or the folder HEAD: a head an
#       earlier remote run trained, collected and unpacked, to continue it) to .stage/h-KEY; then
#       tools/remote-gpu/heads_aside.sh out, and the remote calls it prints (both models can be
#       staged for one machine: their chunks have their own names).
# On the machine, one remote call each, back to back (OUT is the run tool's output folder):
#   setup                 installs the carried .whl wheels and this checkout, copies what .stage/ carries
#                         to /root/stage, runs the GPU tests of the kernels a run depends on
#   stage                 copies the carried .stage/ folders to /root/stage (GGUF chunks, heads, prompts)
#   launch KEY [MINUTES] [DATA_MINUTES] [SKIP] [LR]  assembles the GGUF (sha256 checked) and starts, in the
#                         background (setsid), the run (`run_grown` below, ~MINUTES, default 18, of which
#                         DATA_MINUTES, default 4, answer prompts) into /root/runs/KEY
#                         (it runs this script's `run` verb); both models' runs may share the GPU. SKIP
#                         (default 0): the staged head's steps on these same answers on an earlier machine,
#                         so that training reads on from where that run stopped (--skip-batches). LR
#                         (default 4e-4): the peak learning rate
#   poll SECONDS          waits (at most SECONDS, less once every run is DONE) and shows the logs
#   collect KEY [FROM]    tars head/, eval.json, the baseline's eval, logs and summaries (once), and puts
#                         15 MiB parts FROM.. (at most 4: a call returns <= 64 MiB) into $OUT
#   answer KEY MINUTES    the data stage alone, in the background: the target answers the carried
#                         contexts for MINUTES (a machine spent on data; training comes on a later one)
#   collect-data KEY [FROM]  the answers (data/ shards + the prompts they answer), gzipped, as 15 MiB
#                         parts FROM.. into $OUT. Put the parts in .stage/data-KEY/ here: the next
#                         `prepare KEY` chunks them (.stage/c-dKEY-NN, staged like the GGUF), and the
#                         next `launch` or `answer` starts from them (its data stage answers only the
#                         contexts they do not cover; DATA_MINUTES 0 skips it). They may come from
#                         other PROMPTS flags (another --seed): old and new answers then train together.
#   evaluate NAME KEY HEAD [WIDTH]  τ of a head folder in /root/stage on the dev prompts and eval sets (tree
#                         width WIDTH, default 32, the engine's), in the background
#   compare KEY STEPS "A" "B"  two head shapes from scratch on the same (built-in) data and steps
# KEY: q15 (qwen2.5-coder-1.5b) or q05 (qwen2.5-coder-0.5b).
set -uo pipefail
OUT=${OUT:-./gpu-out}
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site JETSPEC_CHAT_CACHE=/root/cache
STAGE=/root/stage RUNS=/root/runs APP=/root/app  # on the remote machine
verb=${1:?verb}; shift

declare -A ALIAS=([q05]=qwen2.5-coder-0.5b [q15]=qwen2.5-coder-1.5b)
declare -A SHA=(
  [q05]=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
  [q15]=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
)
# The shapes the shipped heads grow into (--init embeds the shipped head exactly: train-head's
# `load_grown`), int8 under the 100 MB limit. 1.5B: 1 layer x MLP 2048 -> 2 x 6144 (77M
# parameters, ~77 MB), the depth the like-for-like check favoured (docs/training.md) with 3x the MLP;
# 0.5B: 2 x 2432 -> 3 x 4864, the target's own width (49M, ~49 MB).
declare -A HEAD=(
  [q05]="--draft-layers 3 --intermediate-size 4864"
  [q15]="--draft-layers 2 --intermediate-size 6144 --taps 1,9,17,25"
)
# The prompts: the SAME flags here (prepare) and there (launch), so the run finds the carried
# OUT/prompts.jsonl (its prompts.meta.json key matches) and never reads the dataset. Half real
# ShareGPT chats (~2/3 multi-turn, <= 3,072 characters), half built-in generator prompts (the
# run on chats alone lost 17-20% dev τ). The 1.5B alone on an H200 answers
# ~150 contexts a second (94,437 in 641 s); training reads ~70 a second. So
# 13 minutes of answers alone (`answer`, ~100,000) feed a later machine's ~20 minutes of
# training; 140,000 asked for (all 49,236 of ShareGPT's distinct contexts + 70,000 built-in)
# outlast it: it answers a seeded random order of length-sorted batches, a fair sample.
# Seed 6 with 300,000 (ShareGPT 25% of the contexts instead of 41%): the
# 1.5B head continued on 60,928 of its answers lost τ on both eval sets, chat most (docs/training.md).
# Self-prompts: half of the built-in half (35,000) are the target's own proposals, made and answered
# first by the data stage on the GPU (the prepare here leaves them out): single-turn asks in users'
# words, like the eval sets, and new to every head so far.
# Now 0.9 of it (63,000; ~6 minutes to propose). The proposal requests are a seeded
# sequence, so the first 35,000 repeat the 0.5 share's asks; the rest are new.
PROMPTS="--prompt-source mixed --num-prompts 140000 --seed 5 --self-prompts 0.9 --max-prompt-tokens 1024 --eval-prompts 8"
DATA="--max-new-tokens 256 --gen-batch-size 512 --temperature 0"
# Continue the shipped head, grown: its recipe (block 16, 16 x 128 blocks a step, depth decay 8)
# at the peak lr LR (launch's fifth argument; 4e-4, the gentler lr of the earlier --init runs, by
# default); int8 export. The time budget ends it. 4e-4 over answers the head had mostly
# seen already lost τ, so a head continued on old answers may want less.
FIT="--block-size 16 --batch-size 16 --anchors-per-seq 128 --epochs 2 --eval-every 0 --export-dtype int8"
# At the engine's default width (32; earlier heads were measured at width 8).
EVAL="--eval-budgets 16,32,64,128,256 --eval-sets coding,chat --eval-max-new-tokens 128"

# /root/models/KEY.gguf from the staged parts (once), checked against its sha256; prints the path.
assemble() {
  local key=$1 gguf=/root/models/$1.gguf
  mkdir -p /root/models
  if [ ! -f $gguf ]; then
    ls $STAGE/$key.gguf.part* > /dev/null || { echo "no $key.gguf.part* in $STAGE" >&2; return 1; }
    cat $STAGE/$key.gguf.part* > $gguf.tmp && rm -f $STAGE/$key.gguf.part*
    local sum=$(sha256sum $gguf.tmp | cut -d' ' -f1)
    [ "$sum" = "${SHA[$key]}" ] || { echo "sha256 mismatch for $key: $sum" >&2; rm -f $gguf.tmp; return 1; }
    mv $gguf.tmp $gguf
  fi
  echo $gguf
}

# Here: FILE in MIB-MiB parts NAME.partNNN, each in its own folder .stage/PREFIX-NN (one a call;
# `take_stage` puts them back side by side, where a glob of NAME.part* reads them in order).
chunks() {
  local file=$1 mib=$2 name=$3 prefix=$4 tmp=.stage/split-$4 i=0
  rm -rf $tmp .stage/$prefix-* && mkdir -p $tmp
  split -b ${mib}m -d -a 3 "$file" $tmp/$name.part
  for part in $tmp/$name.part*; do
    local folder=$(printf ".stage/$prefix-%02d" $i)
    mkdir -p $folder && mv $part $folder/ && i=$((i+1))
  done
  rm -rf $tmp
}

# /root/stage/h-KEY/model.safetensors from its carried chunks, when prepare split it (sha256 checked).
join_head() {
  local head=$STAGE/h-$1
  [ -f $head/model.safetensors ] && return 0
  ls $STAGE/h-$1.safetensors.part* > /dev/null || { echo "no h-$1.safetensors.part* in $STAGE" >&2; return 1; }
  cat $STAGE/h-$1.safetensors.part* > $head/model.safetensors
  [ "$(sha256sum $head/model.safetensors | cut -d' ' -f1)" = "$(cat $head/model.safetensors.sha256)" ] \
    || { echo "sha256 mismatch for the h-$1 head" >&2; rm -f $head/model.safetensors; return 1; }
}

# $RUNS/KEY, fresh: the carried answers (KEY-data.tar.gz.part*, from an earlier machine's
# collect-data), then the carried prompts. Answers are keyed by their context's sha, so they may
# come from an earlier prompt set (another --seed): the data stage answers only the staged
# contexts they do not cover, and training reads them all (but this set's dev prompts).
init_run() {
  local key=$1 dir=$RUNS/$1
  [ -f $STAGE/prompts-$key/prompts.jsonl.gz ] || { echo "carry .stage/prompts-$key first" >&2; return 1; }
  rm -rf $dir && mkdir -p $dir
  if ls $STAGE/$key-data.tar.gz.part* > /dev/null 2>&1; then
    cat $STAGE/$key-data.tar.gz.part* | tar -xzf - -C $dir || { echo "the carried $key answers do not unpack" >&2; return 1; }
    local same="from these prompts"
    cmp -s <(gunzip -c $STAGE/prompts-$key/prompts.jsonl.gz) $dir/prompts.jsonl || same="from another prompt set"
    echo "carried answers: $(ls $dir/data/shard-*.pt | wc -l) shards, $same"
  fi
  gunzip -c $STAGE/prompts-$key/prompts.jsonl.gz > $dir/prompts.jsonl
  cp $STAGE/prompts-$key/prompts.meta.json $dir/
}

# The data stage of $RUNS/KEY: the target answers its contexts not answered yet, for MINUTES.
data_stage() {
  local key=$1 gguf=$2 minutes=$3 dir=$RUNS/$1
  echo "data $(date +%T)" >> $dir/stage.txt
  python3 -m jetspec_chat train-head $gguf --quiet $PROMPTS --out $dir --stage data $DATA --time-budget-min $minutes \
    > $dir/data.txt 2>&1 || return 1
  cp $dir/summary.json $dir/summary-data.json  # each stage rewrites summary.json: keep each one's (head_record.py)
}

# ARCHIVE's 15 MiB parts (split once, into PARTS) FROM.. into $OUT: at most 4 a call (a call returns <= 64 MiB).
send_parts() {
  local archive=$1 parts=$2 from=$3 i part
  mkdir -p "$OUT" $parts
  ls $parts/*.part* > /dev/null 2>&1 || split -b 15m -d -a 2 $archive $parts/$(basename $archive).part
  for i in 0 1 2 3; do
    part=$parts/$(basename $archive).part$(printf %02d $((from + i)))
    [ -f $part ] && cp $part "$OUT/"
  done
  ls $parts; ls -l "$OUT"; sha256sum $archive
  # A trained head is lost by stopping at the first call: say so when parts are left.
  local rest=$parts/$(basename $archive).part$(printf %02d $((from + 4)))
  [ -f $rest ] && echo "MORE PARTS LEFT: call again with FROM $((from + 4)) before the machine goes back"
  return 0
}

# Carried .stage/c-KEY-NN/ chunk files land flat in /root/stage; any other .stage/NAME folder as /root/stage/NAME.
take_stage() {
  mkdir -p $STAGE
  for d in .stage/*/; do
    [ -d "$d" ] || continue
    name=$(basename "$d")
    case $name in
      c-*) mv "$d"* $STAGE/ ;;  # moved: a chunk left in the working copy is not copied twice
      heads) ;;  # the shipped heads set aside: never carried
      *) rm -rf "$STAGE/$name" && cp -r "$d" "$STAGE/$name" ;;
    esac
  done
  ls $STAGE
}

# One run, ~MINUTES (18: both models together on one H200): data (the mixed contexts answered
# by the target) for DATA_MIN (launch's third argument), then the shipped head, grown (HEAD), trained until EVAL_MIN are
# left while the shipped head itself is measured beside it (same machine, same prompts: the
# baseline), then τ of the exported int8 head on the dev prompts and both eval sets at every
# budget (~1 minute for one model alone on an H200: 2.5 leaves room for two). Each step writes
# DIR/stage.txt.
DATA_MIN=${DATA_MIN:-4} SKIP=${SKIP:-0} LR=${LR:-4e-4} EVAL_MIN=2.5
run_grown() {
  local key=$1 gguf=$2 minutes=$3 dir=$RUNS/$1 t0=$(date +%s)
  local cmd="python3 -m jetspec_chat train-head $gguf --quiet $PROMPTS"
  left() { python3 -c "print(round(max(0.5, $minutes - ($(date +%s) - $t0) / 60 - $1), 2))"; }
  if [ "$DATA_MIN" != 0 ]; then  # 0: train on the carried answers alone
    data_stage $key $gguf $DATA_MIN || return 1
  fi
  echo "train + baseline $(date +%T)" >> $dir/stage.txt
  mkdir -p $dir/baseline && cp -r $STAGE/h-$key $dir/baseline/head
  # the run's own dev prompts: without its prompts.jsonl, an eval of a mixed source draws others
  cp $dir/prompts.jsonl $dir/prompts.meta.json $dir/baseline/
  $cmd --out $dir/baseline --stage eval $EVAL > $dir/baseline/eval.txt 2>&1 &
  $cmd --out $dir --stage train ${HEAD[$key]} --init $STAGE/h-$key --skip-batches $SKIP --lr $LR $FIT $EVAL --time-budget-min $(left $EVAL_MIN) \
    > $dir/train.txt 2>&1 || return 1
  cp $dir/summary.json $dir/summary-train.json && cp $dir/run_config.json $dir/run_config-train.json
  wait
  echo "eval $(date +%T)" >> $dir/stage.txt
  $cmd --out $dir --stage eval $EVAL > $dir/eval.txt 2>&1
  echo "done $(date +%T), $(( ($(date +%s) - t0) / 60 )) min" >> $dir/stage.txt
}

case $verb in
prepare)  # here, on the CPU: prepare KEY [GGUF] [HEAD] ('' for the default GGUF)
  key=${1:?key (q05 or q15)} gguf=${2:-} head=${3:-} assembled=
  cd "$(dirname "$0")/../.."
  [ -n "${ALIAS[$key]:-}" ] || { echo "unknown key $key" >&2; exit 2; }
  heads=engine/models/heads; [ -d $heads ] || heads=.stage/heads
  head=${head:-$heads/${ALIAS[$key]}}
  [ -f $head/model.safetensors ] && [ -f $head/config.json ] || { echo "$head is not a head folder" >&2; exit 1; }
  if [ -z "$gguf" ]; then  # from the installed weight packages (the embedded / embedded-small extras)
    gguf=.stage/$key.gguf assembled=$gguf && mkdir -p .stage
    python3 -c "import sys; from pathlib import Path; from jetspec_chat.engine.models import embedded as E
m = E.EMBEDDED[sys.argv[1]]; E.assemble_gguf(m, E.find_parts(m), Path(sys.argv[2]))" ${ALIAS[$key]} $gguf || exit 1
  fi
  sum=$(sha256sum "$gguf" | cut -d' ' -f1)
  [ "$sum" = "${SHA[$key]}" ] || { echo "$gguf is not the $key GGUF (sha256 $sum)" >&2; exit 1; }
  # 60 MiB chunks (as ../shared/tools/split-for-transfer makes them), one a folder: one a call
  chunks "$gguf" 60 $key.gguf c-$key
  rm -f $assembled
  rm -rf .stage/prompts-run-$key .stage/prompts-$key
  python3 -m jetspec_chat train-head ${ALIAS[$key]} --out .stage/prompts-run-$key --stage prompts $PROMPTS --quiet \
    || { echo "the mixed prompts need: pip install -e '.[train]'" >&2; exit 1; }
  mkdir -p .stage/prompts-$key
  gzip -c .stage/prompts-run-$key/prompts.jsonl > .stage/prompts-$key/prompts.jsonl.gz
  cp .stage/prompts-run-$key/prompts.meta.json .stage/prompts-$key/
  rm -rf .stage/h-$key .stage/c-h$key-* && cp -r $head .stage/h-$key
  # A head over 40 MiB (the 1.5B's is 74) does not fit one call beside the wheels and prompts:
  # its weights travel as chunks (c-hKEY-NN, carried by stage calls) and `join_head` rebuilds them.
  if [ $(stat -c %s .stage/h-$key/model.safetensors) -gt $((40 << 20)) ]; then
    chunks .stage/h-$key/model.safetensors 40 h-$key.safetensors c-h$key
    sha256sum .stage/h-$key/model.safetensors | cut -d' ' -f1 > .stage/h-$key/model.safetensors.sha256
    rm .stage/h-$key/model.safetensors
  fi
  # Answers collected on an earlier machine (collect-data parts in .stage/data-KEY/): 60 MiB chunks.
  rm -rf .stage/c-d$key-*
  if ls .stage/data-$key/$key-data.tar.gz.part* > /dev/null 2>&1; then
    cat .stage/data-$key/$key-data.tar.gz.part* > .stage/$key-data.tar.gz
    gzip -t .stage/$key-data.tar.gz || { echo ".stage/data-$key: the parts do not make a whole archive" >&2; exit 1; }
    chunks .stage/$key-data.tar.gz 60 $key-data.tar.gz c-d$key && rm .stage/$key-data.tar.gz
  fi
  du -sh .stage/c-$key-* .stage/c-h$key-* .stage/c-d$key-* .stage/h-$key .stage/prompts-$key .whl 2>/dev/null
  last=$(ls -d .stage/c-$key-* | tail -1 | xargs basename)
  echo "calls: setup (carry .whl .stage/h-$key .stage/prompts-$key), then stage (carry .stage/c-$key-NN) for ..$last"
  echo "       and .stage/c-h$key-NN and .stage/c-d$key-NN if listed above,"
  echo "       the last one as 'stage && launch $key', then poll 590 until DONE, then collect $key"
  ;;
setup)
  date +%s > /root/t0
  mkdir -p $STAGE $RUNS
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  rm -rf $APP && mkdir -p $APP && tar --exclude=./.stage --exclude=./.whl -cf - . | tar -xf - -C $APP
  (cd $APP && python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2)
  take_stage
  # the kernels the run depends on, on this GPU (the fused loss; sampling inside the decode graph)
  (cd $APP && timeout 120 python3 -P -m pytest -q -x -p no:cacheprovider tests/kernels/test_distill_kernel.py \
    tests/engine/test_gpu.py::test_graphed_batch_sampling_runs_inside_the_graph 2>&1 | tail -3)
  ;;
assemble)  # assemble KEY: the staged chunks -> /root/models/KEY.gguf (sha-checked); prints its path
  assemble ${1:?key}
  ;;
join)  # join KEY: /root/stage/h-KEY/model.safetensors from its staged chunks (sha-checked)
  join_head ${1:?key}
  ;;
stage)
  take_stage | wc -l
  ;;
launch)
  key=${1:?key} minutes=${2:-18} DATA_MIN=${3:-$DATA_MIN} SKIP=${4:-0} LR=${5:-$LR}
  gguf=$(assemble $key) || exit 1
  join_head $key || exit 1
  [ -d $STAGE/h-$key ] || { echo "carry .stage/h-$key first" >&2; exit 1; }
  init_run $key || exit 1
  echo "launching $key: ${minutes} min, data ${DATA_MIN} min, skipping $SKIP batches, peak lr $LR"
  # `cd && cmd &` would background a subshell that holds this call's stdout until the run ends
  cd $APP || exit 1
  DATA_MIN=$DATA_MIN SKIP=$SKIP LR=$LR setsid nohup bash tools/remote-gpu/train_heads.sh run $key $gguf $minutes \
    > $RUNS/$key/run.txt 2>&1 < /dev/null &
  sleep 20; cat $RUNS/$key/stage.txt; [ "$DATA_MIN" = 0 ] || tail -3 $RUNS/$key/data.txt  # 0: no data stage
  ;;
run)  # (started by launch, in the background) run KEY GGUF MINUTES
  run_grown "$@"; echo "exit $?"; touch $RUNS/${1:?key}/DONE
  ;;
run-data)  # (started by answer, in the background) run-data KEY GGUF MINUTES
  data_stage "$@"; echo "exit $?"; touch $RUNS/${1:?key}/DONE
  ;;
evaluate)  # evaluate NAME KEY HEAD [WIDTH]: τ of /root/stage/HEAD on the dev prompts and both eval sets, every budget
  name=${1:?name} key=${2:?key} head=${3:?head folder in /root/stage} width=${4:-32}
  gguf=$(assemble $key) || exit 1
  rm -rf $RUNS/$name && mkdir -p $RUNS/$name && cp -r $STAGE/$head $RUNS/$name/head
  cd $APP || exit 1
  setsid nohup bash -c "python3 -m jetspec_chat train-head $gguf --out $RUNS/$name --stage eval \
    --eval-prompts 8 $EVAL --eval-width $width --quiet > $RUNS/$name/eval.txt 2>&1; touch $RUNS/$name/DONE" > /dev/null 2>&1 < /dev/null &
  sleep 5; tail -3 $RUNS/$name/eval.txt
  ;;
compare)  # compare KEY STEPS "HEAD ARGS A" "HEAD ARGS B": two heads from scratch on the same data, same steps
  key=${1:?key} steps=${2:?steps} a=${3:?head args A} b=${4:?head args B}
  gguf=$(assemble $key) || exit 1
  rm -rf $RUNS/cmpA $RUNS/cmpB && mkdir -p $RUNS/cmpA $RUNS/cmpB
  data="--num-prompts 30000 --gen-batch-size 512 --max-new-tokens 256 --max-prompt-tokens 768 --seed 1 --self-prompts 0.3"
  fit="--steps $steps --lr 6e-4 --block-size 16 --batch-size 16 --anchors-per-seq 128 --eval-every 0 --eval-prompts 8"
  cd $APP || exit 1
  setsid nohup bash -c "python3 -m jetspec_chat train-head $gguf --out $RUNS/cmpA --stage data $data --quiet \
      > $RUNS/cmpA/data.txt 2>&1 && cp -r $RUNS/cmpA/data $RUNS/cmpA/prompts.jsonl $RUNS/cmpA/prompts.meta.json $RUNS/cmpB/ && \
    { python3 -m jetspec_chat train-head $gguf --out $RUNS/cmpA --stage train $data $fit $a --quiet > $RUNS/cmpA/train.txt 2>&1 &
      python3 -m jetspec_chat train-head $gguf --out $RUNS/cmpB --stage train $data $fit $b --quiet > $RUNS/cmpB/train.txt 2>&1;
      wait; }; touch $RUNS/cmpA/DONE $RUNS/cmpB/DONE" > /dev/null 2>&1 < /dev/null &
  sleep 15; tail -3 $RUNS/cmpA/data.txt
  ;;
poll)
  secs=${1:?seconds}; t=0
  while [ $t -lt "$secs" ]; do
    n=0; for d in $RUNS/*/; do [ -f $d/DONE ] || n=$((n+1)); done
    [ $n -eq 0 ] && break
    sleep 10; t=$((t+10))
  done
  for d in $RUNS/*/; do
    echo "== $d $( [ -f $d/DONE ] && echo DONE)"
    [ -f $d/stage.txt ] && cat $d/stage.txt
    for f in run.txt data.txt train.txt eval.txt baseline/eval.txt; do [ -f $d/$f ] && { echo "-- $f"; tail -4 $d/$f; }; done
    [ -f $d/log.jsonl ] && tail -1 $d/log.jsonl
  done
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
  ;;
collect)
  key=${1:?key} from=${2:-0}
  if [ ! -f /root/$key.tar ]; then
    [ -f $RUNS/$key/baseline/eval.json ] && cp $RUNS/$key/baseline/eval.json $RUNS/$key/baseline-eval.json
    tar -C $RUNS/$key -cf /root/$key.tar $(cd $RUNS/$key && ls -d head eval.json baseline-eval.json summary*.json \
      run_config*.json log.jsonl stage.txt run.txt data.txt train.txt eval.txt baseline/eval.txt data/meta.json 2>/dev/null)
  fi
  send_parts /root/$key.tar /root/parts-$key $from
  ;;
answer)  # answer KEY MINUTES: the data stage alone, in the background (setsid: it outlives the call)
  key=${1:?key} minutes=${2:?minutes}
  gguf=$(assemble $key) || exit 1
  init_run $key || exit 1
  cd $APP || exit 1
  setsid nohup bash tools/remote-gpu/train_heads.sh run-data $key $gguf $minutes \
    > $RUNS/$key/run.txt 2>&1 < /dev/null &
  sleep 20; tail -3 $RUNS/$key/data.txt
  ;;
collect-data)  # collect-data KEY [FROM]: the answers, gzipped, 15 MiB parts FROM.. (<= 4 a call)
  key=${1:?key} from=${2:-0} dir=$RUNS/${1:?key}
  if [ ! -f /root/$key-data.tar.gz ]; then
    [ -f $dir/DONE ] || { echo "the $key data stage is still running (poll until DONE)" >&2; exit 1; }
    tar -C $dir --exclude='*.tmp' -czf /root/$key-data.tar.gz data prompts.jsonl prompts.meta.json \
      $(cd $dir && ls proposals.jsonl proposals.meta.json 2>/dev/null) || exit 1
  fi
  send_parts /root/$key-data.tar.gz /root/dparts-$key $from
  ;;
*) echo "unknown verb $verb" >&2; exit 2 ;;
esac

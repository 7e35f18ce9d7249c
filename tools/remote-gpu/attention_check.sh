#!/usr/bin/env bash
# A change to the tree attention (kernels/tree_attention.py) on one GPU, from the repository root,
# results under $OUT/attention/:
#   1. the attention and merge tests (bitwise: rows against their AR step, every merge and grid
#      variant against the serial merge / the uncapped grid);
#   2. benchmarks/tree_attention.py --SWEEP-sweep (cold µs, "same" per point) against the previous
#      kernel file, where a sweep is named (merge: the AR merge; verify-merge; grid; split; tile;
#      v-split; tail; tma; merge-blocks; flat), or its default table (every call of the 1.5B and
#      8B shapes, the previous kernel beside this one, SDPA and the bound) where SWEEP is "table";
#   3. the engine (8B shape, random weights, ctx 512 and 8192), this tree against the previous one
#      in alternating runs (tools/remote-gpu/engine_ab.py), medians and new/old per measure.
#
#   PY="python3" OLD_SITE=/tmp/site_old bash tools/remote-gpu/attention_check.sh [SWEEP] [SECONDS]
# PY: this tree's python prefix (default python3). OLD_SITE: the previous tree's package, installed
# (pip install --no-deps --target OLD_SITE OLD_TREE); without it the engine A/B is skipped. The
# previous kernel file: $OLD_KERNEL, else OLD_SITE's, else git main's. SECONDS: the whole
# check's budget (default 240); the A/B takes what the tests and the sweep leave.
set -u
PY=${PY:-python3}
sweep=${1:-}
budget=${2:-240}
dir=${OUT:-.}/attention
mkdir -p "$dir"
start=$SECONDS

echo "== tests" | tee "$dir/tests.txt"
timeout 90 $PY -m pytest -q -x -p no:cacheprovider tests/kernels -k "attention or merge or grid" 2>&1 \
  | tail -15 | tee -a "$dir/tests.txt"

old=${OLD_KERNEL:-}
if [ -z "$old" ] && [ -n "${OLD_SITE:-}" ]; then old=$OLD_SITE/jetspec_chat/kernels/tree_attention.py; fi
old=${old:-main}
if [ -n "$sweep" ]; then
  flag=(); [ "$sweep" != table ] && flag=("--$sweep-sweep")
  echo "== $sweep (previous kernel: $old), at $((SECONDS - start)) s" | tee "$dir/sweep.txt"
  timeout 90 $PY benchmarks/tree_attention.py --old "$old" "${flag[@]}" --json-out "$dir/sweep.json" 2>&1 \
    | tail -40 | tee -a "$dir/sweep.txt"
fi

left=$((budget - (SECONDS - start)))
echo "== engine A/B, at $((SECONDS - start)) s (${left} s left)" | tee "$dir/engine.txt"
if [ -z "${OLD_SITE:-}" ]; then echo "no OLD_SITE: engine A/B skipped" | tee -a "$dir/engine.txt"; exit 0; fi
timeout "$left" $PY tools/remote-gpu/engine_ab.py previous --old-site "$OLD_SITE" --rounds 2 --out "$dir/engine" -- \
  random:Qwen/Qwen3-8B --draft-head random:5 --contexts 512,8192 --tree-sizes 1,64,128,256 2>&1 | tee -a "$dir/engine.txt"
echo "done at $((SECONDS - start)) s" | tee -a "$dir/engine.txt"

#!/usr/bin/env bash
# The attention's split programs capped per query tile (SPLIT_PROGRAMS_CAP), on one GPU (≤ 240 s),
# from the repository root, results under $OUT/splitgrid/:
#   1. the attention tests (bitwise: rows against their AR step, the capped grid against the
#      uncapped one);
#   2. benchmarks/tree_attention.py --grid-sweep: verify calls (1.5B and 8B heads, T = 16 / 64 / 128
#      at 512 / 2048 / 8192 keys) and causal chunks at cap 4 / 8 / 16 / uncapped on the app's
#      33,792-row cache, cold µs, beside the previous kernel, "same" per point;
#   3. the engine's AR step and verify calls, this tree against the previous one (ABBA).
#
#   PY="python3" PY_OLD="/path/to/old/venv/bin/python" bash tools/remote-gpu/split_grid_check.sh
# PY: this tree's python (default python3); PY_OLD: the previous tree's (its jetspec_chat importable).
# The previous kernel file: $OLD_KERNEL, else .stage/old_tree_attention.py, else PY_OLD's, else git main's.
set -u
PY=${PY:-python3}
PY_OLD=${PY_OLD:-}
dir=${OUT:-.}/splitgrid
mkdir -p "$dir"
start=$SECONDS

echo "== tests" | tee "$dir/tests.txt"
timeout 75 $PY -m pytest -q -x -p no:cacheprovider tests/kernels -k "attention or grid" 2>&1 | tail -15 | tee -a "$dir/tests.txt"

old=${OLD_KERNEL:-}
if [ -z "$old" ] && [ -f .stage/old_tree_attention.py ]; then old=.stage/old_tree_attention.py; fi
if [ -z "$old" ] && [ -n "$PY_OLD" ]; then
  old=$(cd /tmp && $PY_OLD -c "import jetspec_chat.kernels.tree_attention as m; print(m.__file__)" 2>/dev/null)
fi
old=${old:-main}
echo "== grid sweep (previous kernel: $old), at $((SECONDS - start)) s" | tee "$dir/sweep.txt"
timeout 70 $PY benchmarks/tree_attention.py --old "$old" --grid-sweep \
  --json-out "$dir/grid_sweep.json" 2>&1 | tail -25 | tee -a "$dir/sweep.txt"

echo "== engine, at $((SECONDS - start)) s" | tee "$dir/engine.txt"
if [ -z "$PY_OLD" ]; then echo "no PY_OLD: engine A/B skipped" | tee -a "$dir/engine.txt"; exit 0; fi
# Which package each python imports: -P keeps the working directory (this tree) off sys.path, so
# PY_OLD cannot pick up this tree's jetspec_chat/; PY runs with -P where it imports this tree so.
probe="import jetspec_chat.kernels.tree_attention as m; print(m.__file__, hasattr(m, 'SPLIT_PROGRAMS_CAP'))"
new_flag=-P
case "$($PY -P -c "$probe" 2>&1)" in *" True") ;; *) new_flag= ;; esac
echo "new: $($PY $new_flag -c "$probe" 2>&1 | tail -1) | old: $($PY_OLD -P -c "$probe" 2>&1 | tail -1)" \
  "(True: the capped grid)" | tee -a "$dir/engine.txt"
args="random:Qwen/Qwen3-8B --draft-head random:5 --engine-only --contexts 512,8192 --tree-sizes 1,16,64,128"
for run in new-1 old-1 old-2 new-2; do
  left=$((235 - (SECONDS - start)))
  if [ "$left" -lt 35 ]; then echo "$run skipped: ${left} s left" | tee -a "$dir/engine.txt"; continue; fi
  case $run in new*) py="$PY $new_flag" ;; *) py="$PY_OLD -P" ;; esac
  timeout "$left" $py -m jetspec_chat bench $args --json-out "$dir/engine-$run.json" > "$dir/engine-$run.log" 2>&1 \
    || { echo "$run failed or ran out of time:"; tail -5 "$dir/engine-$run.log"; } | tee -a "$dir/engine.txt"
done
$PY - "$dir" <<'PYEOF' 2>&1 | tee -a "$dir/engine.txt"
import json, statistics, sys
from pathlib import Path
d = Path(sys.argv[1])
runs = {}
for f in sorted(d.glob("engine-*.json")):
    model = json.loads(f.read_text())["models"][0]
    for c in model["contexts"]:
        ar = c["ar_step_ms"]["median"]
        m = {"AR step": ar, "AR/(weights bound)": ar / c["ar_bound_ms"], "AR/(weights+KV bound)": ar / c["ar_bound_kv_ms"]}
        m |= {f"verify({v['nodes']})": v["ms"]["median"] for v in c["verify"]}
        for k, v in m.items():
            runs.setdefault((c["context"], k), {}).setdefault(f.stem.split("-")[1], []).append(v)
print(f"{'ctx':>5} {'measure':<24} {'old':>9} {'new':>9} {'new/old':>8}   (medians over runs; ms, or ×)")
for (ctx, k), v in runs.items():
    if "old" in v and "new" in v:
        o, n = statistics.median(v["old"]), statistics.median(v["new"])
        print(f"{ctx:>5} {k:<24} {o:9.3f} {n:9.3f} {n / o:8.3f}   runs old {len(v['old'])}, new {len(v['new'])}")
PYEOF
echo "done at $((SECONDS - start)) s" | tee -a "$dir/engine.txt"

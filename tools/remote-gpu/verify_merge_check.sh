#!/usr/bin/env bash
# The verify / chunk merge loading a row's split states in blocks, on one GPU (≤ 240 s), from the
# repository root, results under $OUT/vmerge/:
#   1. the attention and merge tests (bitwise: rows against their AR step, the blocked merges
#      against the serial ones);
#   2. the engine's AR step, verify calls and whole round at budget 128 (8B shape, random weights),
#      this tree against the previous one (new, old, old, new; a run only where 30 s are left
#      beside the sweep's 55), medians and new/old;
#   3. benchmarks/tree_attention.py --verify-merge-sweep in the time left: verify calls at the 8B
#      and 1.5B head shapes (T = 16 / 64 / 128 / 256, 512 / 2048 / 8192 keys), the serial merge
#      against blocks of states, cold µs, and whether the bits are the serial merge's (same: True).
#
#   PY="python3" PY_OLD="/path/to/old/venv/bin/python" bash tools/remote-gpu/verify_merge_check.sh
# PY: this tree's python (default python3); PY_OLD: the previous tree's (its jetspec_chat importable).
# The previous kernel file (the benchmark loads it, unused by the sweep): $OLD_KERNEL, else
# .stage/old_tree_attention.py, else PY_OLD's, else git main's.
set -u
PY=${PY:-python3}
PY_OLD=${PY_OLD:-}
dir=${OUT:-.}/vmerge
mkdir -p "$dir"
start=$SECONDS
budget=235
sweep_reserve=55

echo "== tests" | tee "$dir/tests.txt"
timeout 75 $PY -m pytest -q -x -p no:cacheprovider tests/kernels -k "attention or merge" 2>&1 | tail -15 | tee -a "$dir/tests.txt"

echo "== engine, at $((SECONDS - start)) s" | tee "$dir/engine.txt"
if [ -z "$PY_OLD" ]; then echo "no PY_OLD: engine A/B skipped" | tee -a "$dir/engine.txt"; else
# Which package each python imports: -P keeps the working directory (this tree) off sys.path, so
# PY_OLD cannot pick up this tree's jetspec_chat/; PY runs with -P where it imports this tree so.
probe="import jetspec_chat.kernels.tree_attention as m; print(m.__file__, hasattr(m, 'VERIFY_SERIAL_SPLITS'))"
new_flag=-P
case "$($PY -P -c "$probe" 2>&1)" in *" True") ;; *) new_flag= ;; esac
echo "new: $($PY $new_flag -c "$probe" 2>&1 | tail -1) | old: $($PY_OLD -P -c "$probe" 2>&1 | tail -1)" \
  "(True: the blocked verify merge)" | tee -a "$dir/engine.txt"
args="random:Qwen/Qwen3-8B --draft-head random:5 --engine-only --contexts 512,8192 --tree-sizes 1,64,128,256"
for run in new-1 old-1 old-2 new-2; do
  left=$((budget - sweep_reserve - (SECONDS - start)))  # the sweep keeps its time
  if [ "$left" -lt 30 ]; then echo "$run skipped: ${left} s left" | tee -a "$dir/engine.txt"; continue; fi
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
        m = {"AR step": c["ar_step_ms"]["median"]}
        m |= {f"verify({v['nodes']})": v["ms"]["median"] for v in c["verify"]}
        if c.get("round_ms"):
            m[f"round ({c['round_tree_nodes']} nodes)"] = c["round_ms"]["median"]
        for k, v in m.items():
            runs.setdefault((c["context"], k), {}).setdefault(f.stem.split("-")[1], []).append(v)
print(f"{'ctx':>5} {'measure':<24} {'old':>9} {'new':>9} {'new/old':>8}   (medians over runs; ms)")
for (ctx, k), v in runs.items():
    if "old" in v and "new" in v:
        o, n = statistics.median(v["old"]), statistics.median(v["new"])
        print(f"{ctx:>5} {k:<24} {o:9.3f} {n:9.3f} {n / o:8.3f}   runs old {len(v['old'])}, new {len(v['new'])}")
PYEOF
fi

old=${OLD_KERNEL:-}
if [ -z "$old" ] && [ -f .stage/old_tree_attention.py ]; then old=.stage/old_tree_attention.py; fi
if [ -z "$old" ] && [ -n "$PY_OLD" ]; then
  old=$(cd /tmp && $PY_OLD -c "import jetspec_chat.kernels.tree_attention as m; print(m.__file__)" 2>/dev/null)
fi
old=${old:-main}
left=$((budget - (SECONDS - start)))
echo "== verify merge sweep, at $((SECONDS - start)) s (${left} s left)" | tee "$dir/sweep.txt"
timeout "$left" $PY benchmarks/tree_attention.py --old "$old" --verify-merge-sweep \
  --json-out "$dir/verify_merge_sweep.json" 2>&1 | tail -40 | tee -a "$dir/sweep.txt"
echo "done at $((SECONDS - start)) s" | tee -a "$dir/sweep.txt"

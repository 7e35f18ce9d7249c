#!/usr/bin/env bash
# The draft head's layers split over the tensor-parallel ranks, on 2 GPUs, from the repository
# root, results under $OUT/tp_draft/ (BUDGET s, 270 by default):
#   1. the GPU TP tests that run the split draft (both ranks' draft logits the same bits and
#      close to one GPU's; bf16 speculative = AR under --tp 2 through the symmetric exchange,
#      with 1- and 3-layer heads, and through NCCL; the exchange test);
#   2. the 8B-shape engine-only bench at --tp 2 (5-layer random head), this tree (PY) against an
#      older one (OLD_PY, or OLD_SRC installed with pip --target), alternating new, old, old, new;
#   3. the same bench at --tp 1 of this tree, for the TP=2 / TP=1 ratios;
#   then a summary: draft, verify(128), round@128, AR step per run, and the medians' ratios.
#
#   PY="python3" [OLD_PY="..." | OLD_SRC=DIR] [BUDGET=270] bash tools/remote-gpu/tp_draft_check.sh
# (MODEL and BENCH_EXTRA change the bench's model and add options: a dry run of the script on the
# CPU is MODEL=random:tiny-qwen3 BENCH_EXTRA="--device cpu --reps 2 --copy-mib 8".)
set -u
dir=${OUT:-.}/tp_draft
mkdir -p "$dir/runs"
budget=270
source "$(dirname "$0")/tp_check_env.sh"
# (each check's output to a file first: a pipe into tee would hide its exit status)
$PY -c "import jetspec_chat.engine.parallel as p; assert hasattr(p, 'shard_head'), p.__file__; print('new tree:', p.__file__)" \
  > "$dir/which.txt" 2>&1 || { cat "$dir/which.txt"; echo "PY does not import this tree"; exit 9; }
cat "$dir/which.txt" | tee -a "$dir/device.txt"

if [ -z "${OLD_PY:-}" ] && [ -n "${OLD_SRC:-}" ]; then  # the old tree into a folder of its own
  timeout "$(cap 60)" $PY -m pip install -q --no-deps --no-build-isolation --target "$dir/old-site" "$OLD_SRC" \
    > "$dir/old-install.log" 2>&1 && OLD_PY="env PYTHONPATH=$dir/old-site ${PY}" \
    || { echo "installing OLD_SRC failed"; tail -c 1500 "$dir/old-install.log"; }
fi
if [ -n "${OLD_PY:-}" ]; then
  if $OLD_PY -c "import jetspec_chat.engine.parallel as p; assert not hasattr(p, 'shard_head'), p.__file__; print('old tree:', p.__file__)" \
    > "$dir/which.txt" 2>&1; then
    cat "$dir/which.txt" | tee -a "$dir/device.txt"
  else
    tail -2 "$dir/which.txt"; echo "OLD_PY does not import the old tree: no A/B" | tee -a "$dir/device.txt"; OLD_PY=
  fi
fi

echo "== GPU TP tests (split draft), at $((SECONDS - start)) s" | tee "$dir/tests.txt"
timeout -s USR1 -k 5 "$(cap 150)" $PY -m pytest -q -p no:cacheprovider tests/engine/test_gpu_parallel.py \
  -k "symmetric_exchange or split_draft_head or (three_layer_head and not moe) or (bf16_speculation_equals_bf16_ar and (64 or nccl) and not three)" 2>&1 | tail -8 | tee -a "$dir/tests.txt"

BENCH=("${MODEL:-random:Qwen/Qwen3-8B}" --draft-head random:5 --engine-only --contexts 512 --tree-sizes 1,128
       --round-budget 128 --reps 10 --profile-rounds 0 ${BENCH_EXTRA:-})
bench() {  # bench NAME TP PYTHON...: one run, its JSON to runs/NAME.json
  local name=$1 tp=$2; shift 2
  local l; l=$(left)
  if [ "$l" -lt 40 ]; then echo "$name: skipped (${l} s left)" | tee -a "$dir/bench.txt"; return; fi
  echo "$name (--tp $tp), at $((SECONDS - start)) s" | tee -a "$dir/bench.txt"
  # (~35 s a run; the first one may compile kernels for the 8B's shapes)
  local limit=70; [ -e "$dir/runs/first" ] || { limit=100; touch "$dir/runs/first"; }
  timeout -s USR1 -k 5 "$(cap $limit)" "$@" -m jetspec_chat bench "${BENCH[@]}" --tp "$tp" --json-out "$dir/runs/$name.json" \
    > "$dir/runs/$name.log" 2>&1 || { echo "$name failed or ran out of time"; tail -c 1500 "$dir/runs/$name.log"; } | tee -a "$dir/bench.txt"
}
echo "== 8B shape, engine-only, at $((SECONDS - start)) s" | tee "$dir/bench.txt"
if [ -n "${OLD_PY:-}" ]; then
  # new, old, old, new, with --tp 1 in the middle (drift falls on both; if time runs short, new-1 is skipped)
  bench new-0 2 $PY; bench old-0 2 $OLD_PY; bench tp1 1 $PY; bench old-1 2 $OLD_PY; bench new-1 2 $PY
else
  echo "no OLD_PY / OLD_SRC: this tree alone" | tee -a "$dir/bench.txt"
  bench new-0 2 $PY; bench tp1 1 $PY
fi

$PY - "$dir/runs" <<'PY' 2>&1 | tee "$dir/summary.txt"
import json, pathlib, statistics, sys
runs = {}
if not any(pathlib.Path(sys.argv[1]).glob("*.json")):
    sys.exit("no bench finished")
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    m = json.loads(f.read_text())["models"][0]
    b = m["bars"]
    verify = {int(k): v for k, v in b["verify_ms"].items()}
    runs[f.stem] = {"draft": b["draft_ms"], "verify(128)": verify.get(128), "round@128": b["round_ms"],
                    "AR step": b["ar_step_ms"]}
    phases = " ".join(f"{k} {v:.3f}" for k, v in (b.get("round_phases_ms") or {}).items())
    peak = (m.get("peak_memory_bytes") or 0) / 2**30
    print(f"{f.stem:6} " + "  ".join(f"{k} {v:.3f}" for k, v in runs[f.stem].items() if v is not None)
          + f"  ms | head+lm_head {m['head_weight_bytes'] / 1e9:.2f} GB/rank, peak {peak:.1f} GiB | round phases: {phases}")
med = {g: {k: statistics.median(r[k] for n, r in runs.items() if n.startswith(g)) for k in next(iter(runs.values()))}
       for g in ("new", "old", "tp1") if any(n.startswith(g) for n in runs)}
for k in next(iter(runs.values()), {}):
    line = f"{k:12}" + "".join(f" {g} {v[k]:.3f}" for g, v in med.items())
    if "old" in med and "new" in med:
        line += f"  new/old {med['new'][k] / med['old'][k]:.3f}"
    if "tp1" in med:
        line += "".join(f"  {g}/tp1 {med[g][k] / med['tp1'][k]:.3f}" for g in ("new", "old") if g in med)
    print(line)
print("bars: AR step tp2/tp1 <= 0.6, round@128 tp2/tp1 <= 0.65")
PY
echo "done at $((SECONDS - start)) s" | tee -a "$dir/summary.txt"

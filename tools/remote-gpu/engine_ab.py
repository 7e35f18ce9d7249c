"""Whole-engine A/B in one run (remote-GPU tool): `jetspec-chat bench --engine-only` on the
working tree and on an older revision, alternately, on the same machine, with the ratios.

    python3 tools/remote-gpu/engine_ab.py OLD_REV [--rounds 2] [--out DIR] -- BENCH ARGS...
    python3 tools/remote-gpu/engine_ab.py --old-site DIR [--rounds 2] [--out DIR] -- BENCH ARGS...

e.g. `engine_ab.py b8bab39 -- random:Qwen/Qwen3-8B --draft-head random:5 --contexts 512
--tree-sizes 1,16,64,128`. The old revision comes from this checkout's git history (`git archive`)
and is installed into its own folder (`pip install --target`, no dependencies), so each bench
process imports one version of the package: the working tree's (as installed, editable) or the
old one (first on PYTHONPATH). Runs alternate new / old `--rounds` times, so drift of the machine
(clocks, other tenants) falls on both; per measure the median over rounds is reported.

Why: whole-step numbers compared across machines differ by more than most changes (2.50 vs 2.41 ms
with the copy bandwidth 4% apart). Kernel benches give in-run ratios; this gives them for the whole step.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def install_old(rev: str, where: Path, given_src: Path | None) -> Path:
    """The package at `rev` (from `git archive`, or the tree already extracted at given_src)
    installed into where/site."""
    src, site = given_src or where / "src", where / "site"
    if given_src is None:
        src.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(src)], check=True)
    return site


def bench(site: Path | None, args: list[str], out: Path) -> dict:
    """One `bench --engine-only` process; site: the old package's folder (None: the working tree)."""
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-P", "-c", "import jetspec_chat, sys; print('package', jetspec_chat.__file__, file=sys.stderr); "
           "from jetspec_chat.cli import main; sys.exit(main())",
           "bench", "--engine-only", *args, "--json-out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    origin = next((line for line in proc.stderr.splitlines() if line.startswith("package ")), "package ?")
    if proc.returncode != 0:
        raise SystemExit(f"bench failed ({origin}):\n{proc.stderr[-3000:]}")
    print(f"  {origin}", file=sys.stderr)
    return json.loads(out.read_text())


def measures(report: dict) -> dict[str, float]:
    """name -> ms of every timed quantity in an engine-only report (first model)."""
    model = report["models"][0]
    out: dict[str, float] = {"copy bandwidth GB/s": model["copy_bandwidth_gb_s"]}
    for c in model["contexts"]:
        at = f"@{c['context']}"
        out[f"AR step {at}"] = c["ar_step_ms"]["median"]
        out[f"AR round {at}"] = c["ar_round_ms"]["median"]
        for v in c["verify"]:
            out[f"verify({v['nodes']}) {at}"] = v["ms"]["median"]
        if c.get("draft_ms"):
            out[f"draft {at}"] = c["draft_ms"]["median"]
        if c.get("round_ms"):
            out[f"round {at}"] = c["round_ms"]["median"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old_rev", nargs="?", help="the old revision (from git), or a label with --old-site")
    ap.add_argument("--old-site", type=Path, help="the old package, installed there already (pip install --target)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, help="folder for every run's JSON and the summary")
    ap.add_argument("--old-src", type=Path, help="OLD_REV's tree, extracted already (where git is missing: "
                    "`git archive OLD_REV | tar -x -C DIR` here, carried)")
    argv = sys.argv[1:]
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        ap.error("give the bench arguments after --")
    cut = argv.index("--")
    args, bench_args = ap.parse_args(argv[:cut]), argv[cut + 1 :]
    if args.old_rev is None and args.old_site is None:
        ap.error("give OLD_REV or --old-site")
    args.old_rev = args.old_rev or "old"
    work = Path(tempfile.mkdtemp(prefix="engine-ab-"))
    out = args.out or work / "runs"
    out.mkdir(parents=True, exist_ok=True)
    try:
        site = args.old_site or install_old(args.old_rev, work, args.old_src)
        runs: dict[str, list[dict[str, float]]] = {"new": [], "old": []}
        for r in range(args.rounds):
            for name, where in (("new", None), ("old", site)):
                print(f"round {r + 1}/{args.rounds}: {name}", file=sys.stderr)
                runs[name].append(measures(bench(where, bench_args, out / f"{name}-{r}.json")))
    finally:
        shutil.rmtree(work / "src", ignore_errors=True)
    keys = [k for k in runs["new"][0] if all(k in m for m in runs["new"] + runs["old"])]
    summary = {k: {n: statistics.median(m[k] for m in runs[n]) for n in runs} for k in keys}
    print(f"{'measure':<24} {'old ' + args.old_rev:>14} {'new':>10} {'new/old':>8}")
    for k, v in summary.items():
        print(f"{k:<24} {v['old']:14.3f} {v['new']:10.3f} {v['new'] / v['old']:8.3f}")
    (out / "summary.json").write_text(json.dumps({"old_rev": args.old_rev, "bench_args": bench_args,
                                                   "rounds": args.rounds, "median": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

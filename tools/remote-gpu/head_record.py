"""The training record (`training.json`) of a head trained on a remote GPU machine, from what `train_heads.sh
collect` brought back: the run's stage summaries and logs, its eval.json, the shipped head's eval
on the same machine (baseline-eval.json), optional `jetspec-chat bench --json` outputs, and the
shipped head's own record, which becomes the first of `earlier_runs` (so every run stays listed).

    python3 tools/remote-gpu/head_record.py RUN_DIR --previous SHIPPED/training.json \
        --trained-on TEXT --command TEXT [--bench NAME=FILE ... --bench-command TEXT] --out RUN_DIR/head/training.json

Every number comes from a file of the run; the record names which (`sources`).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def data_stats(run: Path) -> dict:
    """The data stage's numbers: its own summary (summary-data.json), else data.txt's log line."""
    summary = read_json(run / "summary-data.json")
    if summary and "data" in summary:
        d = summary["data"]
        return {k: d[k] for k in ("sequences", "answer_tokens", "seconds", "skipped", "stopped_by_time") if k in d}
    text = (run / "data.txt").read_text() if (run / "data.txt").is_file() else ""
    m = re.search(r"data: (\d+) sequences in", text)
    return {"sequences": int(m.group(1))} if m else {}


def train_stats(run: Path, config: dict) -> dict:
    """The train stage's numbers: its summary (summary-train.json) or the exported head's record."""
    summary = read_json(run / "summary-train.json") or {}
    head = read_json(run / "head" / "training.json") or {}
    out = {"steps": summary.get("train", {}).get("steps", head.get("steps"))}
    if "seconds" in summary.get("train", {}):
        out["seconds"] = summary["train"]["seconds"]
    if "sequences" in head:
        out["sequences_available"] = head["sequences"]
    for key, name in (("batch_size", "sequences_per_step"), ("anchors_per_seq", "anchors_per_sequence"),
                      ("loss", "loss"), ("lr", "lr"), ("export_dtype", "export")):
        if key in config:
            out[name] = config[key]
    return out


def bench_summary(path: Path) -> dict:
    """set -> config -> {tau, decode_tokens_per_s, draft_ms, same_as_ar} of a `bench --json` output."""
    report = json.loads(path.read_text())
    out: dict = {"device": report.get("env", {}).get("device_name")}
    for model in report.get("models", []):
        for s in model.get("sets", []):
            rows = out.setdefault(s["name"], {})
            for c in s["configs"]:
                draft = (c.get("round_ms") or {}).get("draft", 0.0)
                rows[c["name"]] = {"tau": round(c["tau"], 3) if c.get("tau") is not None else None,
                                   "decode_tokens_per_s": round(c["decode_tokens_per_s"], 1),
                                   "draft_ms": round(draft, 3), "same_as_ar": c.get("same_as_ar")}
    return out


def compose(run: Path, previous: dict, trained_on: str, command: str, benches: dict[str, Path],
            bench_command: str | None = None) -> dict:
    # Each stage rewrites run_config.json: the train stage's own copy (run_config-train.json) has its flags.
    config = read_json(run / "run_config-train.json") or {}
    record = {
        "target": previous["target"],
        "trained_on": trained_on,
        "command": command,
        "data": data_stats(run),
        "train": train_stats(run, config),
        "eval": read_json(run / "eval.json"),
        "previous_head_eval": read_json(run / "baseline-eval.json"),
        "bench": ({"command": bench_command, **{name: bench_summary(path) for name, path in benches.items()}}
                  if benches else None),
        "sources": {
            "data": "summary-data.json (the data stage's summary), else data.txt",
            "train": "summary-train.json, run_config-train.json and head/training.json (the exported head's record)",
            "eval": "eval.json: train-head --stage eval of the exported head",
            "previous_head_eval": "baseline-eval.json: the shipped head evaluated in the same run, same machine",
            "bench": "jetspec-chat bench --json outputs named on the command line",
        },
    }
    earlier = previous.pop("earlier_runs", [])
    record["earlier_runs"] = [previous, *earlier]
    return record


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--previous", type=Path, required=True, help="the shipped head's training.json")
    ap.add_argument("--trained-on", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--bench", action="append", default=[], metavar="NAME=FILE")
    ap.add_argument("--bench-command", help="the bench command line the --bench files came from")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    benches = {}
    for item in args.bench:
        name, _, path = item.partition("=")
        if not path:
            ap.error(f"--bench takes NAME=FILE, got {item!r}")
        benches[name] = Path(path)
    if not (args.run / "eval.json").is_file():
        print(f"{args.run} has no eval.json: the run did not finish its evaluation", file=sys.stderr)
        return 1
    record = compose(args.run, json.loads(args.previous.read_text()), args.trained_on, args.command, benches,
                     args.bench_command)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a training run writes under its output directory: progress bars, log.jsonl rows,
atomic file writes and the short content hashes that key prompts and data."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def progress_bar(enabled: bool, **kw):
    from tqdm.auto import tqdm

    return tqdm(disable=not enabled, dynamic_ncols=True, file=sys.stderr, **kw)


def append_log(out: Path, row: dict) -> None:
    with open(out / "log.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]

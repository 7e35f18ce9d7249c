"""Bench reports as JSON."""
from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path


def options_dict(opts) -> dict:
    """A run's options as JSON-ready data (the prompts themselves, by set)."""
    d = asdict(opts)
    if "prompt_sets" in d:  # the prompts themselves, by set
        d["prompt_sets"] = {k: list(v) for k, v in d["prompt_sets"].items()}
    return d


def to_json(report) -> dict:  # an EndToEndReport or EngineOnlyReport
    """Plain JSON-ready dict (dict keys become strings; non-finite floats become None)."""

    def clean(x):
        if isinstance(x, float):
            return x if math.isfinite(x) else None
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return clean({"tool": "jetspec-chat bench", **asdict(report)})


def write_json(report, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_json(report), indent=1) + "\n")

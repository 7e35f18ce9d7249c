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
    return json_ready({"tool": "jetspec-chat bench", **asdict(report)})


def json_ready(x):
    """`x` with dict keys as strings, tuples as lists and non-finite floats as None."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_ready(v) for v in x]
    return x


def write_json(report, path: str | Path, **sections) -> None:
    """The report as JSON; `sections` are more top-level keys (bench --app adds "app")."""
    data = {**to_json(report), **json_ready(sections)}
    Path(path).write_text(json.dumps(data, indent=1) + "\n")

"""`jetspec-chat cache`: what the converted-model cache holds, and removing it.

    jetspec-chat cache                       # list, with sizes
    jetspec-chat cache remove qwen2.5-coder-1.5b
    jetspec-chat cache remove --all --yes    # no question asked (scripts)
"""
from __future__ import annotations

import argparse
import sys

from .engine.errors import EngineError
from .engine.models.embedded import (
    CACHE_ENV,
    EMBEDDED,
    CacheEntry,
    cache_entries,
    models_dir,
    part_packages,
    remove_cache_entry,
)


def human(size: int) -> str:
    """Decimal units, like pip and du -h --si."""
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = "List the converted models in the cache directory with their sizes, or remove them."
    p.add_argument("action", nargs="?", choices=("list", "remove"), default="list")
    p.add_argument("names", nargs="*", metavar="NAME", help="for remove: the entries to remove (as listed)")
    p.add_argument("--all", action="store_true", help="for remove: every entry")
    p.add_argument("--yes", "-y", action="store_true", help="for remove: do not ask (needed when not on a terminal)")


def list_cache() -> int:
    entries = cache_entries()
    root = models_dir()
    print(f"cache directory: {root}  (set {CACHE_ENV} to move it)")
    if not entries:
        print("  empty: models are converted here on first use")
    width = max((len(e.name) for e in entries), default=0)
    for e in entries:
        print(f"  {e.name:<{width}}  {human(e.size):>8}  {e.kind}: {e.source}")
    if entries:
        print(f"  {'total':<{width}}  {human(sum(e.size for e in entries)):>8}")
    print("weight packages installed with pip (the embedded models' source; `pip uninstall` removes them):")
    for alias, model in EMBEDDED.items():
        count, size = part_packages(model)
        state = f"{count} of {len(model.packages)} installed, {human(size)}" if count else "not installed"
        print(f"  {alias:<{width}}  {state}  (jetspec-chat[{model.extra}])")
    print("Hugging Face downloads live in the Hugging Face cache: see `hf cache scan`.")
    return 0


def remove(names: list[str], everything: bool, yes: bool) -> int:
    entries = {e.name: e for e in cache_entries()}
    if everything:
        chosen = [e for e in entries.values() if not e.in_use]
    else:
        if not names:
            raise EngineError("name what to remove (`jetspec-chat cache` lists the entries), or pass --all.")
        unknown = [n for n in names if n not in entries]
        if unknown:
            listed = ", ".join(entries) or "nothing"
            raise EngineError(f"{unknown[0]} is not in the cache (it holds: {listed}).")
        chosen = [entries[n] for n in names]
    if not chosen:
        print("the cache holds nothing to remove")
        return 0
    total = human(sum(e.size for e in chosen))
    if not yes and not confirm(chosen, total):
        print("nothing removed")
        return 1
    for e in chosen:
        remove_cache_entry(e)
        print(f"removed {e.name} ({human(e.size)})")
    return 0


def confirm(chosen: list[CacheEntry], total: str) -> bool:
    if not sys.stdin.isatty():
        raise EngineError("not on a terminal, so nothing was removed; pass --yes to remove without asking.")
    what = chosen[0].name if len(chosen) == 1 else f"{len(chosen)} entries"
    answer = input(f"Remove {what} ({total}) from {models_dir()}? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        if args.names or args.all:
            raise EngineError("`jetspec-chat cache` lists; to remove, say `jetspec-chat cache remove NAME`.")
        return list_cache()
    return remove(args.names, args.all, args.yes)

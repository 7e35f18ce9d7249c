"""The project speaks of the product: no text in the repository (code, comments, docs, tests,
shipped JSON) names the work periods it was built in, the machine loans or the tooling it was
built with, or task-tracker numbers. Scans every tracked or new (not ignored) text file, this one
included; the patterns are assembled from pieces so that this file does not match itself."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What a plain walk skips when git is not there: .gitignore's entries and git's own folder.
IGNORED_DIRS = {".git", ".venv", "__pycache__", "build", "dist", ".pytest_cache", ".stage", ".whl"}

WORK_PERIOD = r"\bses" + "sions?[ -]+[0-9]"  # a numbered work period; ChatSession, "chat session" stay
MACHINE_LOAN = "(?<![a-z])le" + "as(e|es|ed|ing)(?![a-z])"  # not "please", "release"
TRACKER_NUMBER = r"\biss" + r"ues?('s)?\s*#?[0-9]"
BUILD_TOOL = "dev" + "ice[ -]tool"
FORBIDDEN = re.compile("|".join(f"(?:{p})" for p in (WORK_PERIOD, MACHINE_LOAN, TRACKER_NUMBER, BUILD_TOOL)),
                       re.IGNORECASE)


def repository_files() -> list[Path]:
    """Tracked files and new ones git does not ignore; a walk of the tree where git is absent."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, check=True).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                 if p.is_file() and not IGNORED_DIRS.intersection(p.relative_to(ROOT).parts)
                 and not any(part.endswith(".egg-info") for part in p.parts)]
    return [ROOT / n for n in names if (ROOT / n).is_file()]


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary (a NUL byte in its first 8 KiB, or not UTF-8)."""
    with path.open("rb") as f:
        if b"\0" in f.read(8192):
            return None
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


def hits(text: str) -> list[tuple[int, str]]:
    return [(i, m.group(0)) for i, line in enumerate(text.splitlines(), 1) for m in FORBIDDEN.finditer(line)]


def test_the_patterns_catch_what_they_must_and_spare_product_words():
    period, loan, number, tool = ("Ses" + "sion 13", "one le" + "ase", "iss" + "ue 13", "the dev" + "ice tool")
    for bad in (period, "ses" + "sions 9-12", "the ses" + "sion-6 run", loan, "GPU-LE" + "ASE", "le" + "ased",
                number, "Iss" + "ue #5", "iss" + "ue's 1a", tool):
        assert hits(bad), bad
    for fine in ("ChatSession 1", "the chat session", "please retry", "released", "an issue with 3 files",
                 "sessions", "issues"):
        assert not hits(fine), fine


def test_the_scan_reads_the_repository_and_this_file():
    files = repository_files()
    names = {str(p.relative_to(ROOT)) for p in files}
    assert {"README.md", "pyproject.toml", "tests/test_docs.py"} <= names
    assert any(n.endswith("training.json") for n in names)  # the shipped heads' records are scanned too


def test_no_text_names_work_periods_loans_tracker_numbers_or_build_tooling():
    found = []
    for path in repository_files():
        text = text_of(path)
        if text is not None:
            found += [f"{path.relative_to(ROOT)}:{line}: {match!r}" for line, match in hits(text)]
    assert not found, "text that speaks of how the project was built, not of the product:\n" + "\n".join(found)

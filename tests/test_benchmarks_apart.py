"""benchmarks/ and tools/ stand beside the product: neither the package nor the tests import or
load anything from them (by module name or by path), so they can change or go without a test
or an installed module noticing."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# An import of the folders as modules, or a path built to a file inside them.
REACH = re.compile(r"^\s*(from|import)\s+(benchmarks|tools)\b|[\"'](benchmarks|tools)[\"']\s*[,)/]|[\"'](benchmarks|tools)/",
                   re.MULTILINE)


def sources() -> list[Path]:
    return [p for top in ("jetspec_chat", "engine", "kernels", "themes", "tests") for p in (ROOT / top).rglob("*.py")]


def test_the_pattern_sees_imports_and_paths():
    for text in ("import benchmarks.linear", "from tools import x", 'ROOT / "benchmarks" / "linear.py"',
                 "Path('tools/capture_app.sh')"):
        assert REACH.search(text), text
    assert not REACH.search("# the kernel benchmarks measure this\nbench = 1")


def test_nothing_in_the_package_or_the_tests_reaches_benchmarks_or_tools():
    this = Path(__file__).resolve()
    found = [f"{p.relative_to(ROOT)}: {m.group(0)!r}" for p in sources() if p.resolve() != this
             for m in REACH.finditer(p.read_text(encoding="utf-8"))]
    # The one exception: the capture script's own test runs the script it documents.
    found = [f for f in found if not f.startswith("tests/app/test_capture_script.py")]
    assert not found, "\n".join(found)

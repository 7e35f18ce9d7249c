"""tools/capture_app.sh: the installed `jetspec-chat` in a real terminal (tmux), on the real
engine (random:tiny-qwen3), captured mid-answer, at the end and on the compare screen."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)"),
]

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "capture_app.sh"


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    # the console script of this interpreter's environment (the installed package)
    here = Path(sys.executable).parent / "jetspec-chat"
    binary = str(here) if here.exists() else shutil.which("jetspec-chat")
    if binary is None:
        pytest.skip("jetspec-chat is not installed")
    env["JETSPEC_CHAT_BIN"] = binary
    env["TMPDIR"] = str(tmp_path)
    return env


def capture(tmp_path: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    with subprocess.Popen(
        ["bash", str(SCRIPT), *args], env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.terminate()  # the script's trap kills its tmux server
            out, err = p.communicate()
            raise AssertionError(f"capture_app.sh ran past {timeout}s: {err}") from None
    done = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    done.pid = p.pid  # the script's $$: names its private tmux server
    return done


def test_capture_mid_answer_end_and_compare(tmp_path):
    out = tmp_path / "cap"
    proc = capture(
        tmp_path, "--budgets", "AR, 4", "--timeout", "180", "--size", "160x50",
        "random:tiny-qwen3", "Write a Python function that reverses a linked list.", str(out),
        # long enough for a mid-answer frame even on a fast machine, and on CI's 2 loaded cores,
        # where 200 tokens once finished before the script's poll saw a round
        "--max-new-tokens", "600", "--budget", "16", "--device", "cpu", "--max-context", "1024",
    )
    assert proc.returncode == 0, proc.stderr
    mid = (tmp_path / "cap.mid.txt").read_text()
    end = (tmp_path / "cap.end.txt").read_text()
    compare = (tmp_path / "cap.compare.txt").read_text()
    assert proc.stdout.split() == [f"{out}.mid.txt", f"{out}.end.txt", f"{out}.compare.txt"]
    for screen in (mid, end, compare):
        lines = screen.splitlines()
        assert len(lines) == 50 and max(len(line) for line in lines) <= 160
    # mid-answer: the live tree of a round, the stats and the generating status
    assert "random:tiny-qwen3" in mid
    assert "Draft tree · round" in mid and "· live" in mid
    assert "anchor" in mid and "★" in mid and "✗ rejected" in mid
    assert "generating · round" in mid
    assert "Stats" in mid and "tok/s" in mid and "τ" in mid
    # the end: the last round, the answer's summary, back to ready
    assert "last round" in end and "nodes · depth" in end
    assert re.search(r"\d+ tokens · [\d.]+ tok/s · τ [\d.]+ · \d+ rounds", end)
    assert "τ       mean" in end and "answer " in end
    assert "ready  ·  context" in end
    # the comparison: one row per budget, done
    assert "Compare budgets" in compare and "done: 2 runs" in compare
    rows = [re.match(r"\s+(AR|\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+×.*\bdone\b", line) for line in compare.splitlines()]
    assert [m.group(1) for m in rows if m] == ["AR", "4"]
    assert not list(tmp_path.glob("jetspec-capture.*")), "the work dir is removed"
    socket = Path(os.environ.get("TMUX_TMPDIR", "/tmp")) / f"tmux-{os.getuid()}" / f"jetspec-capture-{proc.pid}"
    assert not socket.exists(), "the private tmux server is gone"


def test_capture_fails_clearly(tmp_path):
    out = tmp_path / "bad"
    proc = capture(tmp_path, "--timeout", "60", str(tmp_path / "no-such-model"), "hi", str(out), timeout=120)
    assert proc.returncode == 1
    assert "the model did not load (step: the model to load)" in proc.stderr
    assert "Could not load the model" in (tmp_path / "bad.error.txt").read_text()
    assert not (tmp_path / "bad.mid.txt").exists()
    usage = capture(tmp_path, "only-a-model", timeout=30)
    assert usage.returncode == 2 and "tools/capture_app.sh [options] MODEL PROMPT OUTFILE" in usage.stderr

"""`jetspec-chat bench --app`: the real app (headless pilot) next to the engine bench, one run."""
from __future__ import annotations

import json
import re

import pytest
from app_support import isolate

from jetspec_chat import bench_cli

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    isolate(monkeypatch, tmp_path)


def test_bench_app_prints_app_and_engine_tokens_per_second(capsys, tmp_path):
    out_json = tmp_path / "app.json"
    code = bench_cli.main([
        "random:tiny-qwen3", "--app", "--device", "cpu", "--budgets", "4", "--prompt-sets", "coding",
        "--prompts-n", "1", "--max-new-tokens", "8", "--warmup", "0", "--json-out", str(out_json),
    ])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = {m.group(1): m for m in re.finditer(r"coding\s+│\s+(ar|spec@4)\s+│\s+([\d.]+)\s+│\s+([\d.]+)\s+│\s+([\d.]+)×", out)}
    assert set(rows) == {"ar", "spec@4"}, out
    for m in rows.values():
        engine, app, ratio = (float(m.group(i)) for i in (2, 3, 4))
        # the table rounds tok/s to 0.1 and the ratio to 0.01: at a few tok/s (a busy CPU) the
        # rounding alone moves app / engine by 0.05 / engine + 0.05 / app
        assert engine > 0 and app > 0
        rounding = 0.05 / engine + 0.05 / app
        assert ratio == pytest.approx(app / engine, rel=0.02 + rounding, abs=0.006)
    assert re.search(r"first answer after start [\d.]+ tok/s, second [\d.]+ tok/s", out), out
    # --json-out: the engine bench's JSON, plus the app's numbers beside the engine's
    report = json.loads(out_json.read_text())
    assert report["tool"] == "jetspec-chat bench" and report["models"][0]["sets"][0]["name"] == "coding"
    app = report["app"]
    by_config = {c["config"]: c for c in app["configs"]}
    assert set(by_config) == {"ar", "spec@4"}
    # both sides sized for the app's default context on the CPU, not shrunk to the job
    assert report["options"]["max_context"] == 8192 and "context 8192" in out
    for c in by_config.values():
        assert c["set"] == "coding" and len(c["app_tokens_per_s"]) == 1 and len(c["engine_tokens_per_s"]) == 1
        assert c["paired_app_over_engine"] == pytest.approx(c["app_tokens_per_s"][0] / c["engine_tokens_per_s"][0])
        assert c["app_median_tokens_per_s"] == pytest.approx(float(rows[c["config"]].group(3)), abs=0.051)
        assert c["engine_median_tokens_per_s"] == pytest.approx(float(rows[c["config"]].group(2)), abs=0.051)
        assert c["app_over_engine"] == pytest.approx(c["app_median_tokens_per_s"] / c["engine_median_tokens_per_s"])
    assert app["first_answer_tokens_per_s"] > 0 and app["second_answer_tokens_per_s"] > 0 and app["load_seconds"] > 0


def test_paired_ratio_is_the_median_of_per_pair_ratios():
    from jetspec_chat.app_bench import AppConfigResult

    r = AppConfigResult("spec@4", "coding", tokens_per_s=[90.0, 50.0, 200.0], engine_tokens_per_s=[100.0, 100.0, 200.0])
    assert r.median == 90.0 and r.engine_median == 100.0 and r.ratio == pytest.approx(0.9)
    assert r.paired_ratio == pytest.approx(0.9)  # pairs: 0.9, 0.5, 1.0
    assert AppConfigResult("ar", "coding").paired_ratio is None and AppConfigResult("ar", "coding").ratio is None

"""`jetspec-chat bench`: end-to-end and engine-only modes on tiny random models (CPU)."""
import json

import pytest
import torch

from jetspec_chat.bench_cli import main
from jetspec_chat.bench import end_to_end, engine_only, gpu_idle, timing
from jetspec_chat.engine.errors import ConfigError


def bench_json(tmp_path, capsys, *args) -> tuple[dict, str]:
    out = tmp_path / "bench.json"
    code = main([*args, "--json-out", str(out)])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    return json.loads(out.read_text()), stdout


def test_end_to_end_schema_and_sanity(tmp_path, capsys):
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"prompt": "Write a haiku about trees."}\n\n{"prompt": "Count to five."}\n')
    report, table = bench_json(
        tmp_path, capsys, "random:tiny-qwen3", "--budgets", "1,4", "--modes", "ar,spec,hf", "--prompts", str(prompts),
        "--prompts-n", "2", "--max-new-tokens", "12", "--warmup", "1",
    )
    assert report["tool"] == "jetspec-chat bench" and report["mode"] == "end_to_end"
    assert {"device", "device_name", "torch", "transformers", "time"} <= set(report["env"])
    assert report["options"]["budgets"] == [1, 4] and report["options"]["max_new_tokens"] == 12
    (model,) = report["models"]
    assert model["model"] == "random:tiny-qwen3" and model["weight_bytes"] > 0
    assert [s["name"] for s in model["sets"]] == ["mine"]  # --prompts alone replaces the built-in sets
    for s in model["sets"]:
        assert s["prompts"] == 2
        configs = {c["name"]: c for c in s["configs"]}
        assert list(configs) == ["ar", "spec@1", "spec@4", "hf"]
        ar, hf = configs["ar"], configs["hf"]
        for c in configs.values():
            assert len(c["runs"]) == 2 and c["decode_tokens_per_s"] > 0 and c["e2e_tokens_per_s"] > 0
            for r in c["runs"]:
                assert r["answer_tokens"] == len(r["answer_ids"]) > 0 and r["seconds"] > 0 and r["prefill_ms"] > 0
        for name in ("ar", "spec@1", "spec@4"):
            c = configs[name]
            assert c["tau"] >= 1 and c["round_ms"]["total"] > 0 and c["round_ms"]["verify"] > 0
            assert all(r["rounds"] >= 1 and r["tau"] >= 1 for r in c["runs"])
        assert ar["tau"] == 1 and all(r["tau"] == 1 for r in ar["runs"])
        assert ar["speedup_vs_ar"] is None and configs["spec@4"]["speedup_vs_ar"] > 0
        assert set(ar["verify_ms_by_size"]) == {"1"} and "4" in configs["spec@4"]["verify_ms_by_size"]
        assert configs["spec@4"]["round_ms"]["draft"] > 0
        # Greedy: transformers generate on the same weights gives the engine's AR answer.
        assert [r["answer_ids"] for r in hf["runs"]] == [r["answer_ids"] for r in ar["runs"]]
        assert hf["tau"] is None and hf["same_as_ar"] == "2/2" and configs["spec@4"]["same_as_ar"] == "2/2"
    assert "spec@4" in table and "tok/s" in table


def test_engine_only_entries_and_ratios(tmp_path, capsys):
    report, table = bench_json(
        tmp_path, capsys, "random:tiny-qwen3", "--engine-only", "--contexts", "64,256", "--tree-sizes", "1,16,64",
        "--round-budget", "32", "--warmup", "1", "--reps", "3", "--copy-mib", "8",
    )
    assert report["mode"] == "engine_only"
    (m,) = report["models"]
    assert m["copy_bandwidth_gb_s"] > 0 and m["copy_bytes"] == 8 << 20 and len(m["copy_ms"]["raw"]) == 3
    assert m["weight_bytes_per_ar_step"] > 0 and m["head_weight_bytes"] > 0
    assert [c["context"] for c in m["contexts"]] == [64, 256]
    for c in m["contexts"]:
        assert c["ar_step_ms"]["median"] > 0 and len(c["ar_step_ms"]["raw"]) == 3
        assert c["ar_bound_ms"] > 0 and c["ar_bound_kv_ms"] > c["ar_bound_ms"] and c["ar_step_over_bound"] > 0
        assert c["ar_step_over_bound_kv"] == c["ar_step_ms"]["median"] / c["ar_bound_kv_ms"] < c["ar_step_over_bound"]
        assert [v["nodes"] for v in c["verify"]] == [1, 16, 64]
        assert all(v["ms"]["median"] > 0 and v["over_ar_step"] > 0 for v in c["verify"])
        assert c["draft_ms"]["median"] > 0 and c["draft_over_bound"] > 0
        assert c["round_ms"]["median"] > 0 and c["round_tree_nodes"] == 32
        assert {"draft_ms", "tree_ms", "verify_ms", "accept_ms"} <= set(c["round_phases_ms"])
    bars = m["bars"]
    assert bars["context"] == 64 and bars["round_budget"] == 32 and bars["round_ms"] > 0
    # 128/256 were not measured, so the bars list every measured size.
    assert set(bars["verify_over_ar_step"]) == {"1", "16", "64"}
    assert bars["draft_long_context"] == 256 and bars["draft_long_over_short"] > 0
    assert m["gpu_idle"] is None and bars["gpu_idle_ms"] is None  # CPU: no device to idle
    assert "bars" in table and "AR step" in table
    # The step against its weights + KV bound, the long-context bar's ratio, beside the weights-only one.
    assert "AR/+KV" in table and all(f"{c['ar_step_over_bound_kv']:.2f}×" in table for c in m["contexts"]), table
    assert bars["ar_step_over_bound_kv"] == m["contexts"][0]["ar_step_over_bound_kv"]


def test_weight_bytes_per_ar_step_counts_one_embedding_row():
    from engine_helpers import tiny_engine

    target = tiny_engine("tiny-qwen3").target
    embed = target.model.embed_tokens.weight
    everything = sum(p.numel() * p.element_size() for p in target.parameters())
    expected = everything - embed.numel() * embed.element_size() + embed.shape[1] * embed.element_size()
    assert engine_only.weight_bytes_per_ar_step(target) == expected


def test_time_fn_runs_setup_untimed_and_returns_reps():
    calls = []
    samples = timing.time_fn(lambda: calls.append("fn"), warmup=2, reps=3, device=torch.device("cpu"),
                            setup=lambda: calls.append("setup"))
    assert len(samples) == 3 and all(s >= 0 for s in samples)
    assert calls == ["setup", "fn"] * 5


def test_idle_from_trace_splits_leading_between_trailing():
    def x(cat, name, ts, dur):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}

    events = [
        x("user_annotation", gpu_idle.ROUND_LABEL, 1000.0, 100.0),
        x("kernel", "a", 1010.0, 20.0),  # leading idle 10
        x("kernel", "b", 1025.0, 10.0),  # overlaps a: merged 1010-1035
        x("gpu_memcpy", "c", 1060.0, 20.0),  # gap 25
        x("kernel", "d", 1082.0, 40.0),  # gap 2 (under the threshold), clipped at 1100
        x("kernel", "outside", 2000.0, 10.0),
        x("cpu_op", "aten::mm", 1000.0, 50.0),
    ]
    (r,) = gpu_idle.idle_from_trace(events, min_gap_us=5.0)
    assert r["span_us"] == 100.0 and r["busy_us"] == 25.0 + 20.0 + 18.0
    assert (r["leading_us"], r["between_us"], r["trailing_us"]) == (10.0, 27.0, 0.0)
    assert r["gaps"] == [{"us": 25.0, "before": "c"}]
    # Per-kernel time inside the rounds only (the one round here), largest first.
    table = gpu_idle.kernel_table(events)
    assert [(k["name"], k["us_per_round"], k["count_per_round"]) for k in table] == [
        ("d", 40.0, 1), ("a", 20.0, 1), ("c", 20.0, 1), ("b", 10.0, 1)]
    # The critical column: b overlaps a and moves the timeline from 1030 to 1035 only; d's part
    # past the round's end counts (the table clips nothing); no gap is counted.
    assert {k["name"]: k["critical_us_per_round"] for k in table} == {"a": 20.0, "b": 5.0, "c": 20.0, "d": 40.0}


def test_prompt_sets_and_jsonl_errors(tmp_path):
    for kind in end_to_end.PROMPT_SETS:
        assert len(end_to_end.prompt_set(kind)) >= 8 and all(p.strip() for p in end_to_end.prompt_set(kind))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt key"}\n')
    with pytest.raises(ConfigError, match="bad.jsonl:2"):
        end_to_end.load_prompts_jsonl(bad)


@pytest.mark.parametrize("args,message", [
    (["--modes", "ar,foo"], "unknown mode"),
    (["--budgets", "0"], "budget"),
    (["--reps", "0"], "reps"),
    (["--prompt-sets", "poetry"], "unknown prompt set"),
    (["--prompts", "/does/not/exist.jsonl"], "does not exist"),
    (["--prompts-n", "0"], "prompts-n"),
    (["--draft-head", "none", "--modes", "ar,spec"], "needs a draft head"),
    (["--engine-only", "--tree-sizes", "0,16"], "tree sizes"),
    (["--engine-only", "--contexts", "64", "--bar-context", "128"], "bar context"),
    (["--engine-only", "--contexts", "4000", "--tree-sizes", "1,256"], "exceeds"),
])
def test_bad_options_are_one_clear_line(capsys, args, message):
    assert main(["random:tiny-qwen3", "--max-new-tokens", "4", "--prompts-n", "1", *args]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last and "Traceback" not in err


def test_malformed_lists_are_one_line_errors(capsys):
    assert main(["random:tiny-qwen3", "--budgets", "1,x"]) == 2
    err = capsys.readouterr().err
    assert "comma-separated integers" in err and "Traceback" not in err


def test_engine_only_table_prints_gpu_idle_block():
    """The GPU idle lines only appear on CUDA; print them here from a CPU report plus an idle record."""
    import io

    from rich.console import Console

    from jetspec_chat.bench_cli import print_engine_only

    opts = engine_only.EngineOnlyOptions(models=["random:tiny-qwen3"], device="cpu", contexts=(32,), tree_sizes=(1, 8),
                                   round_budget=8, warmup=0, reps=1, copy_mib=1)
    report = engine_only.run_engine_only(opts)
    report.models[0].gpu_idle = gpu_idle.GpuIdle(
        method="test", rounds=1, round_ms=2.0, busy_ms=1.5, idle_ms=0.5, idle_fraction=0.25, profiled_round_ms=3.0,
        profiled_idle_ms=1.5, leading_ms=0.1, between_ms=1.3, trailing_ms=0.1, gaps_over_threshold=4,
        largest_gaps=[{"us": 900.0, "before": "topk_kernel"}],
    )
    out = io.StringIO()
    print_engine_only(report, Console(file=out, width=160))
    text = out.getvalue()
    assert "GPU idle per round 0.500 ms = 25.0%" in text and "gap 900 µs before topk_kernel" in text


# --- MoE: the expected-expert-bytes bound ------------------------------------------------------------


def test_expected_distinct_experts_formula_and_simulation():
    from jetspec_chat.bench.moe_bytes import expected_distinct_experts

    assert expected_distinct_experts(128, 8, 1) == pytest.approx(8.0)
    assert expected_distinct_experts(128, 8, 0) == 0.0
    qwen = [expected_distinct_experts(128, 8, n) for n in (1, 16, 64, 128, 256)]
    assert qwen == sorted(qwen) and qwen[-1] == pytest.approx(128.0, abs=1e-4)
    assert qwen[1] == pytest.approx(82.42, abs=0.01)
    gen = torch.Generator().manual_seed(0)  # uniform routing, simulated: N rows, each k distinct of E
    e, k, n, trials = 16, 4, 5, 4000
    picks = torch.rand(trials, n, e, generator=gen).argsort(-1)[..., :k]
    hit = torch.zeros(trials, e, dtype=torch.bool).scatter_(1, picks.reshape(trials, -1), True)
    assert hit.sum(1).float().mean().item() == pytest.approx(expected_distinct_experts(e, k, n), rel=0.01)


def test_expected_weight_bytes_of_a_moe_target():
    from engine_helpers import tiny_engine

    from jetspec_chat.bench.moe_bytes import expected_distinct_experts, expected_weight_bytes

    target = tiny_engine("tiny-qwen3-moe").target
    cfg = target.cfg
    embed = target.model.embed_tokens.weight
    size = lambda t: t.numel() * t.element_size()
    stacks = [layer.mlp.experts for layer in target.model.layers if hasattr(layer.mlp, "experts")]
    assert len(stacks) == len(cfg.moe_layers) == 3
    all_experts = sum(size(s.gate_up_proj) + size(s.down_proj) for s in stacks)
    one_expert = all_experts // (len(stacks) * cfg.num_experts)
    rest = sum(size(p) for p in target.parameters()) - all_experts - size(embed)  # routers, attention, dense MLP, lm_head
    row = embed.shape[1] * embed.element_size()
    assert expected_weight_bytes(target, 1) == pytest.approx(rest + row + 3 * cfg.num_experts_per_tok * one_expert)
    assert engine_only.weight_bytes_per_ar_step(target) == round(expected_weight_bytes(target, 1))  # the active floor
    touched = expected_distinct_experts(cfg.num_experts, cfg.num_experts_per_tok, 16)
    assert expected_weight_bytes(target, 16) == pytest.approx(rest + 16 * row + 3 * touched * one_expert)
    assert expected_weight_bytes(target, 500) == pytest.approx(rest + 500 * row + all_experts)  # every expert


def test_gpt_oss_20b_active_bytes_from_its_shapes():
    """gpt-oss-20b's real shapes on the meta device (no memory): the AR floor is attention (q/k/v/o
    with biases, sinks), the router, 4 of 32 experts with their biases, one embedding row and the
    lm_head, in bf16 (the MXFP4 experts are dequantized at load), counted from the config."""
    from jetspec_chat.bench.moe_bytes import expected_weight_bytes
    from jetspec_chat.engine.model import TargetModel
    from jetspec_chat.engine.model_config import ModelConfig
    from jetspec_chat.engine.models.model_sources import resolve_model

    hf = resolve_model("random:openai/gpt-oss-20b").hf_config
    cfg = ModelConfig.from_hf(hf)
    with torch.device("meta"):
        target = TargetModel(cfg).to(torch.bfloat16)
    h, i, e, k, v = hf["hidden_size"], hf["intermediate_size"], hf["num_local_experts"], hf["num_experts_per_tok"], hf["vocab_size"]
    q, kv = hf["num_attention_heads"] * hf["head_dim"], hf["num_key_value_heads"] * hf["head_dim"]
    attention = h * (q + 2 * kv) + (q + 2 * kv) + q * h + h + hf["num_attention_heads"] + 2 * h  # + sinks, 2 norms
    expert = h * 2 * i + 2 * i + i * h + h
    layer = attention + e * h + e + k * expert
    params = hf["num_hidden_layers"] * layer + h + h + v * h  # final norm, one embedding row, lm_head
    assert expected_weight_bytes(target, 1) == pytest.approx(2 * params)
    assert 3.6e9 < params < 3.62e9  # gpt-oss-20b's published 3.6 B active parameters
    assert expected_weight_bytes(target, 256) == pytest.approx(2 * (params + hf["num_hidden_layers"] * (e - k) * expert + 255 * h))


def test_engine_only_on_a_moe_model_reports_the_expert_bytes_bound(tmp_path, capsys):
    report, table = bench_json(
        tmp_path, capsys, "random:tiny-qwen3-moe", "--engine-only", "--contexts", "64", "--tree-sizes", "1,16",
        "--round-budget", "16", "--warmup", "1", "--reps", "2", "--copy-mib", "8",
    )
    (m,) = report["models"]
    v1, v16 = m["contexts"][0]["verify"]
    assert v1["experts_per_layer"] == pytest.approx(2.0) and 2.0 < v16["experts_per_layer"] < 8.0
    assert v1["weight_bytes"] == m["weight_bytes_per_ar_step"] < v16["weight_bytes"]
    assert all(v["bound_ms"] > 0 and v["over_bound"] == pytest.approx(v["ms"]["median"] / v["bound_ms"]) for v in (v1, v16))
    assert set(m["bars"]["verify_over_bound"]) == {"1", "16"}
    assert "experts/layer" in table and "weight-bytes bound" in table


def test_engine_only_on_a_hybrid_model_counts_the_recurrent_state(tmp_path, capsys):
    """Qwen3.5 hybrids: the bounds add the committed recurrent state (read and written per step),
    the K/V bytes count only the full-attention layers, and each tree size reports its stash."""
    report, table = bench_json(
        tmp_path, capsys, "random:tiny-qwen3.5", "--engine-only", "--contexts", "64", "--tree-sizes", "1,16",
        "--round-budget", "16", "--warmup", "1", "--reps", "1", "--copy-mib", "8",
    )
    (m,) = report["models"]
    (c,) = m["contexts"]
    # tiny-qwen3.5: 3 linear layers, conv_dim 2·2·16 + 4·16, a 3-row window, states 4×16×16; fp32.
    assert c["state_bytes"] == 3 * ((2 * 2 * 16 + 4 * 16) * 3 * 4 + 4 * 16 * 16 * 4)
    v1, v16 = c["verify"]
    assert 0 < v1["tree_state_bytes"] and v16["tree_state_bytes"] == 16 * v1["tree_state_bytes"]
    bw = m["copy_bandwidth_gb_s"] * 1e9
    assert c["ar_bound_ms"] == pytest.approx((m["weight_bytes_per_ar_step"] + 2 * c["state_bytes"]) / bw * 1e3)
    assert "recurrent state" in table


def test_expected_weight_bytes_of_gemma4_counts_its_routed_experts_only():
    """Gemma 4: the dense MLP beside the MoE is read whole, the 128-expert stacks by their routed
    experts, the tied embedding whole (the lm_head reads it)."""
    from engine_helpers import tiny_engine

    from jetspec_chat.bench.moe_bytes import expected_weight_bytes

    target = tiny_engine("tiny-gemma4").target
    cfg = target.cfg
    size = lambda t: t.numel() * t.element_size()
    stacks = [layer.experts for layer in target.model.layers if layer.moe]
    assert len(stacks) == cfg.num_layers
    all_experts = sum(size(s.gate_up_proj) + size(s.down_proj) for s in stacks)
    one_expert = all_experts // (len(stacks) * cfg.num_experts)
    rest = sum(size(p) for p in target.parameters()) - all_experts  # the tied embedding included once
    want = rest + len(stacks) * cfg.num_experts_per_tok * one_expert
    assert expected_weight_bytes(target, 1) == pytest.approx(want)

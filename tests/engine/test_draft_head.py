"""Draft head: published-format fixtures, save/load round trip, mismatch errors, static draft KV."""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from jetspec_chat.engine.draft_head import (
    DraftHeadConfig, DraftKVCache, build_head, default_target_layer_ids, load_head_dir,
)
from jetspec_chat.engine.errors import DraftHeadError
from jetspec_chat.engine.model_config import ModelConfig

CONFIGS = Path(__file__).resolve().parents[2] / "engine" / "models" / "configs"
CPU = torch.device("cpu")


def target_cfg(name="tiny-qwen3") -> ModelConfig:
    return ModelConfig.from_hf(json.loads((CONFIGS / f"{name}.json").read_text()))


def published_dir(tmp_path: Path, causal_key: str | None, causal_value=True) -> Path:
    """A head directory exactly as JetSpec/DFlash publish them (incl. a dflash.py never run)."""
    t = target_cfg()
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "hidden_size": t.hidden_size, "num_hidden_layers": 2, "num_attention_heads": t.num_heads,
        "num_key_value_heads": t.num_kv_heads, "head_dim": t.head_dim, "intermediate_size": 96,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": t.vocab_size, "block_size": 8,
        "num_target_layers": t.num_layers, "max_position_embeddings": 4096,
        "dflash_config": {"mask_token_id": 300, "target_layer_ids": [0, 2]},
    }
    if causal_key:
        cfg["dflash_config"][causal_key] = causal_value
    d = tmp_path / f"head-{causal_key}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "dflash.py").write_text("raise SystemExit('remote code must never run')\n")
    g = torch.Generator().manual_seed(0)
    h, kv = t.hidden_size, t.num_kv_heads * t.head_dim
    w = {"fc.weight": torch.randn(h, 2 * h, generator=g) * 0.05, "hidden_norm.weight": torch.ones(h),
         "norm.weight": torch.ones(h)}
    for i in range(2):
        p = f"layers.{i}."
        w |= {p + "self_attn.q_proj.weight": torch.randn(t.num_heads * t.head_dim, h, generator=g) * 0.05,
              p + "self_attn.k_proj.weight": torch.randn(kv, h, generator=g) * 0.05,
              p + "self_attn.v_proj.weight": torch.randn(kv, h, generator=g) * 0.05,
              p + "self_attn.o_proj.weight": torch.randn(h, t.num_heads * t.head_dim, generator=g) * 0.05,
              p + "self_attn.q_norm.weight": torch.ones(t.head_dim), p + "self_attn.k_norm.weight": torch.ones(t.head_dim),
              p + "mlp.gate_proj.weight": torch.randn(96, h, generator=g) * 0.05,
              p + "mlp.up_proj.weight": torch.randn(96, h, generator=g) * 0.05,
              p + "mlp.down_proj.weight": torch.randn(h, 96, generator=g) * 0.05,
              p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h)}
    save_file({k: v.to(torch.bfloat16) for k, v in w.items()}, str(d / "model.safetensors"))
    return d


@pytest.mark.parametrize("key,expected", [("causal_head", True), ("causal", True), ("is_causal", True), (None, False)])
def test_published_format_loads_with_every_causal_spelling(tmp_path, key, expected):
    head = load_head_dir(published_dir(tmp_path, key), CPU, torch.float32)
    assert head.cfg.causal is expected
    assert head.cfg.target_layer_ids == (0, 2) and head.cfg.mask_token_id == 300 and head.cfg.block_size == 8
    head.cfg.check_against(target_cfg(), "fixture")


def test_causal_false_is_bidirectional(tmp_path):
    assert load_head_dir(published_dir(tmp_path, "causal", False), CPU, torch.float32).cfg.causal is False


def draft(head, cache, taps, anchor=5, depth=None):
    t = target_cfg()
    embed = torch.nn.Embedding(t.vocab_size, t.hidden_size)
    torch.nn.init.normal_(embed.weight, generator=torch.Generator().manual_seed(3))
    head.append_context(cache, taps)
    return head.draft_logits(cache, torch.tensor(anchor), depth or head.cfg.max_depth, embed, embed.weight)


def test_save_load_round_trip_gives_identical_logits(tmp_path):
    head = load_head_dir(published_dir(tmp_path, "causal_head"), CPU, torch.float32)
    head.save(tmp_path / "saved")
    again = load_head_dir(tmp_path / "saved", CPU, torch.float32)
    assert again.cfg == head.cfg
    taps = torch.randn(10, 2 * head.cfg.hidden_size)
    a = draft(head, DraftKVCache(head.cfg, 64, CPU, torch.float32), taps)
    b = draft(again, DraftKVCache(again.cfg, 64, CPU, torch.float32), taps)
    assert torch.equal(a, b)
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["dflash_config"]["causal_head"] is True


def test_published_weights_land_in_the_fused_projections(tmp_path):
    """q/k/v stack into qkv_proj and gate/up into gate_up_proj, in that row order; save writes
    the published names again, each one a plain copy of its rows."""
    from safetensors import safe_open

    src = published_dir(tmp_path, "causal_head")
    head = load_head_dir(src, CPU, torch.float32)
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        w = {k: f.get_tensor(k).float() for k in f.keys()}
    for i, layer in enumerate(head.layers):
        p = f"layers.{i}."
        qkv = torch.cat([w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
        gate_up = torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])
        assert torch.equal(layer.self_attn.qkv_proj.weight, qkv)
        assert torch.equal(layer.mlp.gate_up_proj.weight, gate_up)
    head.save(tmp_path / "saved")
    with safe_open(str(tmp_path / "saved" / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(w)
        for k in f.keys():
            assert torch.equal(f.get_tensor(k), w[k])


def test_incremental_context_equals_one_shot():
    """Projecting context rows round by round gives the same draft as projecting them at once."""
    cfg = DraftHeadConfig.for_target(target_cfg(), num_layers=2, block_size=8)
    head = build_head(cfg, CPU, torch.float32)
    head.init_random(0, std=0.1)
    taps = torch.randn(13, len(cfg.target_layer_ids) * cfg.hidden_size)
    one = draft(head, DraftKVCache(cfg, 32, CPU, torch.float32), taps)
    cache = DraftKVCache(cfg, 32, CPU, torch.float32)
    for chunk in taps.split([5, 1, 4, 3]):
        head.append_context(cache, chunk)
    inc = draft(head, cache, taps[:0])
    torch.testing.assert_close(one, inc, rtol=1e-5, atol=1e-5)


def test_causal_head_depth_prefix_is_consistent():
    cfg = DraftHeadConfig.for_target(target_cfg(), num_layers=1, block_size=8)
    head = build_head(cfg, CPU, torch.float32)
    head.init_random(0, std=0.1)
    taps = torch.randn(6, len(cfg.target_layer_ids) * cfg.hidden_size)
    full = draft(head, DraftKVCache(cfg, 32, CPU, torch.float32), taps)
    short = draft(head, DraftKVCache(cfg, 32, CPU, torch.float32), taps, depth=3)
    torch.testing.assert_close(full[:3], short, rtol=1e-5, atol=1e-5)


def test_mismatched_head_is_a_clear_error(tmp_path):
    head = load_head_dir(published_dir(tmp_path, "causal_head"), CPU, torch.float32)
    with pytest.raises(DraftHeadError, match="hidden size"):
        head.cfg.check_against(target_cfg("tiny-llama").__class__(**{**target_cfg().__dict__, "hidden_size": 128}), "x")
    with pytest.raises(DraftHeadError, match="layer"):
        head.cfg.check_against(target_cfg().__class__(**{**target_cfg().__dict__, "num_layers": 2}), "x")


def test_malformed_heads(tmp_path):
    d = published_dir(tmp_path, "causal_head")
    (d / "model.safetensors").unlink()
    with pytest.raises(DraftHeadError, match="model.safetensors"):
        load_head_dir(d, CPU, torch.float32)
    (d / "config.json").write_text("{not json")
    with pytest.raises(DraftHeadError, match="JSON"):
        load_head_dir(d, CPU, torch.float32)
    with pytest.raises(DraftHeadError, match="config.json"):
        load_head_dir(tmp_path / "nowhere", CPU, torch.float32)


def test_default_tap_spacing_matches_published_heads():
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)  # Qwen3-8B -> jetspec-qwen3-8b
    assert default_target_layer_ids(48, 5) == (1, 12, 23, 34, 45)

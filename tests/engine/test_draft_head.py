"""Draft head: published-format fixtures, save/load round trip, mismatch errors, static draft KV,
int8 storage, RoPE scaling and the reference's default taps."""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from jetspec_chat.engine.draft_head import (
    DraftHeadConfig, DraftKVCache, build_head, default_target_layer_ids, load_head_dir, quantize_int8,
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


# -- int8 storage ----------------------------------------------------------------------------------


def random_head(layers=2, seed=0, std=0.1):
    cfg = DraftHeadConfig.for_target(target_cfg(), num_layers=layers, block_size=8)
    head = build_head(cfg, CPU, torch.float32)
    head.init_random(seed, std=std)
    return head


def test_int8_storage_round_trip(tmp_path):
    """Every weight dequantizes to within half a step (scale / 2) of the original; the draft's
    logits stay within 2% of their largest magnitude of the fp32 head's (measured on random heads
    of seeds 0-2: int8 0.57-0.67%, the same heads in bf16 0.13-0.18%), with the same top-1 at every
    depth; the file is about half the bf16 one."""
    from safetensors import safe_open

    from jetspec_chat.engine.layers import hf_parameters

    head = random_head()
    head.save(tmp_path / "int8", int8=True)
    bf16 = build_head(head.cfg, CPU, torch.bfloat16)
    bf16.load_state_dict(head.state_dict())
    bf16.save(tmp_path / "bf16")
    cfg = json.loads((tmp_path / "int8" / "config.json").read_text())
    assert cfg["quantization"] == {"method": "int8", "granularity": "per_output_channel"}
    assert cfg["torch_dtype"] == "float32"  # the norms' dtype (here the head's own, fp32)
    with safe_open(str(tmp_path / "int8" / "model.safetensors"), "pt") as f:
        stored = {k: f.get_tensor(k) for k in f.keys()}
    assert stored["fc.weight"].dtype == torch.int8 and stored["fc.weight_scale"].dtype == torch.float32
    assert stored["norm.weight"].dtype == torch.float32 and "norm.weight_scale" not in stored
    loaded = load_head_dir(tmp_path / "int8", CPU, torch.float32)
    assert loaded.cfg == head.cfg
    original = dict(hf_parameters(head))
    for name, p in hf_parameters(loaded):
        if p.dim() == 2:
            step = stored[name + "_scale"][:, None]
            assert ((p - original[name]).abs() <= step / 2 + 1e-7).all(), name
        else:
            assert torch.equal(p, original[name]), name
    taps = torch.randn(10, len(head.cfg.target_layer_ids) * head.cfg.hidden_size,
                       generator=torch.Generator().manual_seed(1))
    ref = draft(head, DraftKVCache(head.cfg, 64, CPU, torch.float32), taps)
    got = draft(loaded, DraftKVCache(loaded.cfg, 64, CPU, torch.float32), taps)
    assert (got - ref).abs().max() <= 0.02 * ref.abs().max()
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    # The same head loaded in bf16 (the run dtype on a GPU) dequantizes into bf16.
    assert next(load_head_dir(tmp_path / "int8", CPU, torch.bfloat16).parameters()).dtype == torch.bfloat16
    size = {name: (tmp_path / name / "model.safetensors").stat().st_size for name in ("int8", "bf16")}
    assert size["int8"] < 0.6 * size["bf16"]


def test_quantize_int8_is_symmetric_per_row():
    w = torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0], [3.0, 1.5, -3.0]])
    q, s = quantize_int8(w)
    assert q.dtype == torch.int8 and s.tolist() == pytest.approx([1 / 127, 1e-12, 3 / 127])
    assert q[0].tolist() == [64, -127, 32] and q[1].tolist() == [0, 0, 0] and q[2].tolist() == [127, 64, -127]


def test_the_published_bf16_format_is_unchanged(tmp_path):
    """Saving without int8 writes what it always did: no quantization or rope_scaling field, the
    published names only, in the weights' dtype."""
    from safetensors import safe_open

    head = load_head_dir(published_dir(tmp_path, "causal_head"), CPU, torch.bfloat16)
    head.save(tmp_path / "saved")
    cfg = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert "quantization" not in cfg and "rope_scaling" not in cfg and cfg["torch_dtype"] == "bfloat16"
    with safe_open(str(tmp_path / "saved" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
        assert not any(k.endswith("_scale") for k in f.keys())


def quantized_dir(tmp_path: Path, name: str) -> Path:
    random_head(layers=1).save(tmp_path / name, int8=True)
    return tmp_path / name


def rewrite(d: Path, change) -> None:
    from safetensors import safe_open

    with safe_open(str(d / "model.safetensors"), "pt") as f:
        w = {k: f.get_tensor(k) for k in f.keys()}
    change(w)
    save_file(w, str(d / "model.safetensors"))


@pytest.mark.parametrize("case,message", [
    ("no scale", "has no scale fc.weight_scale"),
    ("scale shape", "one per output channel"),
    ("scale nan", "non-finite"),
    ("not int8", "config.json says its 2-D weights are int8"),
    ("stray scale", "unexpected weight norm.weight_scale"),
    ("no field", "int8 but config.json names no quantization"),
    ("other method", "unsupported quantization"),
])
def test_malformed_quantized_heads_are_clear_errors(tmp_path, case, message):
    d = quantized_dir(tmp_path, case.replace(" ", "-"))
    if case == "no scale":
        rewrite(d, lambda w: w.pop("fc.weight_scale"))
    elif case == "scale shape":
        rewrite(d, lambda w: w.update({"fc.weight_scale": w["fc.weight_scale"][:-1]}))
    elif case == "scale nan":
        rewrite(d, lambda w: w["fc.weight_scale"].__setitem__(0, float("nan")))
    elif case == "not int8":
        rewrite(d, lambda w: w.update({"fc.weight": w["fc.weight"].float()}))
    elif case == "stray scale":
        rewrite(d, lambda w: w.update({"norm.weight_scale": torch.ones(1)}))
    else:
        cfg = json.loads((d / "config.json").read_text())
        if case == "no field":
            del cfg["quantization"]
        else:
            cfg["quantization"] = {"method": "int4", "granularity": "per_group"}
        (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DraftHeadError, match=message):
        load_head_dir(d, CPU, torch.float32)


# -- head config details found against the reference ------------------------------------------------


def test_config_without_taps_takes_the_reference_default_for_its_layer_count(tmp_path):
    """The reference taps one target layer per draft layer when the config names none: the
    middle one for a 1-layer head, else evenly spaced from 1 to num_target_layers - 3."""
    d = published_dir(tmp_path, "causal_head")  # 2 draft layers; its fc takes 2 taps
    cfg = json.loads((d / "config.json").read_text())
    del cfg["dflash_config"]["target_layer_ids"]
    (d / "config.json").write_text(json.dumps(cfg))
    n = target_cfg().num_layers
    head = load_head_dir(d, CPU, torch.float32)
    assert head.cfg.target_layer_ids == default_target_layer_ids(n, 2) == (1, n - 3)
    assert default_target_layer_ids(n, 1) == (n // 2,)
    assert default_target_layer_ids(28, 3) == (1, 13, 25)  # e.g. a 3-layer head on the 1.5B


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def test_rope_scaling_is_applied_as_the_reference_does(tmp_path):
    """A llama3 rope_scaling reaches the head's rotary: its frequencies equal transformers' own
    llama3 initialization; it survives save/load and changes the draft. Other kinds are refused."""
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d = published_dir(tmp_path, "causal_head")
    plain = load_head_dir(d, CPU, torch.float32)
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_scaling"] = LLAMA3
    (d / "config.json").write_text(json.dumps(cfg))
    head = load_head_dir(d, CPU, torch.float32)
    assert head.cfg.rope_scaling == LLAMA3
    hf = Qwen3Config(hidden_size=cfg["hidden_size"], num_attention_heads=cfg["num_attention_heads"],
                     head_dim=cfg["head_dim"], rope_parameters={**LLAMA3, "rope_theta": cfg["rope_theta"]})
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, None)
    torch.testing.assert_close(head.rotary.inv_freq, want.float(), rtol=1e-6, atol=0)
    assert not torch.equal(head.rotary.inv_freq, plain.rotary.inv_freq)
    taps = torch.randn(70, 2 * head.cfg.hidden_size, generator=torch.Generator().manual_seed(2))
    assert not torch.allclose(draft(head, DraftKVCache(head.cfg, 128, CPU, torch.float32), taps),
                              draft(plain, DraftKVCache(plain.cfg, 128, CPU, torch.float32), taps))
    head.save(tmp_path / "saved")
    assert load_head_dir(tmp_path / "saved", CPU, torch.float32).cfg == head.cfg
    # transformers 5 spells it rope_parameters; "default" there is plain RoPE.
    del cfg["rope_scaling"]
    cfg["rope_parameters"] = {**LLAMA3, "rope_theta": 10000.0}
    (d / "config.json").write_text(json.dumps(cfg))
    assert load_head_dir(d, CPU, torch.float32).cfg.rope_scaling["factor"] == 8.0
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    (d / "config.json").write_text(json.dumps(cfg))
    assert load_head_dir(d, CPU, torch.float32).cfg.rope_scaling is None
    cfg["rope_scaling"] = {"rope_type": "longrope", "factor": 4.0}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DraftHeadError, match="rope_scaling of type 'longrope' is not supported"):
        load_head_dir(d, CPU, torch.float32)


def test_lm_head_logits_without_upcast_are_the_same_numbers_in_the_gemms_dtype():
    """The draft graph reads the lm_head's 16-bit logits (`upcast=False`) and widens them itself:
    the same numbers as the fp32 logits, without the copy."""
    from jetspec_chat.engine.layers import lm_head_logits

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 16, generator=g).to(torch.bfloat16)
    weight = torch.randn(50, 16, generator=g).to(torch.bfloat16)
    part = lm_head_logits(hidden, weight, upcast=False)
    full = lm_head_logits(hidden, weight)
    assert part.dtype == torch.bfloat16 and full.dtype == torch.float32
    assert torch.equal(part.float(), full)

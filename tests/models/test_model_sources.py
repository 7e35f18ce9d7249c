"""Model spec resolution: random configs, byte tokenizer, hub cache (offline), local dirs, GGUF, embedded parts."""
from __future__ import annotations

import hashlib
import json
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from jetspec_chat.engine.models import embedded, model_sources
from jetspec_chat.engine.models.byte_tokenizer import byte_tokenizer
from jetspec_chat.engine.errors import ModelNotFoundError
from jetspec_chat.engine.models.model_sources import ModelSource, load_tokenizer, resolve_model

TEXTS = ["hello world", "héllo wörld — 你好 🎉", "tabs\tand\nnewlines  ", "\x00\x7f", "a<|im_end|>b", ""]


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    """No network, an empty HF cache and an empty jetspec cache for every test."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("JETSPEC_CHAT_CACHE", str(tmp_path / "cache"))


def tiny_config(name: str = "tiny-qwen3") -> dict:
    return dict(resolve_model(f"random:{name}").hf_config)


def write_model_dir(path: Path, config: dict, weights: bool = True, tokenizer: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    if weights:
        save_file({"model.norm.weight": torch.ones(4)}, str(path / "model.safetensors"))
    if tokenizer:
        byte_tokenizer().save_pretrained(str(path))
    return path


# --- random models and the byte tokenizer ------------------------------------------------------------


@pytest.mark.parametrize("name", model_sources.list_random())
def test_random_configs_resolve(name):
    src = resolve_model(f"random:{name}")
    assert src.kind == "random" and src.path is None and src.default_draft_head is None
    assert src.name == f"random:{name}"
    assert src.hf_config["model_type"] in model_sources.SUPPORTED_MODEL_TYPES
    assert "jetspec_random_head" not in src.hf_config
    assert src.random_head["num_hidden_layers"] >= 1 and src.random_head["block_size"] >= 2
    assert src.hf_config["vocab_size"] >= byte_tokenizer().vocab_size + 3
    tok = load_tokenizer(src)
    assert tok is byte_tokenizer()  # built once per process


def test_required_random_shapes():
    tiny = {n: tiny_config(n) for n in ("tiny-llama", "tiny-qwen2", "tiny-qwen3")}
    for cfg in tiny.values():
        assert (cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]) == (512, 64, 4)
        assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]) == (4, 2, 128)
        assert cfg["max_position_embeddings"] == 4096 and cfg["rope_theta"] == 10000
    assert [cfg["model_type"] for cfg in tiny.values()] == ["llama", "qwen2", "qwen3"]
    assert "head_dim" in tiny["tiny-qwen3"]
    assert {cfg["tie_word_embeddings"] for cfg in tiny.values()} == {True, False}
    big = resolve_model("random:Qwen/Qwen3-8B")
    c = big.hf_config
    assert (c["model_type"], c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]) == ("qwen3", 4096, 36, 32)
    assert (c["num_key_value_heads"], c["head_dim"], c["intermediate_size"], c["vocab_size"]) == (8, 128, 12288, 151936)
    assert (c["rope_theta"], c["rms_norm_eps"], c["max_position_embeddings"]) == (1e6, 1e-6, 40960)
    assert c["tie_word_embeddings"] is False
    assert big.random_head == {"num_hidden_layers": 5, "block_size": 16}


def test_moe_random_shapes():
    from jetspec_chat.engine.model_config import ModelConfig

    big = resolve_model("random:Qwen/Qwen3-30B-A3B")
    cfg = ModelConfig.from_hf(big.hf_config)
    assert (cfg.model_type, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        "qwen3_moe", 2048, 48, 32, 4, 128)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.norm_topk_prob) == (128, 8, 768, True)
    assert (cfg.vocab_size, cfg.rope_theta, cfg.rms_norm_eps, cfg.max_position_embeddings) == (151936, 1e6, 1e-6, 40960)
    assert cfg.qk_norm and not cfg.tie_word_embeddings and cfg.moe_layers == tuple(range(48))
    assert big.random_head == {"num_hidden_layers": 5, "block_size": 16}
    tiny = ModelConfig.from_hf(tiny_config("tiny-qwen3-moe"))
    assert tiny.moe_layers == (0, 1, 3)  # mlp_only_layers [2]: one dense layer in between


@pytest.mark.parametrize("step,mlp_only,moe_layers", [(1, [], (0, 1, 2, 3, 4, 5)), (2, [], (1, 3, 5)),
                                                      (2, [3], (1, 5)), (1, [0, 5], (1, 2, 3, 4))])
def test_moe_sparse_layers_follow_transformers(step, mlp_only, moe_layers):
    """decoder_sparse_step / mlp_only_layers pick the same MoE layers as transformers' model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from jetspec_chat.engine.model_config import ModelConfig

    config = tiny_config("tiny-qwen3-moe") | {"num_hidden_layers": 6, "decoder_sparse_step": step, "mlp_only_layers": mlp_only}
    assert ModelConfig.from_hf(config).moe_layers == moe_layers
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    assert tuple(i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts")) == moe_layers


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_tiny_configs_build_in_transformers(name):
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny_config(name)))
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 512)
    attn = model.model.layers[0].self_attn
    assert (attn.q_proj.bias is not None) == (name == "tiny-qwen2")
    assert hasattr(attn, "q_norm") == (name == "tiny-qwen3")


def test_unknown_random_lists_available():
    with pytest.raises(ModelNotFoundError, match="random:tiny-qwen3") as err:
        resolve_model("random:nope")
    assert "random:nope" in str(err.value)


def test_byte_tokenizer_round_trip_and_specials():
    tok = byte_tokenizer()
    for text in TEXTS:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
    assert tok.encode("abc") == [97, 98, 99]
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [256, 257, 258]
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 258
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 256
    assert tok.bos_token_id is None  # nothing is prepended


def test_byte_tokenizer_chat_template():
    tok = byte_tokenizer()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    no_prompt = tok.apply_chat_template(messages, tokenize=False)
    assert not no_prompt.endswith("assistant\n")
    ids = tok.encode(text)
    assert ids[0] == 257 and ids.count(258) == 2


def test_byte_tokenizer_save_load(tmp_path):
    from transformers import AutoTokenizer

    byte_tokenizer().save_pretrained(str(tmp_path))
    again = AutoTokenizer.from_pretrained(str(tmp_path))
    for text in TEXTS:
        assert again.encode(text) == byte_tokenizer().encode(text)
        assert again.decode(again.encode(text)) == text
    assert again.eos_token == "<|im_end|>" and again.chat_template == byte_tokenizer().chat_template


# --- spec parsing ----------------------------------------------------------------------------------


def test_unknown_spec_is_explained():
    with pytest.raises(ModelNotFoundError, match="Unknown model") as err:
        resolve_model("no-such-model")
    assert "qwen2.5-coder-1.5b" in str(err.value) and "random:" in str(err.value)


def test_missing_paths():
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model("./nothing/here")
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model("missing.gguf")


def test_default_is_embedded_1_5b(monkeypatch):
    seen = []
    monkeypatch.setattr(model_sources, "_resolve_embedded", lambda alias, progress: seen.append(alias))
    resolve_model(None)
    resolve_model("  ")
    assert seen == [model_sources.DEFAULT_MODEL] * 2 == ["qwen2.5-coder-1.5b"] * 2
    assert model_sources.list_embedded() == ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"]


# --- local directories -----------------------------------------------------------------------------


def test_local_dir_ok(tmp_path):
    path = write_model_dir(tmp_path / "m", tiny_config())
    src = resolve_model(str(path))
    assert (src.kind, src.path, src.default_draft_head) == ("local", path.resolve(), None)
    assert src.hf_config["model_type"] == "qwen3"
    tok = load_tokenizer(src)
    assert tok.decode(tok.encode("héllo")) == "héllo" and tok.chat_template


def test_local_dir_missing_files(tmp_path):
    path = write_model_dir(tmp_path / "noweights", tiny_config(), weights=False)
    with pytest.raises(ModelNotFoundError, match="no \\*.safetensors"):
        resolve_model(str(path))
    (path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(ModelNotFoundError, match="pickled"):
        resolve_model(str(path))
    path = write_model_dir(tmp_path / "noconfig", tiny_config())
    (path / "config.json").unlink()
    with pytest.raises(ModelNotFoundError, match="config.json"):
        resolve_model(str(path))
    path = write_model_dir(tmp_path / "notok", tiny_config(), tokenizer=False)
    with pytest.raises(ModelNotFoundError, match="tokenizer"):
        resolve_model(str(path))


def test_local_dir_missing_shard(tmp_path):
    path = write_model_dir(tmp_path / "sharded", tiny_config(), weights=False)
    save_file({"a": torch.ones(1)}, str(path / "model-00001-of-00002.safetensors"))
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelNotFoundError, match="model-00002-of-00002.safetensors"):
        resolve_model(str(path))


@pytest.mark.parametrize(
    "model_type, message", [("qwen2_moe", "not supported yet"), ("mamba", "cannot run"), (None, "no model_type")]
)
def test_unsupported_model_type(tmp_path, model_type, message):
    config = tiny_config()
    config.pop("model_type")
    if model_type:
        config["model_type"] = model_type
    path = write_model_dir(tmp_path / "m", config)
    with pytest.raises(ModelNotFoundError, match=message):
        resolve_model(str(path))


# --- Hugging Face hub (offline, against a hand-built cache) -----------------------------------------


def fake_hub_repo(hf_home: Path, repo_id: str, config: dict) -> Path:
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return write_model_dir(repo / "snapshots" / commit, config)


def test_hub_offline_cached(tmp_path):
    snapshot = fake_hub_repo(tmp_path / "hf", "Qwen/Qwen3-8B", tiny_config())
    events = []
    src = resolve_model("Qwen/Qwen3-8B", progress=lambda what, frac: events.append(what))
    assert src.kind == "hub" and src.name == "Qwen/Qwen3-8B"
    assert src.path == snapshot and src.default_draft_head == "JetSpec/jetspec-qwen3-8b"
    assert src.hf_config["model_type"] == "qwen3"
    assert load_tokenizer(src).eos_token == "<|im_end|>"
    assert events


def test_hub_gpt_oss_picks_its_published_head(tmp_path):
    fake_hub_repo(tmp_path / "hf", "openai/gpt-oss-20b", tiny_config("tiny-gpt-oss"))
    src = resolve_model("openai/gpt-oss-20b")
    assert src.default_draft_head == "JetSpec/jetspec-gpt-oss-20b"
    assert src.hf_config["model_type"] == "gpt_oss"


def test_hub_gemma4_picks_its_published_head(tmp_path):
    text = tiny_config("tiny-gemma4")
    multimodal = {"model_type": "gemma4", "text_config": {k: v for k, v in text.items() if k != "model_type"}}
    fake_hub_repo(tmp_path / "hf", "google/gemma-4-26B-A4B-it", multimodal)
    src = resolve_model("google/gemma-4-26B-A4B-it")
    assert src.default_draft_head == "JetSpec/jetspec-gemma4-26B-A4B0-it"
    assert src.hf_config["model_type"] == "gemma4"


def published_head_repo(hf_home: Path, repo_id: str, target: dict, layers: int = 2, inter: int = 96) -> Path:
    """A head repo in the hub cache laid out as JetSpec/DFlash publish heads: config.json (a
    "qwen3"-typed DFlashDraftModel with the target's attention shape, RoPE and vocabulary, the
    taps and mask token under dflash_config), model.safetensors in bf16 with unprefixed names,
    no embedding or lm_head, and a dflash.py that must never run."""
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    d = repo / "snapshots" / commit
    d.mkdir(parents=True)
    h, heads, kv_heads, hd = target["hidden_size"], target["num_attention_heads"], target["num_key_value_heads"], target["head_dim"]
    taps = [1, target["num_hidden_layers"] - 2]
    config = {
        "architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "model_type": "qwen3",
        "hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": hd, "intermediate_size": inter, "rms_norm_eps": 1e-5, "vocab_size": target["vocab_size"],
        "max_position_embeddings": target["max_position_embeddings"], "rope_parameters": target["rope_parameters"],
        "block_size": 8, "num_target_layers": target["num_hidden_layers"], "torch_dtype": "bfloat16",
        "dflash_config": {"mask_token_id": target["vocab_size"] - 1, "target_layer_ids": taps, "causal_head": True},
    }
    (d / "config.json").write_text(json.dumps(config))
    (d / "dflash.py").write_text("raise SystemExit('remote code must never run')\n")
    g = torch.Generator().manual_seed(0)
    w = {"fc.weight": torch.randn(h, len(taps) * h, generator=g), "hidden_norm.weight": torch.ones(h), "norm.weight": torch.ones(h)}
    for i in range(layers):
        p = f"layers.{i}."
        w |= {p + "self_attn.q_proj.weight": torch.randn(heads * hd, h, generator=g),
              p + "self_attn.k_proj.weight": torch.randn(kv_heads * hd, h, generator=g),
              p + "self_attn.v_proj.weight": torch.randn(kv_heads * hd, h, generator=g),
              p + "self_attn.o_proj.weight": torch.randn(h, heads * hd, generator=g),
              p + "self_attn.q_norm.weight": torch.ones(hd), p + "self_attn.k_norm.weight": torch.ones(hd),
              p + "mlp.gate_proj.weight": torch.randn(inter, h, generator=g),
              p + "mlp.up_proj.weight": torch.randn(inter, h, generator=g),
              p + "mlp.down_proj.weight": torch.randn(h, inter, generator=g),
              p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h)}
    save_file({k: (v * 0.05).to(torch.bfloat16) for k, v in w.items()}, str(d / "model.safetensors"))
    return d


def test_hub_gpt_oss_loads_its_published_head_format(tmp_path):
    """`jetspec-chat openai/gpt-oss-20b` resolves its head JetSpec/jetspec-gpt-oss-20b and loads it
    from the hub cache in the published layout (gpt-oss's shape, scaled down: YaRN RoPE, head_dim
    apart from hidden / heads), every published tensor landing in the head's weights."""
    from safetensors import safe_open

    from jetspec_chat.engine.layers import hf_parameters
    from jetspec_chat.engine.model_config import ModelConfig
    from jetspec_chat.engine.models.loader import load_draft_head

    target = tiny_config("tiny-gpt-oss")
    fake_hub_repo(tmp_path / "hf", "openai/gpt-oss-20b", target)
    head_dir = published_head_repo(tmp_path / "hf", "JetSpec/jetspec-gpt-oss-20b", target)
    src = resolve_model("openai/gpt-oss-20b")
    head, name = load_draft_head(None, src, ModelConfig.from_hf(src.hf_config), torch.device("cpu"), torch.float32)
    assert name == "JetSpec/jetspec-gpt-oss-20b"
    assert head.cfg.target_layer_ids == (1, 2) and head.cfg.causal and head.cfg.block_size == 8
    assert head.cfg.rope_scaling["rope_type"] == "yarn" and head.cfg.rope_theta == 150000.0
    got = dict(hf_parameters(head))
    with safe_open(str(head_dir / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(got)
        for key in f.keys():
            assert torch.equal(got[key], f.get_tensor(key).float()), key


def test_hub_offline_not_cached_no_network(monkeypatch):
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("Qwen/Qwen3-30B-A3B")
    message = str(err.value)
    assert "HF_HUB_OFFLINE" in message and "hf download Qwen/Qwen3-30B-A3B" in message and "HF_HOME=" in message
    assert "\n" not in message


def test_hub_unsupported_architecture_before_weights(tmp_path):
    config = tiny_config()
    config["model_type"] = "qwen2_moe"
    fake_hub_repo(tmp_path / "hf", "Qwen/Qwen1.5-MoE-A2.7B", config)
    with pytest.raises(ModelNotFoundError, match="not supported yet"):
        resolve_model("Qwen/Qwen1.5-MoE-A2.7B")


def test_download_hub_dir_error_class():
    from jetspec_chat.engine.errors import DraftHeadError

    with pytest.raises(DraftHeadError, match="HF_HUB_OFFLINE"):
        model_sources.download_hub_dir("JetSpec/jetspec-qwen3-8b", model_sources.HEAD_PATTERNS, error=DraftHeadError)


def test_hub_env_read_at_call_time(tmp_path, monkeypatch):
    other = tmp_path / "other-hf"
    fake_hub_repo(other, "Org/Model", tiny_config("tiny-llama"))
    with pytest.raises(ModelNotFoundError):
        resolve_model("Org/Model")
    monkeypatch.setenv("HF_HOME", str(other))
    assert resolve_model("Org/Model").hf_config["model_type"] == "llama"


# --- GGUF conversion (a tiny synthetic file) --------------------------------------------------------


def write_tiny_gguf(path: Path, arch: str = "qwen2", with_template: bool = False) -> Path:
    """A two-layer float32 Qwen2 GGUF with a byte-level vocabulary, like llama.cpp writes them."""
    import gguf
    import numpy as np

    from jetspec_chat.engine.models.byte_tokenizer import _byte_symbols

    hidden, layers, heads, kv_heads, ffn = 32, 2, 4, 2, 64
    tokens = _byte_symbols() + ["he", "ll", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny test")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 3) + [3] * 3)
    w.add_token_merges(["h e", "l l"])
    # Deliberately the base-model eos, as some GGUF exports have it: the converter must fix it.
    w.add_eos_token_id(tokens.index("<|endoftext|>"))
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    if with_template:
        w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    rng = np.random.default_rng(0)

    def rand(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    kv = kv_heads * hidden // heads
    w.add_tensor("token_embd.weight", rand(len(tokens), hidden))
    w.add_tensor("output.weight", rand(len(tokens), hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for i in range(layers):
        p = f"blk.{i}."
        for name, shape in [("attn_q.weight", (hidden, hidden)), ("attn_k.weight", (kv, hidden)),
                            ("attn_v.weight", (kv, hidden)), ("attn_q.bias", (hidden,)), ("attn_k.bias", (kv,)),
                            ("attn_v.bias", (kv,)), ("attn_output.weight", (hidden, hidden)),
                            ("ffn_gate.weight", (ffn, hidden)), ("ffn_up.weight", (ffn, hidden)),
                            ("ffn_down.weight", (hidden, ffn))]:
            w.add_tensor(p + name, rand(*shape))
        w.add_tensor(p + "attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_architecture_reader(tmp_path):
    assert embedded.gguf_architecture(write_tiny_gguf(tmp_path / "a.gguf")) == "qwen2"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"nope" * 10)
    with pytest.raises(ModelNotFoundError, match="not a GGUF file"):
        resolve_model(str(bad))


def test_gguf_convert_once(tmp_path, monkeypatch, capfd):
    gguf_path = write_tiny_gguf(tmp_path / "tiny.gguf")
    events: list[tuple[str, float | None]] = []
    src = resolve_model(str(gguf_path), progress=lambda what, frac: events.append((what, frac)))
    assert src.kind == "gguf" and src.path.parent == tmp_path / "cache" / "models"
    assert src.hf_config["model_type"] == "qwen2" and src.hf_config["num_hidden_layers"] == 2
    assert src.hf_config["eos_token_id"] == 260  # <|im_end|>, not the GGUF's <|endoftext|>
    files = {p.name for p in src.path.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", embedded.MARKER} <= files
    assert not any(name.endswith(".gguf") for name in files)
    assert not [p for p in src.path.parent.iterdir() if p.name.startswith(".tmp-")]
    assert json.loads((src.path / "generation_config.json").read_text())["eos_token_id"] == [260, 258]
    converting = [f for what, f in events if what.startswith("Converting")]
    assert converting[0] is None  # no 0% while transformers prepares: an indeterminate phase
    fractions = [f for f in converting if f is not None]
    assert fractions and fractions[0] > 0 and fractions[-1] == 1.0 and fractions == sorted(fractions)
    assert "Converting and de-quantizing" not in capfd.readouterr().err  # no tqdm bars on the terminal

    tok = load_tokenizer(src)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")  # Qwen2.5 fallback template
    assert tok.decode(tok.encode("héllo wörld")) == "héllo wörld"

    from safetensors import safe_open

    with safe_open(str(src.path / "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16

    # Second start: found in the cache, nothing converted.
    monkeypatch.setattr(model_sources, "convert_gguf", lambda *a, **k: pytest.fail("converted twice"))
    assert resolve_model(str(gguf_path)).path == src.path


def test_gguf_keeps_its_template_and_rejects_unsupported_arch(tmp_path):
    src = resolve_model(str(write_tiny_gguf(tmp_path / "t.gguf", with_template=True)))
    assert load_tokenizer(src).chat_template == "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ModelNotFoundError, match="not supported yet"):
        resolve_model(str(write_tiny_gguf(tmp_path / "moe.gguf", arch="qwen2moe")))


def test_failed_conversion_leaves_no_half_cache(tmp_path, monkeypatch):
    def crash(gguf, out, label, progress):
        (out / "config.json").write_text("{}")
        raise RuntimeError("killed mid-conversion")

    monkeypatch.setattr(model_sources, "convert_gguf", crash)
    gguf_path = write_tiny_gguf(tmp_path / "tiny.gguf")
    with pytest.raises(RuntimeError):
        resolve_model(str(gguf_path))
    models = tmp_path / "cache" / "models"
    assert list(models.iterdir()) == []


def test_stale_staging_dirs_are_removed(tmp_path):
    models = tmp_path / "cache" / "models"
    dead = models / ".tmp-999999999-x-abc"  # no such pid
    dead.mkdir(parents=True)
    with embedded.staging(models / "x", "key") as tmp:
        (tmp / "config.json").write_text("{}")
    assert not dead.exists()
    assert embedded.is_complete(models / "x", "key") and not embedded.is_complete(models / "x", "other")


# --- embedded part packages (fake, small) ----------------------------------------------------------


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    """Install three fake part modules and an EmbeddedModel over them."""
    chunks = [b"GGUF" + bytes(range(256)) * 40, bytes(1000), b"tail" * 3]
    names = []
    for i, chunk in enumerate(chunks, 1):
        part = tmp_path / f"part{i:02d}.bin"
        part.write_bytes(chunk)
        module = types.ModuleType(f"fake_model_part{i}")
        module.get_part_path = lambda part=part: str(part)
        monkeypatch.setitem(sys.modules, module.__name__, module)
        names.append(f"fake-model-part{i}")
    blob = b"".join(chunks)
    model = embedded.EmbeddedModel(
        alias="fake", description="fake", packages=tuple(names), version="1.0", extra="embedded-fake",
        size=len(blob), sha256=hashlib.sha256(blob).hexdigest(),
    )
    monkeypatch.setitem(embedded.EMBEDDED, "fake", model)
    return model, blob


def test_assemble_and_verify(fake_parts, tmp_path):
    model, blob = fake_parts
    out = tmp_path / "out.gguf"
    fractions = []
    embedded.assemble_gguf(model, embedded.find_parts(model), out, lambda what, f: fractions.append(f))
    assert out.read_bytes() == blob
    done = [f for f in fractions if f is not None]
    assert done[0] == 0.0 and done[-1] == 1.0 and done == sorted(done)


def test_assemble_detects_corruption(fake_parts, tmp_path, monkeypatch):
    model, blob = fake_parts
    bad = embedded.EmbeddedModel(**{**model.__dict__, "sha256": "0" * 64})
    with pytest.raises(ModelNotFoundError, match="sha256"):
        embedded.assemble_gguf(bad, embedded.find_parts(bad), tmp_path / "x.gguf")
    short = embedded.EmbeddedModel(**{**model.__dict__, "size": model.size + 1})
    with pytest.raises(ModelNotFoundError, match="force-reinstall"):
        embedded.assemble_gguf(short, embedded.find_parts(short), tmp_path / "x.gguf")


def test_ensure_embedded_pipeline(fake_parts, tmp_path, monkeypatch):
    """Assembly -> conversion -> rename, with the conversion stubbed; the .gguf is gone afterwards."""
    model, blob = fake_parts
    seen = {}

    def fake_convert(gguf, out, label, progress):
        seen["bytes"] = gguf.read_bytes()
        (out / "config.json").write_text(json.dumps(tiny_config("tiny-qwen2")))

    monkeypatch.setattr(embedded, "convert_gguf", fake_convert)
    path = embedded.ensure_embedded("fake")
    assert seen["bytes"] == blob
    assert path == tmp_path / "cache" / "models" / "fake"
    assert sorted(p.name for p in path.iterdir()) == sorted(["config.json", embedded.MARKER])
    # Cached: the part packages are not even needed any more.
    monkeypatch.setattr(embedded, "find_parts", lambda m: pytest.fail("looked for parts again"))
    assert embedded.ensure_embedded("fake") == path
    src = resolve_model("fake")
    assert src.kind == "embedded" and src.path == path and src.default_draft_head is None


@pytest.mark.parametrize("alias, extra", [("qwen2.5-coder-1.5b", "embedded"), ("qwen2.5-coder-0.5b", "embedded-small")])
def test_missing_part_package_names_pip_command(monkeypatch, alias, extra):
    model = embedded.EMBEDDED[alias]
    real_import = embedded.importlib.import_module

    def no_parts(name, *args):
        if name in model.modules:
            raise ModuleNotFoundError(name)
        return real_import(name, *args)

    monkeypatch.setattr(embedded.importlib, "import_module", no_parts)
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model(alias)
    message = str(err.value)
    assert f'pip install "jetspec-chat[{extra}]"' in message
    assert f"{model.packages[0]}=={model.version}" in message and f"{model.packages[-1]}=={model.version}" in message
    assert "\n" not in message


# (hidden size, layers) of the embedded targets: the shipped heads must be made for them.
EMBEDDED_SHAPES = {"qwen2.5-coder-1.5b": (1536, 28), "qwen2.5-coder-0.5b": (896, 24)}


@pytest.mark.parametrize("alias", sorted(EMBEDDED_SHAPES))
def test_shipped_embedded_heads(alias):
    """Each embedded model has a trained head in the package, in the published format, at most 100 MB (int8 storage allowed)."""
    from jetspec_chat.engine.draft_head import load_head_dir

    assert set(embedded.EMBEDDED_HEADS) == set(embedded.EMBEDDED)
    path = Path(embedded.embedded_head_path(alias))
    assert (path / "config.json").is_file() and (path / "model.safetensors").stat().st_size <= 100_000_000
    head = load_head_dir(path, torch.device("cpu"), torch.float32)
    hidden, layers = EMBEDDED_SHAPES[alias]
    assert (head.cfg.hidden_size, head.cfg.num_target_layers, head.cfg.causal) == (hidden, layers, True)
    assert head.cfg.vocab_size == 151936 and head.cfg.block_size == 16
    record = json.loads((path / "training.json").read_text())
    assert record["target"] == alias and record["train"]["steps"] > 0 and record["eval"]["dev"]


def test_model_source_is_hashable():
    src = ModelSource(name="x", kind="random", hf_config={"a": 1}, path=None, default_draft_head=None)
    assert hash(src) == hash(ModelSource(name="x", kind="random", hf_config={"a": 2}, path=None, default_draft_head=None))


def test_hybrid_real_shapes_and_heads():
    """The Qwen3.5-family real shapes parse as hybrid (3 linear : 1 full attention, partial
    RoPE); the 35B-A3B maps to its published head; the 27B says why it has none."""
    from jetspec_chat.engine.model_config import ModelConfig

    moe = ModelConfig.from_hf(resolve_model("random:Qwen/Qwen3.6-35B-A3B").hf_config)
    dense = ModelConfig.from_hf(resolve_model("random:Qwen/Qwen3.8-27B").hf_config)
    assert moe.hybrid.full_layers == tuple(range(3, 40, 4)) and moe.num_experts == 256 and moe.norm_topk_prob
    assert moe.hybrid.shared_expert_intermediate_size == 512 and moe.hybrid.rotary_dim == 64
    assert len(dense.hybrid.linear_layers) == 48 and dense.hybrid.linear_v_heads == 48 and dense.num_experts == 0
    assert model_sources.DEFAULT_HEADS["qwen/qwen3.6-35b-a3b"] == "JetSpec/jetspec-Qwen3.6-35B-A3B"
    assert "train-head" in model_sources.HEAD_NOTES["qwen/qwen3.8-27b"]
    # A multimodal checkpoint config (model_type qwen3_5 with a text_config) reads as its text model.
    wrapped = ModelConfig.from_hf({"model_type": "qwen3_5", "text_config": resolve_model("random:Qwen/Qwen3.8-27B").hf_config})
    assert wrapped == dense


def test_hub_gemma4_loads_its_published_head_format(tmp_path):
    """`jetspec-chat google/gemma-4-26B-A4B-it` resolves JetSpec/jetspec-gemma4-26B-A4B0-it and loads
    it from the hub cache in the published layout, with the sliding layers' RoPE (a head's block
    attends like a sliding layer of its target), every published tensor landing in the head."""
    from safetensors import safe_open

    from jetspec_chat.engine.layers import hf_parameters
    from jetspec_chat.engine.model_config import ModelConfig
    from jetspec_chat.engine.models.loader import load_draft_head

    text = tiny_config("tiny-gemma4")
    multimodal = {"model_type": "gemma4", "text_config": {k: v for k, v in text.items() if k != "model_type"}}
    fake_hub_repo(tmp_path / "hf", "google/gemma-4-26B-A4B-it", multimodal)
    head_dir = published_head_repo(tmp_path / "hf", "JetSpec/jetspec-gemma4-26B-A4B0-it",
                                   dict(text, rope_parameters=text["rope_parameters"]["sliding_attention"]))
    src = resolve_model("google/gemma-4-26B-A4B-it")
    head, name = load_draft_head(None, src, ModelConfig.from_hf(src.hf_config), torch.device("cpu"), torch.float32)
    assert name == "JetSpec/jetspec-gemma4-26B-A4B0-it"
    assert head.cfg.target_layer_ids == (1, 2) and head.cfg.causal and head.cfg.rope_theta == 10000.0
    got = dict(hf_parameters(head))
    with safe_open(str(head_dir / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(got)
        for key in f.keys():
            assert torch.equal(got[key], f.get_tensor(key).float()), key


def test_a_resolved_source_travels_to_the_ranks_as_json(tmp_path):
    """The tensor-parallel launcher hands the source it resolved to its worker ranks as JSON
    (ModelSource.to_dict): what comes back is the same source, path and all, for a model
    directory and for a random model (its config and head carried, no path)."""
    for source in (resolve_model(str(write_model_dir(tmp_path / "m", tiny_config()))), resolve_model("random:tiny-qwen3")):
        again = ModelSource.from_dict(json.loads(json.dumps(source.to_dict())))
        assert again == source and again.hf_config == source.hf_config and again.random_head == source.random_head
        assert again.path == source.path


def test_the_engine_resolves_its_model_once(monkeypatch):
    """load_engine with --tp unset or 1 resolves the model once (a hub model's requests, a converted
    copy's check) and hands that source to the loader. (--tp 2, the launcher and its ranks:
    tests/engine/test_parallel.py.)"""
    from jetspec_chat.engine import load_engine

    calls = []
    resolve = model_sources.resolve_model
    monkeypatch.setattr(model_sources, "resolve_model", lambda model, progress=None: calls.append(model) or resolve(model, progress))
    for tp in (None, 1):
        calls.clear()
        engine = load_engine("random:tiny-qwen3", "none", device="cpu", dtype="float32", max_context=256, tp=tp)
        assert calls == ["random:tiny-qwen3"] and engine.model_name == "random:tiny-qwen3", (tp, calls)

"""Gemma 4 (text part): its config, its checkpoint layout, its cache of two KV shapes.
Greedy = transformers and logit parity run on tiny-gemma4 in test_lossless / test_model_parity."""
import json
from importlib.resources import files

import pytest
import torch

from engine_helpers import hf_model, random_prompt, tiny_engine
from jetspec_chat.engine.errors import ModelNotFoundError
from jetspec_chat.engine.gemma4 import build_gemma4_target
from jetspec_chat.engine.kv_cache import MixedKVCache
from jetspec_chat.engine.model import ForwardBatch
from jetspec_chat.engine.model_config import ModelConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def bundled(name: str) -> dict:
    return json.loads(files("jetspec_chat.engine.models.configs").joinpath(f"{name}.json").read_text())


def test_the_26b_a4b_config_reads_as_its_architecture():
    text = bundled("google--gemma-4-26B-A4B-it")
    # The released config.json is multimodal: the text model is its text_config.
    for raw in (text, {"model_type": "gemma4", "text_config": {k: v for k, v in text.items() if k != "model_type"}}):
        cfg = ModelConfig.from_hf(raw)
        g = cfg.gemma4
        assert cfg.model_type == "gemma4_text" and cfg.num_layers == 30
        assert [i for i in range(30) if cfg.window(i) == 0] == [5, 11, 17, 23, 29]
        assert {cfg.window(i) for i in range(30)} == {0, 1024}
        assert (cfg.num_kv_heads, cfg.head_dim, g.global_kv_heads, g.global_head_dim) == (8, 256, 2, 512)
        assert g.k_eq_v and g.moe and g.final_logit_softcap == 30.0
        assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (128, 8, 704)
        assert (cfg.rope_theta, g.global_rope_theta, g.global_rotary_factor) == (10_000.0, 1_000_000.0, 0.25)
        assert cfg.tie_word_embeddings


def test_global_kv_heads_apply_only_with_k_eq_v():
    """transformers' rule: without attention_k_eq_v the global layers keep num_key_value_heads."""
    raw = bundled("tiny-gemma4") | {"attention_k_eq_v": False}
    assert ModelConfig.from_hf(raw).gemma4.global_kv_heads == raw["num_key_value_heads"]


@pytest.mark.parametrize("change", [{"hidden_size_per_layer_input": 256}, {"num_kv_shared_layers": 2},
                                    {"use_bidirectional_attention": "all"}])
def test_unsupported_gemma4_variants_are_one_clear_sentence(change):
    with pytest.raises(ModelNotFoundError, match="not supported"):
        ModelConfig.from_hf(bundled("tiny-gemma4") | change)


def test_the_cache_holds_each_layer_in_its_own_shape():
    engine = tiny_engine("tiny-gemma4")
    kv = engine.target.make_cache(64, torch.device("cpu"), torch.float32, block_size=8)
    assert isinstance(kv, MixedKVCache) and len(kv.pools) == 2
    shapes = [tuple(kv.layer(i)[0].shape[-2:]) for i in range(4)]
    assert shapes == [(2, 16), (2, 16), (1, 32), (1, 32)]  # sliding: 2 x 16; global: 1 x 32
    for pool in kv.pools:
        pool.normal_()
    kv.move_rows(torch.tensor([10, 11]), torch.tensor([3, 4]))
    for i in range(4):
        k, v = kv.layer(i)
        assert torch.equal(k.reshape(-1, *k.shape[2:])[3:5], k.reshape(-1, *k.shape[2:])[10:12])
        assert torch.equal(v.reshape(-1, *v.shape[2:])[3:5], v.reshape(-1, *v.shape[2:])[10:12])


def test_released_checkpoint_layout_loads(tmp_path):
    """The released checkpoints are multimodal: the text weights under model.language_model.
    (global layers without v_proj, the experts stacked), beside vision weights that are skipped."""
    from safetensors.torch import save_file

    hf = hf_model("tiny-gemma4")
    state = {("model.language_model." + k[len("model."):]): v.contiguous() for k, v in hf.state_dict().items()
             if k != "lm_head.weight"}
    assert not any(".2.self_attn.v_proj" in k for k in state)  # K = V on the global layers
    state["model.vision_tower.encoder.layers.0.mlp.fc1.weight"] = torch.zeros(2, 2)
    save_file(state, str(tmp_path / "model.safetensors"))
    engine = tiny_engine("tiny-gemma4")
    ours = build_gemma4_target(engine.target.cfg, torch.device("cpu"), torch.float32)
    ours.load_safetensors(tmp_path)
    ids = random_prompt(5, 20)
    batch = ForwardBatch(torch.tensor(ids), torch.arange(20), torch.ones(20, 20, dtype=torch.bool).tril(), 0)
    with torch.inference_mode():
        got = [m.logits(m(batch, m.make_cache(32, torch.device("cpu"), torch.float32))[0])
               for m in (ours, engine.target)]
    assert torch.equal(got[0], got[1])


def test_logits_are_soft_capped():
    engine = tiny_engine("tiny-gemma4")
    cap = engine.target.cfg.gemma4.final_logit_softcap
    hidden = torch.randn(3, engine.target.cfg.hidden_size, generator=torch.Generator().manual_seed(0)) * 5
    logits = engine.target.logits(hidden)
    raw = hidden @ engine.target.lm_head_weight().T
    assert logits.abs().max() <= cap < raw.abs().max()
    torch.testing.assert_close(logits, torch.tanh(raw / cap) * cap)


def test_embeddings_are_scaled_for_the_target_and_the_draft_head():
    engine = tiny_engine("tiny-gemma4")
    embed = engine.target.model.embed_tokens
    ids = torch.tensor([3, 300])
    assert torch.equal(embed(ids), embed.weight[ids] * 8.0)  # sqrt(hidden 64), exact in every dtype
    engine.allocate()
    passed = []  # the embedding the drafter hands the head: the target's scaled one

    def spy(cache, anchor, depth, embed_tokens, *rest):
        passed.append(embed_tokens)
        return torch.zeros(depth, engine.target.cfg.vocab_size)

    engine.head.draft_logits = spy
    engine.drafter.logp(engine.anchor, 2)
    assert passed == [embed]


def test_heads_wider_than_the_gpu_kernel_takes_are_refused_on_cuda_in_one_sentence_before_any_allocation():
    """The GPU tree attention takes heads up to 512 wide: the 26B-A4B's global layers (512) and
    tiny-gemma4 pass the loader's check; a config with 1024-wide global heads is refused before
    anything touches the device."""
    from dataclasses import replace

    from jetspec_chat.engine.models.loader import load_target
    from jetspec_chat.engine.models.model_sources import resolve_model
    from jetspec_chat.kernels.tree_attention import MAX_HEAD_DIM

    real = resolve_model("random:google/gemma-4-26B-A4B-it")
    for source in (real, resolve_model("random:tiny-gemma4")):
        cfg = ModelConfig.from_hf(source.hf_config)
        assert max(cfg.head_dim, cfg.gemma4.global_head_dim) <= MAX_HEAD_DIM == 512
    wide = replace(real, hf_config={**real.hf_config, "global_head_dim": 1024})
    with pytest.raises(ModelNotFoundError, match=r"CPU only: its 1024-wide attention heads are wider than the GPU "
                                                 r"tree attention takes \(at most 512\); use --device cpu"):
        load_target(wide, torch.device("cuda"), torch.bfloat16)
    # fp32 tiles take heads up to 128 wide on the GPU: the 26B-A4B in fp32 is refused there too.
    with pytest.raises(ModelNotFoundError, match=r"runs in float32 on the CPU only: its 512-wide attention heads .* "
                                                 r"\(at most 128\); use --dtype bfloat16 or --device cpu"):
        load_target(real, torch.device("cuda"), torch.float32)
    tiny = ModelConfig.from_hf(resolve_model("random:tiny-gemma4").hf_config)
    assert max(tiny.head_dim, tiny.gemma4.global_head_dim) <= 128  # its fp32 GPU test runs

"""Our target model's logits equal transformers' on the same weights (fp32, tight tolerance),
for a prefill, chunked prefills over the paged cache, and a tree verify."""
import pytest
import torch

from engine_helpers import hf_model, random_prompt, tiny_engine
from jetspec_chat.engine.kv_cache import PagedKVCache
from jetspec_chat.engine.model import ForwardBatch
from jetspec_chat.engine.tree import ancestor_mask


def our_logits(engine, ids, chunks):
    cfg = engine.target.cfg
    if cfg.gemma4 is not None:  # KV rows of two shapes
        kv = engine.target.make_cache(256, torch.device("cpu"), torch.float32, block_size=8)
    else:
        kv = PagedKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 256, torch.device("cpu"), torch.float32,
                          block_size=8)
    # scatter the blocks so paging is really exercised
    kv.block_table = torch.randperm(kv.capacity // kv.block_size, generator=torch.Generator().manual_seed(0)).int()
    out, start = [], 0
    for n in chunks:
        t = torch.tensor(ids[start:start + n])
        batch = ForwardBatch(t, torch.arange(start, start + n), torch.ones(n, n, dtype=torch.bool).tril(), start)
        hidden, _ = engine.target(batch, kv)
        out.append(engine.target.logits(hidden))
        start += n
    return torch.cat(out), kv


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-qwen3-moe", "tiny-gpt-oss",
                                  "tiny-gemma4"])
def test_prefill_logits_match_transformers(name):
    engine = tiny_engine(name)
    ids = random_prompt(1, 45)
    with torch.inference_mode():
        ref = hf_model(name)(torch.tensor([ids])).logits[0].float()
        for chunks in ([45], [20, 1, 24], [7] * 6 + [3]):
            ours, _ = our_logits(engine, ids, chunks)
            torch.testing.assert_close(ours, ref, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3", "tiny-qwen3-moe", "tiny-gpt-oss", "tiny-gemma4"])
def test_tree_verify_logits_match_each_branch_run_alone(name):
    """Each tree node's logits equal transformers' logits for its own root-to-node sequence."""
    engine = tiny_engine(name)
    prefix = random_prompt(2, 30)
    parents = [-1, 0, 0, 1, 1, 2, 3, 5, 5]
    tokens = [7, 11, 12, 13, 14, 15, 16, 17, 18]
    depths = [0, 1, 1, 2, 2, 2, 3, 3, 3]
    p = torch.tensor(parents)
    mask = ancestor_mask(p, 3)
    with torch.inference_mode():
        _, kv = our_logits(engine, prefix, [30])
        batch = ForwardBatch(torch.tensor(tokens), 30 + torch.tensor(depths), mask, 30)
        hidden, _ = engine.target(batch, kv)
        ours = engine.target.logits(hidden)
        for i in range(len(tokens)):
            branch, j = [], i
            while j >= 0:
                branch.insert(0, tokens[j])
                j = parents[j]
            ref = hf_model(name)(torch.tensor([prefix + branch])).logits[0, -1].float()
            torch.testing.assert_close(ours[i], ref, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-qwen3", "tiny-qwen3-moe"])
def test_hf_checkpoint_loads_into_the_fused_projections(name, tmp_path):
    """transformers' q/k/v (with Qwen2's biases) stack into qkv_proj and gate/up into
    gate_up_proj, in that row order; a MoE layer's per-expert checkpoint matrices
    (experts.{e}.gate_proj/up_proj/down_proj, saved by transformers in sharded files) land in
    the expert stacks; and the loaded model gives the same logits."""
    import json

    from jetspec_chat.engine.model import build_target
    from jetspec_chat.engine.model_config import ModelConfig

    from safetensors import safe_open

    hf = hf_model(name)
    hf.save_pretrained(tmp_path, max_shard_size="100KB")  # several shards and an index, as on the hub
    assert (tmp_path / "model.safetensors.index.json").is_file()
    (tmp_path / "stray.safetensors").write_bytes(b"not named in the index, so never opened")
    ours = build_target(ModelConfig.from_hf(json.loads((tmp_path / "config.json").read_text())),
                        torch.device("cpu"), torch.float32)
    ours.load_safetensors(tmp_path)
    saved = {}
    for f in tmp_path.glob("model*.safetensors"):
        with safe_open(str(f), framework="pt") as st:
            saved.update({k: st.get_tensor(k) for k in st.keys()})
    for i, (src, dst) in enumerate(zip(hf.model.layers, ours.model.layers)):
        a, m = src.self_attn, src.mlp
        assert torch.equal(dst.self_attn.qkv_proj.weight, torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
        if a.q_proj.bias is not None:
            assert torch.equal(dst.self_attn.qkv_proj.bias, torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
        if hasattr(m, "experts"):
            p = f"model.layers.{i}.mlp"
            assert torch.equal(dst.mlp.gate.weight, saved[f"{p}.gate.weight"])
            for e in range(dst.mlp.experts.gate_up_proj.shape[0]):
                gate_up = torch.cat([saved[f"{p}.experts.{e}.gate_proj.weight"], saved[f"{p}.experts.{e}.up_proj.weight"]])
                assert torch.equal(dst.mlp.experts.gate_up_proj[e], gate_up)
                assert torch.equal(dst.mlp.experts.down_proj[e], saved[f"{p}.experts.{e}.down_proj.weight"])
            assert torch.equal(dst.mlp.experts.gate_up_proj, m.experts.gate_up_proj)
        else:
            assert torch.equal(dst.mlp.gate_up_proj.weight, torch.cat([m.gate_proj.weight, m.up_proj.weight]))
    engine = tiny_engine(name)
    ids = random_prompt(3, 20)
    with torch.inference_mode():
        ref, _ = our_logits(engine, ids, [20])
        engine.target, original = ours, engine.target
        try:
            got, _ = our_logits(engine, ids, [20])
        finally:
            engine.target = original
    assert torch.equal(got, ref)

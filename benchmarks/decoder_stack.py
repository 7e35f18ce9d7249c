"""Shared by the decoder-stack benches (linear_in_stack.py, layer_ablation.py): the repository's package importable without installing it, the bundled
model shapes with a small vocabulary (the lm_head is not in their timings), random bf16 weights,
and a KV cache holding a random 512-token prefix."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import jetspec_chat  # noqa: E402  (the repo's jetspec_chat/; kernels/ and engine/ join its path)

if str(REPO) not in jetspec_chat.__path__:
    jetspec_chat.__path__.append(str(REPO))

import torch  # noqa: E402

from jetspec_chat.engine.kv_cache import PagedKVCache  # noqa: E402
from jetspec_chat.engine.model import ForwardBatch, TargetModel, build_target  # noqa: E402
from jetspec_chat.engine.model_config import ModelConfig  # noqa: E402

VOCAB = 4096
PREFIX = 512
ENGINE_CAPACITY = 33792  # the engine's KV capacity (tree_attention.py's default too)
HF = {
    "0.5B": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, rope_theta=1e6, tie_word_embeddings=True),
    "1.5B": dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, rope_theta=1e6, tie_word_embeddings=True),
    "8B": dict(model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
               num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=1e6),
}


def build_stack(name: str, capacity: int = ENGINE_CAPACITY) -> tuple[ModelConfig, TargetModel, PagedKVCache]:
    """The model of shape `name` (random weights, bf16, on the GPU) and its KV cache, the first
    PREFIX rows random and committed."""
    device = torch.device("cuda")
    cfg = ModelConfig.from_hf(HF[name] | {"vocab_size": VOCAB})
    model = build_target(cfg, device, torch.bfloat16)
    model.init_random(seed=0)
    kv = new_cache(cfg, capacity)
    kv.pool.normal_(generator=torch.Generator(device=device).manual_seed(1))
    kv.length = PREFIX
    return cfg, model, kv


def new_cache(cfg: ModelConfig, capacity: int) -> PagedKVCache:
    return PagedKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, capacity, torch.device("cuda"), torch.bfloat16)


def make_batch(t: int) -> ForwardBatch:
    """T new tokens after the prefix, causal (an AR step at T = 1)."""
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(t)
    return ForwardBatch(
        input_ids=torch.randint(0, VOCAB, (t,), device=device, generator=gen),
        positions=PREFIX + torch.arange(t, device=device),
        tree_mask=torch.ones(t, t, dtype=torch.bool, device=device).tril(),
        prefix_len=torch.tensor(PREFIX, device=device),
    )

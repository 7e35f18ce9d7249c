"""gpt-oss's MXFP4 expert checkpoints load, dequantized exactly as transformers dequantizes them."""
import json

import pytest
import torch
from safetensors.torch import save_file

from jetspec_chat.engine.layers import hf_parameters
from jetspec_chat.engine.model import build_target
from jetspec_chat.engine.model_config import ModelConfig
from jetspec_chat.engine.models.model_sources import resolve_model
from jetspec_chat.engine.mxfp4 import dequantize_mxfp4

mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")


def random_mxfp4(shape, seed):
    """blocks [*shape, 16] and scales [*shape] uint8: every FP4 code, scales 2^-6 .. 2^3."""
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (*shape, 16), generator=g, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(121, 131, tuple(shape), generator=g, dtype=torch.int32).to(torch.uint8)
    return blocks, scales


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequant_matches_transformers(dtype):
    blocks, scales = random_mxfp4((3, 10, 2), 0)
    ours = dequantize_mxfp4(blocks, scales, dtype, rows_per_chunk=7)  # chunk edges inside the rows
    theirs = mxfp4.convert_moe_packed_tensors(blocks, scales, dtype=dtype)
    assert ours.shape == (3, 64, 10) and ours.dtype == dtype
    assert torch.equal(ours, theirs)


def test_bad_pair_is_explained():
    blocks, scales = random_mxfp4((2, 4, 2), 1)
    with pytest.raises(ValueError, match="do not pair up"):
        dequantize_mxfp4(blocks, scales[:, :3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_checkpoint_with_mxfp4_experts_loads(tmp_path, dtype):
    """A tiny gpt-oss checkpoint in the official layout: experts as *_blocks / *_scales (the
    matrices transposed, 32 values a group), everything else, the expert biases too, plain (bf16
    as published). Loaded in fp32 or bf16 (the GPU's dtype), every expert equals transformers'
    dequantization in that dtype (exact: FP4 codes times powers of two fit bf16)."""
    cfg = ModelConfig.from_hf(resolve_model("random:tiny-gpt-oss").hf_config)
    model = build_target(cfg, torch.device("cpu"), torch.bfloat16)
    model.init_random(0)
    tensors, expected = {}, {}
    for i, (name, p) in enumerate(hf_parameters(model)):
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            e, k, n = p.shape  # in memory [E, K, N]; stored [E, N, K/32, 16]
            blocks, scales = random_mxfp4((e, n, k // 32), i)
            tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
            expected[name] = mxfp4.convert_moe_packed_tensors(blocks, scales, dtype=dtype)
        else:
            tensors[name] = p.detach().clone()
            expected[name] = tensors[name].to(dtype)
    half = len(tensors) // 2  # two shards: a pair may straddle them
    keys = sorted(tensors)
    save_file({k: tensors[k] for k in keys[:half]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({k: tensors[k] for k in keys[half:]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: f"model-0000{1 + (j >= half)}-of-00002.safetensors" for j, k in enumerate(keys)}}))
    loaded = build_target(cfg, torch.device("cpu"), dtype)
    loaded.load_safetensors(tmp_path)
    got = dict(hf_parameters(loaded))
    assert set(got) == set(expected)
    for name, t in expected.items():
        assert got[name].dtype == dtype and torch.equal(got[name], t), name

"""`--tp` left unset: one GPU where the target's weights fit it, else the fewest GPUs over which
the model splits and fits (engine/models/loader.py: choose_tp, auto_tp)."""
from __future__ import annotations

import pytest
import torch

from jetspec_chat.engine.errors import DeviceMemoryError
from jetspec_chat.engine.model_config import ModelConfig
from jetspec_chat.engine.models.loader import TP_WEIGHT_SHARE, auto_tp, choose_tp, target_weight_bytes
from jetspec_chat.engine.models.model_sources import resolve_model

GB = 10**9


def config(name: str) -> ModelConfig:
    return ModelConfig.from_hf(resolve_model(name).hf_config)


def test_weight_bytes_count_every_parameter_once():
    # Qwen3-8B: 8.19e9 parameters (untied lm_head); the 8B row of docs/performance.md reads
    # 15.14 GB an AR step, which counts one embedding row instead of the 1.24 GB table.
    cfg = config("random:Qwen/Qwen3-8B")
    assert target_weight_bytes(cfg, torch.bfloat16) == pytest.approx(16.38 * GB, rel=0.005)
    assert target_weight_bytes(cfg, torch.float32) == 2 * target_weight_bytes(cfg, torch.bfloat16)
    tiny = config("random:tiny-qwen3")
    tied = ModelConfig.from_hf(resolve_model("random:tiny-qwen3").hf_config | {"tie_word_embeddings": True})
    assert target_weight_bytes(tied, torch.bfloat16) == target_weight_bytes(tiny, torch.bfloat16) - 2 * tiny.vocab_size * tiny.hidden_size


def test_a_model_that_fits_one_gpu_takes_one():
    cfg = config("random:Qwen/Qwen3-8B")
    assert choose_tp(cfg, target_weight_bytes(cfg, torch.bfloat16), 80 * GB, 8, "Qwen3-8B") == 1


def test_a_model_larger_than_a_gpu_takes_the_fewest_that_hold_it():
    cfg = config("random:Qwen/Qwen3-235B-A22B")
    weights = target_weight_bytes(cfg, torch.bfloat16)
    assert weights == pytest.approx(470 * GB, rel=0.02)
    h200, h100 = 150 * GB, 85 * GB  # torch's total_memory of each, about
    assert choose_tp(cfg, weights, h200, 8, "Qwen3-235B-A22B") == 4  # as measured: 4 H200s
    with pytest.raises(DeviceMemoryError, match=r"8 GPUs: the KV heads \(4\) does not split"):
        choose_tp(cfg, weights, h100, 8, "Qwen3-235B-A22B")  # it fits 8 H100s but splits over at most 4
    assert choose_tp(cfg, 150 * GB, h200, 8, "x") == 2
    assert weights / 4 <= TP_WEIGHT_SHARE * h200 < weights / 2


def test_ranks_the_model_does_not_split_over_are_skipped():
    cfg = config("random:Qwen/Qwen3-8B")  # 8 KV heads: 3 does not divide them
    assert choose_tp(cfg, 200 * GB, 100 * GB, 4, "x") == 4


def test_a_model_no_split_holds_is_one_sentence():
    cfg = config("random:Qwen/Qwen3-235B-A22B")
    with pytest.raises(DeviceMemoryError) as err:
        choose_tp(cfg, target_weight_bytes(cfg, torch.bfloat16), 80 * GB, 2, "Qwen3-235B-A22B")
    message = str(err.value)
    assert "Qwen3-235B-A22B" in message and "2 GPUs" in message and "--tp" in message and "\n" not in message


def test_architectures_without_a_split_stay_on_one_gpu_or_say_why():
    gpt_oss = ModelConfig.from_hf(resolve_model("random:tiny-gpt-oss").hf_config)
    assert choose_tp(gpt_oss, GB, 80 * GB, 4, "tiny-gpt-oss") == 1
    with pytest.raises(DeviceMemoryError, match="gpt-oss is not split"):
        choose_tp(gpt_oss, 100 * GB, 80 * GB, 4, "tiny-gpt-oss")


def test_a_cpu_takes_one_without_reading_the_model():
    assert auto_tp("no/such-model", device="cpu") == 1

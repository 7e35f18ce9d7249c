"""Target model architecture, read from a Hugging Face config.json dict."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ModelNotFoundError

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool  # per-head RMSNorm on q and k (Qwen3)

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        model_type = cfg.get("model_type", "")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelNotFoundError(
                f"model type {model_type!r} is not supported yet; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        num_heads = cfg["num_attention_heads"]
        hidden = cfg["hidden_size"]
        rope_scaling = cfg.get("rope_scaling") or None
        rope_theta = cfg.get("rope_theta")
        if rope_theta is None:  # transformers 5 moved rope settings into `rope_parameters`
            rope_theta = (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        if rope_scaling is None and cfg.get("rope_parameters"):
            params = cfg["rope_parameters"]
            if params.get("rope_type", "default") != "default":
                rope_scaling = params
        if rope_scaling is not None and rope_scaling.get("rope_type", rope_scaling.get("type")) not in (
            "default",
            "llama3",
        ):
            raise ModelNotFoundError(f"rope scaling {rope_scaling!r} is not supported yet")
        return cls(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=cfg.get("head_dim") or hidden // num_heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) == "llama3" else None,
            max_position_embeddings=cfg.get("max_position_embeddings", 32768),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
            qk_norm=model_type == "qwen3",
        )

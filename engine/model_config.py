"""Target model architecture, read from a Hugging Face config.json dict."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ModelNotFoundError

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe", "gpt_oss", "qwen3_5_text", "qwen3_5_moe_text")
# Qwen3.5-family checkpoints: a multimodal config whose `text_config` is the text model.
MULTIMODAL_TEXT_TYPES = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}


@dataclass(frozen=True)
class HybridConfig:
    """Qwen3.5's hybrid layout: Gated DeltaNet layers beside gated full-attention layers."""

    layer_types: tuple[str, ...]  # "linear_attention" | "full_attention" per decoder layer
    linear_k_heads: int
    linear_v_heads: int
    linear_k_dim: int
    linear_v_dim: int
    conv_kernel: int
    rotary_dim: int  # partial RoPE: the first rotary_dim dims of each head rotate
    shared_expert_intermediate_size: int = 0  # MoE: a sigmoid-gated shared expert (0: none)

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @classmethod
    def from_hf(cls, cfg: dict, head_dim: int) -> "HybridConfig":
        n = cfg["num_hidden_layers"]
        types = cfg.get("layer_types")
        if not types:  # transformers' default: every full_attention_interval-th layer is full attention
            interval = int(cfg.get("full_attention_interval", 4))
            types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]
        rope = cfg.get("rope_parameters") or {}
        factor = float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25)))
        return cls(
            layer_types=tuple(types[:n]),
            linear_k_heads=int(cfg.get("linear_num_key_heads", 16)),
            linear_v_heads=int(cfg.get("linear_num_value_heads", 32)),
            linear_k_dim=int(cfg.get("linear_key_head_dim", 128)),
            linear_v_dim=int(cfg.get("linear_value_head_dim", 128)),
            conv_kernel=int(cfg.get("linear_conv_kernel_dim", 4)),
            rotary_dim=int(head_dim * factor),
            shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size", 0) or 0),
        )


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
    # Mixture of experts (Qwen3 MoE); num_experts 0 for a dense model.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    moe_layers: tuple[int, ...] = ()  # decoder layers with a sparse MoE block (the others a dense MLP)
    # gpt-oss: per-layer sliding window in logical positions (0: full attention), learned per-head
    # attention sinks, an o_proj bias, and its MoE ("gpt_oss": router bias, softmax over the
    # chosen experts, clamped SwiGLU alpha / limit, expert biases; "qwen3": Qwen3 MoE's).
    layer_windows: tuple[int, ...] = ()
    attention_sinks: bool = False
    o_proj_bias: bool = False
    moe_kind: str = "qwen3"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    def window(self, i: int) -> int:
        """Layer i's sliding window (a query at logical position p sees keys p - window + 1 .. p),
        0 for full attention."""
        return self.layer_windows[i] if self.layer_windows else 0
    hybrid: HybridConfig | None = None  # Qwen3.5 family (engine/hybrid_model.py); None otherwise

    def is_moe_layer(self, i: int) -> bool:
        return i in self.moe_layers

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        model_type = cfg.get("model_type", "")
        if model_type in MULTIMODAL_TEXT_TYPES and isinstance(cfg.get("text_config"), dict):
            cfg = {**cfg["text_config"], "model_type": MULTIMODAL_TEXT_TYPES[model_type]}
            model_type = cfg["model_type"]
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelNotFoundError(
                f"model type {model_type!r} is not supported yet; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        hybrid_model = model_type in ("qwen3_5_text", "qwen3_5_moe_text")
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
        if hybrid_model:  # partial RoPE and (text-only, so plain) mrope: HybridConfig.rotary_dim
            rope_scaling = None
        if rope_scaling is not None and rope_scaling.get("rope_type", rope_scaling.get("type")) not in (
            "default",
            "llama3",
            "yarn",
        ):
            raise ModelNotFoundError(f"rope scaling {rope_scaling!r} is not supported yet")
        num_layers = cfg["num_hidden_layers"]
        if model_type == "gpt_oss":
            return cls._from_gpt_oss(cfg, rope_scaling, float(rope_theta))
        moe = model_type in ("qwen3_moe", "qwen3_5_moe_text")
        # Missing fields take transformers' Qwen3MoeConfig defaults; transformers 5 writes
        # num_experts as num_local_experts.
        num_experts = int(cfg.get("num_experts", cfg.get("num_local_experts", 128))) if moe else 0
        # transformers' Qwen3MoeDecoderLayer rule: sparse unless listed in mlp_only_layers or off
        # the decoder_sparse_step grid.
        mlp_only = set(cfg.get("mlp_only_layers") or ())
        step = int(cfg.get("decoder_sparse_step", 1) or 1)
        moe_layers = tuple(
            i for i in range(num_layers) if num_experts > 0 and i not in mlp_only and (i + 1) % step == 0
        )
        return cls(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            # Qwen3.5-MoE has no dense MLP: its active MLP width (k experts) stands in for a random head's.
            intermediate_size=cfg["intermediate_size"] if not (hybrid_model and moe) else int(
                cfg.get("intermediate_size") or cfg.get("moe_intermediate_size", 512) * cfg.get("num_experts_per_tok", 8)
            ),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=cfg.get("head_dim") or hidden // num_heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) in ("llama3", "yarn") else None,
            max_position_embeddings=cfg.get("max_position_embeddings", 32768),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
            qk_norm=model_type in ("qwen3", "qwen3_moe") or hybrid_model,
            num_experts=num_experts,
            hybrid=HybridConfig.from_hf(cfg, cfg.get("head_dim") or hidden // num_heads) if hybrid_model else None,
            num_experts_per_tok=int(cfg.get("num_experts_per_tok", 8)) if num_experts else 0,
            moe_intermediate_size=int(cfg.get("moe_intermediate_size", 768)) if num_experts else 0,
            # Qwen3.5-MoE's router always renormalises its top-k probabilities.
            norm_topk_prob=(hybrid_model or bool(cfg.get("norm_topk_prob", False))) if num_experts else False,
            moe_layers=moe_layers,
        )

    @classmethod
    def _from_gpt_oss(cls, cfg: dict, rope_scaling: dict | None, rope_theta: float) -> "ModelConfig":
        """transformers' GptOssConfig (missing fields take its defaults): every layer MoE, sliding
        and full attention layers as `layer_types` lists them (default: alternating, sliding first)."""
        num_layers = cfg["num_hidden_layers"]
        window = int(cfg.get("sliding_window") or 128)
        types = cfg.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
        num_heads = cfg["num_attention_heads"]
        intermediate = int(cfg.get("intermediate_size", 2880))
        return cls(
            model_type="gpt_oss",
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=intermediate,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 131072),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", True)),
            qk_norm=False,
            num_experts=int(cfg.get("num_local_experts", 128)),
            num_experts_per_tok=int(cfg.get("num_experts_per_tok", 4)),
            moe_intermediate_size=intermediate,
            moe_layers=tuple(range(num_layers)),
            layer_windows=tuple(window if t == "sliding_attention" else 0 for t in types),
            attention_sinks=True,
            o_proj_bias=bool(cfg.get("attention_bias", True)),
            moe_kind="gpt_oss",
            swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)),
            swiglu_limit=float(cfg.get("swiglu_limit", 7.0)),
        )

"""Target model architecture, read from a Hugging Face config.json dict."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ModelNotFoundError

SUPPORTED_MODEL_TYPES = (
    "llama", "qwen2", "qwen3", "qwen3_moe", "gpt_oss", "qwen3_5_text", "qwen3_5_moe_text", "gemma4_text",
)
# Qwen3.5-family and Gemma 4 checkpoints: a multimodal config whose `text_config` is the text model.
MULTIMODAL_TEXT_TYPES = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text", "gemma4": "gemma4_text"}


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
class Gemma4Config:
    """Gemma 4's text decoder beyond ModelConfig's common fields, which hold its sliding-window
    layers' shapes (num_kv_heads, head_dim, rope_theta) and windows (`layer_windows`, 0 for a
    global layer). transformers' Gemma4TextConfig defaults fill what a config leaves out."""

    global_head_dim: int  # the global (full-attention) layers' head_dim (512 on the 26B-A4B)
    global_kv_heads: int
    k_eq_v: bool  # global layers have no v_proj: V is k_proj's output, v-normed and not rotated
    global_rope_theta: float
    global_rotary_factor: float  # "proportional" RoPE: the first factor * head_dim / 2 frequencies turn
    global_rope_factor: float  # its frequencies are divided by this
    final_logit_softcap: float  # logits become tanh(logits / c) * c; 0: none
    moe: bool  # every layer has a routed MoE beside its dense MLP (enable_moe_block; 128 experts, top 8)

    @classmethod
    def from_hf(cls, cfg: dict) -> "Gemma4Config":
        rope = cfg.get("rope_parameters") or {}
        sliding = rope.get("sliding_attention") or {"rope_type": "default"}
        full = rope.get("full_attention") or {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                              "rope_theta": 1_000_000.0}
        if sliding.get("rope_type", "default") != "default" or full.get("rope_type", "default") not in (
            "default", "proportional"
        ):
            raise ModelNotFoundError(f"Gemma 4 rope parameters {rope!r} are not supported yet")
        if int(cfg.get("hidden_size_per_layer_input", 256) or 0) or int(cfg.get("num_kv_shared_layers", 0) or 0):
            raise ModelNotFoundError(
                "Gemma 4 models with per-layer input embeddings or shared KV layers (the E2B / E4B sizes) "
                "are not supported yet"
            )
        if cfg.get("use_bidirectional_attention") == "all" or cfg.get("use_double_wide_mlp"):
            raise ModelNotFoundError(
                "this Gemma 4 variant (bidirectional attention or a double-wide MLP) is not supported yet"
            )
        k_eq_v = bool(cfg.get("attention_k_eq_v", False))
        proportional = full.get("rope_type", "default") == "proportional"
        return cls(
            global_head_dim=int(cfg.get("global_head_dim") or 512),
            # transformers' rule: the global KV head count applies only with attention_k_eq_v.
            global_kv_heads=int((cfg.get("num_global_key_value_heads") if k_eq_v else None)
                                or cfg.get("num_key_value_heads") or 4),
            k_eq_v=k_eq_v,
            global_rope_theta=float(full.get("rope_theta", 1_000_000.0)),
            global_rotary_factor=float(full.get("partial_rotary_factor", 1.0)) if proportional else 1.0,
            global_rope_factor=float(full.get("factor", 1.0)) if proportional else 1.0,
            final_logit_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
            moe=bool(cfg.get("enable_moe_block", False)),
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
    gemma4: Gemma4Config | None = None  # Gemma 4 (engine/gemma4.py); None otherwise

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
        if rope_scaling is None and cfg.get("rope_parameters") and model_type != "gemma4_text":
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
        if model_type == "gemma4_text":
            return cls._from_gemma4(cfg)
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

    @classmethod
    def _from_gemma4(cls, cfg: dict) -> "ModelConfig":
        """transformers' Gemma4TextConfig (missing fields take its defaults): sliding-window layers
        and every sixth a global one unless `layer_types` says otherwise (the last always global);
        the MoE, where enabled, in every layer beside the dense MLP."""
        num_layers = cfg["num_hidden_layers"]
        types = list(cfg.get("layer_types") or [
            "sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(num_layers)
        ])[:num_layers]
        types[-1] = "full_attention"
        window = int(cfg.get("sliding_window") or 512)
        gemma = Gemma4Config.from_hf(cfg)
        sliding = (cfg.get("rope_parameters") or {}).get("sliding_attention") or {}
        num_heads = cfg.get("num_attention_heads", 8)
        num_experts = int(cfg.get("num_experts") or 0) if gemma.moe else 0
        return cls(
            model_type="gemma4_text",
            vocab_size=cfg.get("vocab_size", 262_144),
            hidden_size=cfg["hidden_size"],
            intermediate_size=int(cfg.get("intermediate_size", 9216)),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or 4,
            head_dim=cfg.get("head_dim") or 256,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(sliding.get("rope_theta", 10_000.0)),
            rope_scaling=None,
            max_position_embeddings=cfg.get("max_position_embeddings", 131_072),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            qk_norm=True,
            num_experts=num_experts,
            num_experts_per_tok=int(cfg.get("top_k_experts") or 0) if num_experts else 0,
            moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0) if num_experts else 0,
            norm_topk_prob=bool(num_experts),
            moe_layers=tuple(range(num_layers)) if num_experts else (),
            layer_windows=tuple(window if t == "sliding_attention" else 0 for t in types),
            moe_kind="gemma4",
            gemma4=gemma,
        )

"""`TrainConfig`: every setting of `train-head`, validated before anything loads."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..engine.errors import ConfigError
from ..engine.params import DEFAULT_WIDTH

LogFn = Callable[[str], None]

STAGES = ("prompts", "data", "train", "eval", "replay", "all")
PROMPT_SOURCES = ("builtin", "sharegpt", "mixed")
EXPORT_DTYPES = ("bfloat16", "float32", "int8")


@dataclass
class TrainConfig:
    target: str
    out: Path
    stage: str = "all"
    device: str = "auto"
    dtype: str = "auto"  # the frozen target's dtype; the head trains in fp32 (+ bf16 autocast)
    seed: int = 0
    # head shape
    draft_layers: int = 1
    intermediate_size: int | None = None  # the draft layers' MLP width; default: the target's
    attention_heads: int | None = None  # the draft layers' query heads; default: the target's
    block_size: int = 16
    taps: tuple[int, ...] | None = None  # target layer ids; default: default_target_layer_ids
    mask_token_id: int | None = None  # default: the last vocabulary row (as for_target does)
    init: str = "random"  # "random" (std 0.02), "target" (copy its last layers), or a head DIR to continue
    # prompts and data
    prompts_file: str | None = None
    prompt_source: str = "builtin"  # "builtin" (offline generators), "sharegpt" (the train extra) or "mixed" (half each)
    num_prompts: int = 4000
    self_prompts: float = 0.15  # share of built-in training prompts the target proposes itself
    proposal_seed: int | None = None  # the proposals' asks and sampling; None: `seed` (which also picks the dev prompts)
    max_new_tokens: int = 256
    max_prompt_tokens: int = 1024
    temperature: float = 0.0
    gen_batch_size: int | None = None  # default: 256 on CUDA, 8 on CPU
    # optimization
    steps: int | None = None  # default: from --epochs
    epochs: float = 3.0
    lr: float = 6e-4
    warmup: float = 0.04  # fraction of the run
    weight_decay: float = 0.01
    batch_size: int = 8  # sequences per step
    skip_batches: int = 0  # the data order starts this many batches in (a continued head reads what it has not)
    anchors_per_seq: int = 64
    max_seq_len: int = 2048
    loss: str = "kl"  # "kl" (full-vocab forward KL) or "ce" (CE against the target's argmax)
    depth_decay: float = 8.0  # w_k = exp(-(k-1)/depth_decay); 0 = uniform
    grad_clip: float = 1.0
    loss_chunk: int = 1024  # rows per lm_head chunk of the loss
    save_every: int = 200
    log_every: int = 10
    resume: bool = False
    # evaluation
    eval_budgets: tuple[int, ...] = (16, 32, 64, 128, 256)
    eval_prompts: int = 8  # held-out dev prompts
    eval_max_new_tokens: int = 128
    eval_every: int = 500  # steps; 0: only before and after training
    eval_width: int = DEFAULT_WIDTH
    eval_sets: tuple[str, ...] = ("coding", "chat")  # built-in sets, evaluated at the largest budget
    # time and export
    time_budget_min: float | None = None
    export_dtype: str = "bfloat16"  # or float32, or int8 (per-channel int8 weights, bf16 norms)
    progress: bool = True

    @property
    def proposals_seed(self) -> int:
        """The seed of the target's proposals: --proposal-seed, else --seed."""
        return self.seed if self.proposal_seed is None else self.proposal_seed

    def validate(self) -> None:
        if self.stage not in STAGES:
            raise ConfigError(f"--stage must be one of {', '.join(STAGES)}, got {self.stage!r}")
        if self.block_size < 2:
            raise ConfigError("--block-size must be at least 2 (the anchor plus one drafted token)")
        if self.draft_layers < 1:
            raise ConfigError("--draft-layers must be at least 1")
        if self.intermediate_size is not None and self.intermediate_size < 1:
            raise ConfigError("--intermediate-size must be at least 1")
        if self.attention_heads is not None and self.attention_heads < 1:
            raise ConfigError("--attention-heads must be at least 1")
        if self.loss not in ("kl", "ce"):
            raise ConfigError(f"--loss must be kl or ce, got {self.loss!r}")
        if self.prompt_source not in PROMPT_SOURCES:
            raise ConfigError(f"--prompt-source must be one of {', '.join(PROMPT_SOURCES)}, got {self.prompt_source!r}")
        if self.prompts_file and self.prompt_source != "builtin":
            raise ConfigError(f"--prompts FILE and --prompt-source {self.prompt_source} exclude each other; pass one")
        if self.init not in ("random", "target") and not (Path(self.init) / "config.json").is_file():
            raise ConfigError(f"--init must be random, target or a head directory (with config.json), got {self.init!r}")
        if not 0 <= self.self_prompts <= 0.9:
            raise ConfigError("--self-prompts must be a fraction in [0, 0.9]")
        if not 0 <= self.temperature <= 2:
            raise ConfigError("--temperature must be in [0, 2]")
        for name in ("num_prompts", "max_new_tokens", "batch_size", "anchors_per_seq", "max_seq_len", "loss_chunk"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
        if self.skip_batches < 0:
            raise ConfigError("--skip-batches must be >= 0")
        if self.steps is not None and self.steps < 0:
            raise ConfigError("--steps must be >= 0")
        if not self.eval_budgets or min(self.eval_budgets) < 1:
            raise ConfigError("--eval-budgets must be positive integers")
        if self.export_dtype not in EXPORT_DTYPES:
            raise ConfigError(f"--export-dtype must be one of {', '.join(EXPORT_DTYPES)}, got {self.export_dtype!r}")
        if self.time_budget_min is not None and self.time_budget_min <= 0:
            raise ConfigError("--time-budget-min must be positive")


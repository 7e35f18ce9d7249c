"""The workspace: the target loaded once, as our engine (evaluation with the real decoder) and
as a transformers model of the same weights (batched generation and features), plus its tokenizer."""
from __future__ import annotations

import torch

from ..engine.draft_head import DraftHeadConfig
from ..engine.errors import ConfigError
from .config import LogFn, TrainConfig
from .export import head_config_for
from .prompts import Prompt, as_messages


class Workspace:
    """Loads the target once: our engine (for evaluation with the real decoder) and a
    transformers model of the same weights (batched generation and features)."""

    def __init__(self, cfg: TrainConfig, log: LogFn):
        from ..engine.models.loader import load_engine, resolve_device, resolve_dtype
        from ..engine.models.oracle import transformers_model

        self.device = resolve_device(cfg.device)
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        if self.dtype == torch.float16:
            raise ConfigError("training needs --dtype bfloat16 or float32 (fp16 would need loss scaling)")
        log(f"loading {cfg.target} on {self.device} ({str(self.dtype).removeprefix('torch.')})")
        dtype_name = str(self.dtype).removeprefix("torch.")
        self.engine = load_engine(cfg.target, "none", device=str(self.device), dtype=dtype_name, max_context=4096)
        self.tokenizer = self.engine.tokenizer
        self.hf = transformers_model(self.engine).requires_grad_(False)
        self.amp_dtype = None if self.dtype == torch.float32 else self.dtype
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = min(self.engine.stop_token_ids) if self.engine.stop_token_ids else 0

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The prompt (one user message or a multi-turn context) exactly as the chat renders it,
        ready for the assistant's turn (same template path, thinking off)."""
        from ..engine.session import ChatSession

        session = ChatSession(self.engine, thinking=False)
        session.messages.extend(as_messages(prompt))
        return session.prompt_ids()

    def head_config(self, cfg: TrainConfig) -> DraftHeadConfig:
        return head_config_for(self.engine.target.cfg, cfg, self.hf.get_input_embeddings().weight, self.pad_id)


"""Stage 4: τ of the real tree decoder (draft -> tree -> verify -> accept) on held-out prompts."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from ..engine.draft_head import DraftHead, DraftHeadConfig, build_head
from ..engine.eval_sets import eval_prompts
from .config import LogFn, TrainConfig
from .outputs import append_log, progress_bar
from .workspace import Workspace


@dataclass(frozen=True)
class TauResult:
    budget: int
    tau: float  # tokens per round over all prompts (bonus included)
    rounds: int
    tokens: int
    prompts: int
    tokens_per_second: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Evaluator:
    """τ of the real engine (draft -> tree -> verify -> accept) with a copy of the head being
    trained, in the engine's dtype, on prompts the head never trained on."""

    def __init__(self, ws: Workspace, cfg: TrainConfig, head_cfg: DraftHeadConfig, dev_prompts: list[str], log: LogFn):
        from ..engine.engine import SpecEngine

        self.ws, self.cfg, self.log = ws, cfg, log
        self.dev = dev_prompts[: cfg.eval_prompts]
        base = ws.engine
        self.head = build_head(head_cfg, ws.device, ws.dtype)
        self.engine = SpecEngine(
            base.target, base.tokenizer, self.head, model_name=base.model_name, head_name="training",
            max_context=base.max_context, stop_token_ids=tuple(base.stop_token_ids), source=base.source,
        )

    def _load(self, head: DraftHead) -> None:
        with torch.no_grad():
            self.head.load_state_dict(head.state_dict())
        self.engine.reset()  # the draft KV cache holds context projected by the old weights

    def tau(self, prompts: list[str], budget: int, deadline: float | None = None) -> TauResult:
        from ..engine.events import FinishEvent
        from ..engine.params import GenerationParams, SpecParams
        from ..engine.session import ChatSession

        params = GenerationParams(max_new_tokens=self.cfg.eval_max_new_tokens,
                                  spec=SpecParams(budget=budget, width=self.cfg.eval_width))
        rounds = tokens = done = 0
        seconds = 0.0
        for p in prompts:
            if deadline is not None and time.time() > deadline and done > 0:
                break
            session = ChatSession(self.engine, thinking=False)
            need = len(self.ws.prompt_ids(p)) + self.cfg.eval_max_new_tokens + budget + 8
            if need > self.engine.max_context:
                self.engine.set_max_context(need)
            for event in session.send(p, params):
                if isinstance(event, FinishEvent):
                    rounds += event.result.rounds
                    tokens += sum(event.result.accept_lengths)
                    seconds += event.result.decode_seconds
            done += 1
        return TauResult(budget, tokens / rounds if rounds else 0.0, rounds, tokens, done,
                         tokens / seconds if seconds > 0 else 0.0)

    def periodic(self, head: DraftHead, step: int) -> dict:
        """During training: dev prompts at the largest budget. A failing evaluation is logged and
        skipped (tau None): it must not cost the training run."""
        budget = max(self.cfg.eval_budgets)
        try:
            self._load(head)
            r = self.tau(self.dev, budget)
        except Exception as e:  # noqa: BLE001 - reported, training goes on
            self.log(f"evaluation at step {step} failed: {type(e).__name__}: {e}")
            return {"step": step, "budget": budget, "tau": None, "error": f"{type(e).__name__}: {e}"}
        append_log(self.cfg.out, {"step": step, "eval": r.to_dict()})
        return {"step": step, "budget": budget, "tau": r.tau}

    def final(self, head: DraftHead, deadline: float | None) -> dict:
        """The dev prompts and each built-in eval set, at every budget: {"dev": [τ per budget],
        "sets": {name: [τ per budget]}} (does τ rise with the budget on every set?)."""
        self._load(head)
        report: dict = {"dev": [], "sets": {name: [] for name in self.cfg.eval_sets}}
        runs = [("dev", self.dev)] + [(name, eval_prompts(name)) for name in self.cfg.eval_sets]
        bar = progress_bar(self.cfg.progress, total=len(runs) * len(self.cfg.eval_budgets), desc="eval", unit="run")
        try:
            for name, prompts in runs:
                for budget in self.cfg.eval_budgets:
                    r = self.tau(prompts, budget, deadline)
                    (report["dev"] if name == "dev" else report["sets"][name]).append(r.to_dict())
                    bar.set_postfix(set=name, budget=budget, tau=f"{r.tau:.2f}")
                    bar.update(1)
        finally:
            bar.close()
        return report


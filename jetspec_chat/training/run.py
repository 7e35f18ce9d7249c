"""`train-head`: run the stages a TrainConfig asks for, under one output directory DIR (each resumable).

  prompts  DIR/prompts.jsonl         train/dev prompts (built-in generators, ShareGPT contexts, or
                                     --prompts FILE); also a stage of its own   data.py, sharegpt.py
           DIR/proposals.jsonl       the --self-prompts share of the built-in ones, proposed by the
                                     target itself (made where the target is loaded)
  data     DIR/data/shard-*.pt       the target's own answers through the chat template (our batched
                                     decoder, batch_decode.py: left padding, CUDA-graphed steps, greedy
                                     or low temperature, Qwen3 thinking off): ids + prompt length  data.py
  train    DIR/ckpt.pt               head (fp32 master) + AdamW state + step; periodic τ evaluation
                                     (forward.py, loss.py, target.py, loop.py)
  export   DIR/head/                 the published format (config.json + model.safetensors)    export.py
  eval     DIR/eval.json             τ of the REAL tree decoder on held-out dev prompts and the
                                     built-in eval sets, per budget                           evaluate.py
  replay   DIR/replay.json           where DIR/head loses τ (replay.py)

Precision: the target is frozen in --dtype (bf16 on CUDA); the head keeps fp32 master weights and
runs under bf16 autocast when the target is bf16. Features come from the frozen transformers
model of the same weights, on the fly per batch.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..engine.draft_head import DraftHead
from ..engine.errors import ConfigError
from ..engine.eval_sets import eval_prompts
from .config import LogFn, TrainConfig
from .data import gen_batch_size, generate_data, load_sequences, prepare_prompts, prompt_sha, read_proposals
from .evaluate import Evaluator
from .export import export_head
from .loop import Trainer, train
from .outputs import atomic_write
from .replay import replay_report
from .workspace import Workspace


@dataclass
class Deadlines:
    """Where a --time-budget-min run stops each stage: data by 40% of the budget (when training
    follows), training by 88%, evaluation by 100% (each finishes its current unit of work)."""

    data: float | None
    train: float | None
    eval: float | None

    @classmethod
    def from_config(cls, cfg: TrainConfig, start: float) -> "Deadlines":
        if cfg.time_budget_min is None:
            return cls(None, None, None)
        total = cfg.time_budget_min * 60
        end = start + total
        data = start + 0.4 * total if cfg.stage == "all" else end
        train = start + 0.88 * total if cfg.stage == "all" else end
        return cls(data, train, end)


def run_training(cfg: TrainConfig, log: LogFn | None = None) -> dict:
    """Run the stages `cfg.stage` asks for; returns (and writes to DIR/summary.json) a summary."""
    log = log or (lambda msg: print(f"[train-head] {msg}", file=sys.stderr, flush=True))
    cfg.validate()
    cfg.out = Path(cfg.out)
    cfg.out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    deadlines = Deadlines.from_config(cfg, start)
    torch.manual_seed(cfg.seed)
    ckpt = cfg.out / "ckpt.pt"
    if cfg.stage in ("train", "all") and ckpt.is_file() and not cfg.resume:
        raise ConfigError(f"{ckpt} exists; pass --resume to continue that run, or use another --out")
    # --stage prompts needs the target only when it proposes prompts itself.
    proposing = cfg.prompt_source == "builtin" and not cfg.prompts_file and cfg.self_prompts > 0
    ws = Workspace(cfg, log) if cfg.stage != "prompts" or proposing else None
    summary: dict = {"target": cfg.target, "out": str(cfg.out)}
    if ws is not None:
        head_cfg = ws.head_config(cfg)
        summary["head"] = head_cfg.to_json()
    atomic_write(cfg.out / "run_config.json",
                  json.dumps({k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(cfg).items()},
                             indent=2) + "\n")
    train_prompts, dev_prompts = prepare_prompts(cfg, log, ws)
    summary["prompts"] = {"train": len(train_prompts), "dev": len(dev_prompts)}

    if cfg.stage in ("data", "all"):
        first = frozenset(read_proposals(cfg.out) or ())  # the run's new contexts: answered first
        summary["data"] = generate_data(ws, cfg, train_prompts, deadlines.data, log, first)
        log(f"data: {summary['data']['total_sequences']} sequences in {cfg.out / 'data'}")

    if cfg.stage == "replay":
        summary["replay"] = replay_stage(ws, cfg, dev_prompts, log)

    evaluate = cfg.eval_prompts > 0  # 0: no τ at all (e.g. to time training alone)
    needs_evaluator = cfg.stage in ("train", "eval", "all") and evaluate
    evaluator = Evaluator(ws, cfg, head_cfg, dev_prompts, log) if needs_evaluator else None
    head_dir = cfg.out / "head"
    if cfg.stage in ("train", "all"):
        seqs = load_sequences(cfg.out, cfg.max_seq_len, frozenset(map(prompt_sha, dev_prompts)))
        if not seqs:
            raise ConfigError(f"no training data in {cfg.out / 'data'}; run --stage data first")
        trainer = Trainer(ws, cfg, head_cfg, log)
        if cfg.resume and ckpt.is_file():
            trainer.load()
            log(f"resuming from step {trainer.state.step}")
        log(f"training on {len(seqs)} sequences ({sum(len(s.ids) for s in seqs)} tokens)")
        state = train(ws, cfg, trainer, seqs, evaluator, deadlines.train, log)
        if cfg.stage == "train" and evaluator is not None:  # no final evaluation follows: record the end
            state.history.append(evaluator.periodic(trainer.head, step=state.step))
        info = {"target": cfg.target, "steps": state.step, "sequences": len(seqs), "history": state.history}
        int8 = cfg.export_dtype == "int8"  # int8 weights, bf16 norms
        export_head(trainer.head, head_dir, torch.bfloat16 if int8 else _dtype(cfg.export_dtype), info, int8=int8)
        log(f"exported the head to {head_dir}")
        summary["train"] = {"steps": state.step, "seconds": round(state.seconds, 1), "history": state.history}
        final_head = trainer.head
    else:
        final_head = None

    if cfg.stage in ("eval", "all") and evaluate:
        if final_head is None:
            final_head = load_trained_head(ws, head_dir)
            evaluator = Evaluator(ws, cfg, final_head.cfg, dev_prompts, log)
        summary["eval"] = evaluator.final(final_head, deadlines.eval)
        atomic_write(cfg.out / "eval.json", json.dumps(summary["eval"], indent=2) + "\n")
        history = summary.get("train", {}).get("history", [])
        if history and history[0]["step"] == 0:
            summary["tau_before"] = history[0]["tau"]
        summary["tau_after"] = {r["budget"]: round(r["tau"], 4) for r in summary["eval"]["dev"]}
    summary["seconds"] = round(time.time() - start, 1)
    atomic_write(cfg.out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def load_trained_head(ws: Workspace, head_dir: Path) -> DraftHead:
    """OUT/head, checked against the target (for the stages that only evaluate it)."""
    from ..engine.draft_head import load_head_dir

    if not (head_dir / "config.json").is_file():
        raise ConfigError(f"no trained head in {head_dir}; run the train stage first")
    head = load_head_dir(head_dir, ws.device, torch.float32)
    head.cfg.check_against(ws.engine.target.cfg, str(head_dir))
    return head


def replay_stage(ws: Workspace, cfg: TrainConfig, dev_prompts: list[str], log: LogFn) -> dict:
    """--stage replay: where OUT/head loses τ, on the dev prompts and the eval sets (replay.py)."""
    head = load_trained_head(ws, cfg.out / "head")
    sets = {"dev": dev_prompts[: max(cfg.eval_prompts, 1)], **{name: eval_prompts(name) for name in cfg.eval_sets}}
    report = replay_report(ws, head, sets, cfg.eval_budgets, cfg.eval_width, cfg.eval_max_new_tokens,
                           gen_batch_size(ws, cfg, max(len(p) for p in sets.values())), log)
    atomic_write(cfg.out / "replay.json", json.dumps(report, indent=2) + "\n")
    return report


def _dtype(name: str) -> torch.dtype:
    from ..engine.models.loader import DTYPES

    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {name!r}")
    return DTYPES[name]

"""Stage 3: the training loop. AdamW on the head's fp32 master weights (bf16 autocast when the
target is bf16), the target frozen; a stateless length-bucketed sampler (a resumed run sees the
batches an uninterrupted one would), a warmup + cosine schedule, checkpoints."""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..engine.draft_head import DraftHead, DraftHeadConfig
from ..engine.errors import ConfigError
from .config import LogFn, TrainConfig
from .evaluate import Evaluator
from .export import init_head
from .forward import block_attention_mask, block_ids, context_len, head_forward
from .loss import LossOut, Sequence, TrainBatch, chain_tau, distill_loss, make_batch
from .outputs import append_log, progress_bar
from .target import target_features
from .workspace import Workspace

CKPT_FORMAT = 2  # 2: fused qkv_proj / gate_up_proj in the head's state dict


def training_step_loss(
    head: DraftHead, hf_model, batch: TrainBatch, cfg: TrainConfig, amp_dtype: torch.dtype | None
) -> LossOut:
    """Features (no grad) -> head forward over all blocks -> distillation loss."""
    dev = batch.input_ids.device
    taps, final = target_features(hf_model, batch.input_ids, head.cfg.target_layer_ids)
    q_len = batch.anchors.shape[1] * head.cfg.block_size
    c_len = context_len(batch.anchors, batch.anchor_valid, q_len)
    if c_len > taps.shape[1]:
        taps = F.pad(taps, (0, 0, 0, c_len - taps.shape[1]))
    ids = block_ids(batch.input_ids, batch.anchors, head.cfg.block_size, head.cfg.mask_token_id)
    embeds = hf_model.get_input_embeddings()(ids).float()  # fp32 residual stream for the master weights
    visible = block_attention_mask(batch.anchors, c_len, head.cfg.block_size, head.cfg.causal)
    lm_head = hf_model.get_output_embeddings().weight
    with torch.autocast(dev.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
        hidden = head_forward(head, taps[:, :c_len], batch.anchors, embeds, visible)
        return distill_loss(hidden, final, batch, lm_head, cfg.loss, cfg.depth_decay, cfg.loss_chunk)



def lr_at(frac: float, lr: float, warmup: float) -> float:
    """Linear warmup, then cosine decay to zero, as a function of run progress in [0, 1]."""
    if frac < warmup:
        return lr * max(frac, 1e-3) / warmup
    return lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (frac - warmup) / max(1e-9, 1 - warmup))))


class Sampler:
    """Stateless epoch shuffling: the batch of step s depends only on (seed, s), so a resumed
    run sees exactly the batches an uninterrupted one would.

    With `lengths`, batches are length-bucketed: each run of BUCKET_BATCHES batches of the
    shuffled order is sorted by length, cut into batches, and those batches shuffled. The target's
    forward runs on right-padded batches, so mixing a 900-token sequence with 150-token ones
    would make most of that forward padding; every sequence still comes once per epoch."""

    BUCKET_BATCHES = 8

    def __init__(self, n: int, batch_size: int, seed: int, lengths: list[int] | None = None):
        self.n, self.bs, self.seed, self.lengths = n, batch_size, seed, lengths
        self._epoch, self._order = -1, None

    def epoch_order(self, epoch: int) -> list[int]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(self.n, generator=gen).tolist()
        if self.lengths is None:
            return order
        out: list[int] = []
        span = self.bs * self.BUCKET_BATCHES
        for c in range(0, self.n, span):
            chunk = sorted(order[c : c + span], key=lambda i: self.lengths[i])
            batches = [chunk[b : b + self.bs] for b in range(0, len(chunk), self.bs)]
            for j in torch.randperm(len(batches), generator=gen).tolist():
                out += batches[j]
        return out

    def indices(self, step: int) -> list[int]:
        out = []
        for g in range(step * self.bs, (step + 1) * self.bs):
            epoch = g // self.n
            if epoch != self._epoch:
                self._epoch, self._order = epoch, self.epoch_order(epoch)
            out.append(self._order[g % self.n])
        return out


@dataclass
class TrainState:
    step: int = 0
    seconds: float = 0.0  # training wall time so far (evaluations included)
    total_steps: int = 0
    history: list[dict] = field(default_factory=list)  # τ evaluations during training


class Trainer:
    def __init__(self, ws: Workspace, cfg: TrainConfig, head_cfg: DraftHeadConfig, log: LogFn):
        self.ws, self.cfg, self.log = ws, cfg, log
        cfg.out.mkdir(parents=True, exist_ok=True)
        self.head = DraftHead(head_cfg).to(ws.device)  # fp32 master weights
        init_head(self.head, cfg.init, cfg.seed + 1, ws.hf)
        decay = [p for p in self.head.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.head.parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
        )
        self.state = TrainState()

    @property
    def ckpt_path(self) -> Path:
        return self.cfg.out / "ckpt.pt"

    def save(self) -> None:
        blob = {
            "format": CKPT_FORMAT, "head_config": self.head.cfg.to_json(), "head": self.head.state_dict(),
            "optimizer": self.opt.state_dict(), "step": self.state.step, "seconds": self.state.seconds,
            "total_steps": self.state.total_steps, "history": json.dumps(self.state.history),
        }
        tmp = self.ckpt_path.with_name("ckpt.pt.tmp")
        torch.save(blob, tmp)
        tmp.replace(self.ckpt_path)

    def load(self) -> None:
        blob = torch.load(self.ckpt_path, map_location=self.ws.device, weights_only=True)
        if blob.get("format") != CKPT_FORMAT:
            raise ConfigError(f"{self.ckpt_path} is from an older version of the trainer (format {blob.get('format')}); "
                              "start over with another --out")
        if blob["head_config"] != self.head.cfg.to_json():
            raise ConfigError(f"{self.ckpt_path} was trained with another head shape; use the same --draft-layers, "
                              "--block-size and --taps, or another --out")
        self.head.load_state_dict(blob["head"])
        self.opt.load_state_dict(blob["optimizer"])
        self.state = TrainState(blob["step"], blob["seconds"], blob["total_steps"], json.loads(blob["history"]))

    def step(self, batch: TrainBatch, lr: float) -> dict:
        self.head.train()
        for group in self.opt.param_groups:
            group["lr"] = lr
        out = training_step_loss(self.head, self.ws.hf, batch.to(self.ws.device), self.cfg, self.ws.amp_dtype)
        out.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.head.parameters(), self.cfg.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            depth_acc = (out.correct.sum((0, 1)) / out.valid.sum((0, 1)).clamp(min=1)).tolist()
        return {"loss": float(out.loss.detach()), "grad_norm": float(grad_norm), "acc1": depth_acc[0],
                "acc": sum(depth_acc) / len(depth_acc), "tau_chain": chain_tau(out.correct, out.valid)}


def train(ws: Workspace, cfg: TrainConfig, trainer: Trainer, seqs: list[Sequence], evaluator: "Evaluator | None",
          deadline: float | None, log: LogFn) -> TrainState:
    """The loop: sample batch -> step; periodic τ; checkpoints; stops at --steps or the deadline."""
    st = trainer.state
    if cfg.steps is not None:  # an explicit --steps wins, also over a resumed run's plan
        st.total_steps = cfg.steps
    elif st.total_steps == 0:
        st.total_steps = math.ceil(cfg.epochs * len(seqs) / cfg.batch_size)
    sampler = Sampler(len(seqs), cfg.batch_size, cfg.seed, [len(q.ids) for q in seqs])
    # With a deadline, progress is max(step fraction, time fraction): the cosine schedule
    # still completes when time, not steps, ends the run.
    time_total = (deadline - time.time() + st.seconds) if deadline is not None else None
    if evaluator is not None and st.step == 0 and not st.history:
        st.history.append(evaluator.periodic(trainer.head, step=0))
        if st.history[-1]["tau"] is not None:
            log(f"step 0: tau {st.history[-1]['tau']:.3f} (budget {st.history[-1]['budget']}, before training)")
    bar = progress_bar(cfg.progress, total=st.total_steps, desc="train", unit="step", initial=st.step)
    t_last, tokens, ema = time.perf_counter(), 0, None
    try:
        while st.step < st.total_steps:
            frac = st.step / max(1, st.total_steps)
            if time_total is not None:
                if time.time() >= deadline:
                    log(f"train: time budget reached at step {st.step}")
                    break
                frac = max(frac, st.seconds / time_total)
            t0 = time.perf_counter()
            at = st.step + cfg.skip_batches  # this step's place in the data order
            gen = torch.Generator().manual_seed(cfg.seed * 7919 + at)
            batch = make_batch([seqs[i] for i in sampler.indices(at)], cfg.anchors_per_seq, gen, ws.pad_id)
            stats = trainer.step(batch, lr_at(frac, cfg.lr, cfg.warmup))
            st.step += 1
            tokens += batch.tokens
            ema = stats["loss"] if ema is None else 0.9 * ema + 0.1 * stats["loss"]
            if evaluator is not None and cfg.eval_every and st.step % cfg.eval_every == 0 and st.step < st.total_steps:
                st.history.append(evaluator.periodic(trainer.head, step=st.step))
            st.seconds += time.perf_counter() - t0
            if st.step % cfg.log_every == 0 or st.step == st.total_steps:
                now = time.perf_counter()
                rate = tokens / max(1e-9, now - t_last)
                t_last, tokens = now, 0
                append_log(cfg.out, {"step": st.step, "lr": lr_at(frac, cfg.lr, cfg.warmup), "tok_s": round(rate, 1),
                                      **{k: round(v, 5) for k, v in stats.items()}})
                post = {"loss": f"{ema:.3f}", "acc1": f"{stats['acc1']:.2f}", "tok/s": f"{rate:.0f}"}
                if st.history and st.history[-1]["tau"] is not None:
                    post["tau"] = f"{st.history[-1]['tau']:.2f}"
                bar.set_postfix(post)
            bar.update(1)
            if cfg.save_every and st.step % cfg.save_every == 0:
                trainer.save()
    except KeyboardInterrupt:
        log(f"train: interrupted at step {st.step}; saving and exporting")
    finally:
        bar.close()
    trainer.save()
    return st


"""Train a JetSpec draft head for a target by self-distillation (docs/DESIGN.md §5).

Stages, all under one output directory DIR (each resumable):
  prompts  DIR/prompts.jsonl         train/dev prompts (built-in generators, a --self-prompts share of
                                     them proposed by the target itself, or --prompts FILE)
  data     DIR/data/shard-*.pt       the target's own answers through the chat template (our batched
                                     decoder, batch_decode.py: left padding, CUDA-graphed steps, greedy
                                     or low temperature, Qwen3 thinking off): ids + prompt length
  train    DIR/ckpt.pt               head (fp32 master) + AdamW state + step; periodic τ evaluation
  export   DIR/head/                 the published format (config.json + model.safetensors)
  eval     DIR/eval.json             τ of the REAL tree decoder on held-out dev prompts and the
                                     built-in eval sets, per budget

Training math. Per sequence we sample anchors a in [prompt_len - 1, len - 2]: the anchor token is
the last prompt token or an answer token and at least one future token exists. A block is
`[token at a, MASK x D]` at positions a..a+D; its context is the target's tap features of
positions 0..a-1 (strictly before the anchor: the anchor's own features encode its successor).
All blocks of a sequence run in one attention call: keys = [context rows ; all block rows], and
one boolean mask lets each block row see context rows < its anchor plus its own block
(lower-triangular for a causal head), never another block. Block position k (1..D) predicts the
token at a+k; its teacher is the target's next-token distribution at position a+k-1, i.e. the
final hidden state there times lm_head. Positions past the sequence end carry no loss, nor does
the anchor slot.

Loss: forward KL(target || head) over the FULL vocabulary (`--loss kl`, default) or CE against the
target's argmax (`--loss ce`). The target's logits are formed once per teacher position (a
position teaches every block covering it) and kept in the target's dtype; the head's are formed in
row chunks (`LinearDistill`): per chunk, one kernel (kernels/distill.py) turns them into the
loss's gradient in place, which is multiplied into the lm_head at once and the chunk dropped. So
the head side is O(chunk x vocab), never O(rows x vocab), nothing is recomputed in backward, and no
top-k approximation is needed. Depth weights w_k = exp(-(k-1)/depth_decay) (0 = uniform).

The forward reuses the head's own modules (fc, hidden_norm, project_q/project_kv, rotary, norms,
MLP) in the same order as `DraftHead.context_kv` + `DraftHead.block_hidden`, so the trained
function is the inference function; tests check the logits agree to fp32 precision.

Precision: the target is frozen in --dtype (bf16 on CUDA); the head keeps fp32 master weights and
runs under bf16 autocast when the target is bf16. Features come from the frozen transformers
model of the same weights, on the fly per batch (caching taps to disk would be far too big).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F

from ...kernels import distill_rows
from .batch_decode import BatchDecoder
from ..draft_head import DraftHead, DraftHeadConfig, build_head, default_target_layer_ids
from ..errors import ConfigError
from ..layers import Rotary, hf_parameters

LogFn = Callable[[str], None]

STAGES = ("data", "train", "eval", "replay", "all")
DATA_FORMAT = 1
CKPT_FORMAT = 2  # 2: fused qkv_proj / gate_up_proj in the head's state dict


# ---------------------------------------------------------------------------------------------
# Configuration


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
    num_prompts: int = 4000
    self_prompts: float = 0.15  # share of built-in training prompts the target proposes itself
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
    eval_width: int = 8
    eval_sets: tuple[str, ...] = ("coding", "chat")  # built-in sets, evaluated at the largest budget
    # time and export
    time_budget_min: float | None = None
    export_dtype: str = "bfloat16"
    progress: bool = True

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
        if self.init not in ("random", "target") and not (Path(self.init) / "config.json").is_file():
            raise ConfigError(f"--init must be random, target or a head directory (with config.json), got {self.init!r}")
        if not 0 <= self.self_prompts <= 0.9:
            raise ConfigError("--self-prompts must be a fraction in [0, 0.9]")
        if not 0 <= self.temperature <= 2:
            raise ConfigError("--temperature must be in [0, 2]")
        for name in ("num_prompts", "max_new_tokens", "batch_size", "anchors_per_seq", "max_seq_len", "loss_chunk"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
        if self.steps is not None and self.steps < 0:
            raise ConfigError("--steps must be >= 0")
        if not self.eval_budgets or min(self.eval_budgets) < 1:
            raise ConfigError("--eval-budgets must be positive integers")
        if self.time_budget_min is not None and self.time_budget_min <= 0:
            raise ConfigError("--time-budget-min must be positive")


# ---------------------------------------------------------------------------------------------
# The training forward: many blocks of one sequence in one attention call


def block_attention_mask(anchors: torch.Tensor, ctx_len: int, block: int, causal: bool) -> torch.Tensor:
    """[B, M*block, ctx_len + M*block] bool: which keys each block row sees.

    Row (j, i) = position i of the block anchored at anchors[:, j]. It sees context rows c < anchor
    (strictly before the anchor) and rows of its own block only (i' <= i if causal). Padded anchors
    (value 0) see no context but still their own block, so no row is fully masked."""
    b, m = anchors.shape
    dev = anchors.device
    ctx = torch.arange(ctx_len, device=dev)[None, None, :] < anchors[:, :, None]  # [B, M, C]
    ctx = ctx[:, :, None, :].expand(b, m, block, ctx_len).reshape(b, m * block, ctx_len)
    rows = torch.arange(m * block, device=dev)
    own = rows[:, None] // block == rows[None, :] // block
    if causal:
        own &= rows[None, :] <= rows[:, None]
    return torch.cat([ctx, own[None].expand(b, -1, -1)], dim=-1)


def head_forward(
    head: DraftHead, taps: torch.Tensor, anchors: torch.Tensor, block_embeds: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """Normed draft hidden states for all blocks: [B, M*block, hidden].

    taps [B, C, n_taps*hidden]: target features of positions 0..C-1 (row = position);
    anchors [B, M]; block_embeds [B, M*block, hidden] (the target's embeddings of
    [anchor, MASK...]); visible from `block_attention_mask`. Same arithmetic as
    DraftHead.context_kv + DraftHead.block_hidden, batched over blocks."""
    cfg = head.cfg
    bsz, c_len, _ = taps.shape
    q_len = block_embeds.shape[1]
    nkv, hd = cfg.num_kv_heads, cfg.head_dim
    rep = cfg.num_heads // nkv
    ctx = head.hidden_norm(head.fc(taps)).reshape(bsz * c_len, -1)  # no per-layer norm on context
    ctx_cos, ctx_sin = head.rotary.cos_sin(torch.arange(c_len, device=taps.device), ctx.dtype)
    positions = (anchors[:, :, None] + torch.arange(cfg.block_size, device=anchors.device)).reshape(-1)
    h = block_embeds.reshape(bsz * q_len, -1)
    cos, sin = head.rotary.cos_sin(positions, h.dtype)
    mask = visible[:, None]
    for layer in head.layers:
        attn = layer.self_attn
        ck, cv = attn.project_kv(ctx)
        ck = Rotary.apply(ck.view(bsz, c_len, nkv, hd), ctx_cos, ctx_sin)
        x = layer.input_layernorm(h)
        q = Rotary.apply(attn.project_q(x), cos, sin).view(bsz, q_len, cfg.num_heads, hd)
        k, v = attn.project_kv(x)
        k = Rotary.apply(k, cos, sin).view(bsz, q_len, nkv, hd)
        keys = torch.cat([ck.to(k.dtype), k], dim=1).transpose(1, 2)
        values = torch.cat([cv.view(bsz, c_len, nkv, hd).to(v.dtype), v.view(bsz, q_len, nkv, hd)], 1).transpose(1, 2)
        if rep > 1:  # GQA: kv head g serves query heads g*rep..g*rep+rep-1 (as enable_gqa does)
            keys, values = keys.repeat_interleave(rep, dim=1), values.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, scale=hd**-0.5
        ).transpose(1, 2)
        h = h + attn.o_proj(o.reshape(bsz * q_len, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return head.norm(h).view(bsz, q_len, -1)


def block_ids(input_ids: torch.Tensor, anchors: torch.Tensor, block: int, mask_token_id: int) -> torch.Tensor:
    """[B, M*block] token ids: per anchor [token at anchor, MASK x (block-1)]."""
    b, m = anchors.shape
    ids = torch.full((b, m, block), mask_token_id, dtype=torch.long, device=input_ids.device)
    ids[:, :, 0] = input_ids.gather(1, anchors)
    return ids.view(b, m * block)


def context_len(anchors: torch.Tensor, anchor_valid: torch.Tensor, q_len: int) -> int:
    """Context rows the batch needs (max anchor), rounded so keys = C + Q is a multiple of 8
    (aligned masks keep SDPA on its fused kernels)."""
    need = int((anchors * anchor_valid).max()) if anchor_valid.any() else 0
    total = -(-max(need + q_len, 8) // 8) * 8
    return total - q_len


# ---------------------------------------------------------------------------------------------
# Batches and loss


@dataclass
class Sequence:
    ids: torch.Tensor  # [L] int, prompt + answer (the stop token included when the answer ended)
    prompt_len: int


@dataclass
class TrainBatch:
    input_ids: torch.Tensor  # [B, T] right padded
    lengths: torch.Tensor  # [B]
    anchors: torch.Tensor  # [B, M] (0 where padded)
    anchor_valid: torch.Tensor  # [B, M] bool

    def to(self, device: torch.device) -> "TrainBatch":
        return TrainBatch(*(t.to(device) for t in dataclasses.astuple(self)))

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())


def anchor_range(prompt_len: int, length: int) -> tuple[int, int]:
    """Inclusive range of valid anchors: the last prompt token .. the second-to-last token."""
    return max(prompt_len - 1, 0), length - 2


def sample_anchors(prompt_len: int, length: int, n: int, gen: torch.Generator) -> torch.Tensor:
    lo, hi = anchor_range(prompt_len, length)
    count = hi - lo + 1
    if count <= 0:
        return torch.empty(0, dtype=torch.long)
    pick = torch.randperm(count, generator=gen)[: min(n, count)]
    return (pick + lo).sort().values


def make_batch(seqs: list[Sequence], anchors_per_seq: int, gen: torch.Generator, pad_id: int = 0) -> TrainBatch:
    t = max(len(s.ids) for s in seqs)
    ids = torch.full((len(seqs), t), pad_id, dtype=torch.long)
    per_seq = [sample_anchors(s.prompt_len, len(s.ids), anchors_per_seq, gen) for s in seqs]
    m = max(1, max(len(a) for a in per_seq))
    anchors = torch.zeros(len(seqs), m, dtype=torch.long)
    valid = torch.zeros(len(seqs), m, dtype=torch.bool)
    for i, (s, a) in enumerate(zip(seqs, per_seq)):
        ids[i, : len(s.ids)] = s.ids.long()
        anchors[i, : len(a)] = a
        valid[i, : len(a)] = True
    lengths = torch.tensor([len(s.ids) for s in seqs])
    return TrainBatch(ids, lengths, anchors, valid)


def depth_weights(depth: int, decay: float, device: torch.device) -> torch.Tensor:
    k = torch.arange(depth, device=device, dtype=torch.float32)
    return torch.exp(-k / decay) if decay > 0 else torch.ones(depth, device=device)


class LinearDistill(torch.autograd.Function):
    """Weighted distillation loss of the head's normed hidden rows through the (frozen) lm_head,
    in chunks of rows. Forward computes each chunk's logits, lets `distill_rows` turn them into
    the loss's gradient in place, and multiplies that into the lm_head at once, so only
    d(loss)/d(h) [R, H] is kept for backward: no [R, vocab] tensor outlives its chunk and
    nothing is recomputed. Returns (loss sum, top-1 agreement [R] bool)."""

    @staticmethod
    def forward(ctx, h, lm_head, teacher, rows, weight, kind: str, chunk: int):
        grad_h = torch.empty(h.shape, device=h.device, dtype=torch.float32)
        total = torch.zeros((), device=h.device, dtype=torch.float32)
        agree = []
        with torch.autocast(h.device.type, enabled=False):
            for s in range(0, h.shape[0], chunk):
                logits = h[s : s + chunk].to(lm_head.dtype) @ lm_head.t()
                loss, ok = distill_rows(logits, teacher, rows[s : s + chunk], weight[s : s + chunk], kind)
                grad_h[s : s + chunk] = logits @ lm_head
                total = total + loss.sum()
                agree.append(ok)
        agree = torch.cat(agree) if agree else torch.zeros(0, device=h.device, dtype=torch.bool)
        ctx.save_for_backward(grad_h)
        ctx.h_dtype = h.dtype
        ctx.mark_non_differentiable(agree)
        return total, agree

    @staticmethod
    def backward(ctx, grad_total, _grad_agree):
        (grad_h,) = ctx.saved_tensors
        return (grad_h * grad_total).to(ctx.h_dtype), None, None, None, None, None, None


@dataclass
class LossOut:
    loss: torch.Tensor
    correct: torch.Tensor  # [B, M, D] bool: head top-1 == target top-1 (False where invalid)
    valid: torch.Tensor  # [B, M, D] bool


@torch.no_grad()
def teacher_logits_once(target_hidden: torch.Tensor, positions: torch.Tensor, lm_head: torch.Tensor,
                        chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's logits at each distinct teacher position, in the lm_head's dtype: a position
    teaches every block that covers it (~anchors x depth / answer length blocks, ~4 in the
    shipped recipe), so computing them per position rather than per block row saves that many
    lm_head GEMMs. positions [R] index rows of target_hidden [N, H]; returns (logits [U, vocab],
    row of each position in them [R])."""
    uniq, inverse = torch.unique(positions, return_inverse=True)
    parts = [target_hidden[uniq[s : s + chunk]] @ lm_head.t() for s in range(0, uniq.shape[0], chunk)]
    logits = torch.cat(parts) if parts else target_hidden.new_zeros(0, lm_head.shape[0])
    return logits, inverse


def distill_loss(
    hidden: torch.Tensor, target_hidden: torch.Tensor, batch: TrainBatch, lm_head: torch.Tensor,
    kind: str = "kl", decay: float = 8.0, chunk: int = 1024,
) -> LossOut:
    """hidden [B, M*block, H] from head_forward; target_hidden [B, T, H] (final, normed)."""
    bsz, m = batch.anchors.shape
    block = hidden.shape[1] // m
    d = block - 1
    t_len = target_hidden.shape[1]
    h = hidden.view(bsz, m, block, -1)[:, :, 1:]  # the anchor slot carries no loss
    predicted = batch.anchors[:, :, None] + torch.arange(1, block, device=hidden.device)  # token positions
    valid = batch.anchor_valid[:, :, None] & (predicted < batch.lengths[:, None, None])
    src = (predicted - 1).clamp(max=t_len - 1) + torch.arange(bsz, device=hidden.device)[:, None, None] * t_len
    w = depth_weights(d, decay, hidden.device)[None, None].expand(bsz, m, d)
    hv, wv = h[valid], w[valid]
    teacher, rows = teacher_logits_once(target_hidden.reshape(bsz * t_len, -1), src[valid], lm_head, chunk)
    total, agree = LinearDistill.apply(hv, lm_head, teacher, rows, wv, kind, chunk)
    correct = torch.zeros_like(valid)
    correct[valid] = agree
    return LossOut(total / wv.sum().clamp(min=1e-6), correct, valid)


def chain_tau(correct: torch.Tensor, valid: torch.Tensor) -> float:
    """Teacher-forced τ of a single greedy chain: 1 + consecutive correct depths, over blocks."""
    has = valid[:, :, 0]
    if not has.any():
        return 0.0
    run = (correct & valid).long().cumprod(-1).sum(-1)
    return 1.0 + float(run[has].float().mean())


# ---------------------------------------------------------------------------------------------
# Target side: features from the frozen transformers model


@torch.no_grad()
def target_features(hf_model, input_ids: torch.Tensor, taps: tuple[int, ...]):
    """(taps [B, T, n_taps*H], final normed hidden [B, T, H]) from one frozen forward.

    Batches are right padded, so plain causal attention already keeps the pads out of every
    real position: no attention mask is passed, which keeps SDPA on its fused causal kernels.

    Taps are captured with hooks on the decoder layers: tap L = output of decoder layer L. (In
    transformers 5, output_hidden_states' last entry is the *normed* final state, not the last
    layer's raw output, so hooks are the unambiguous way.)"""
    layers = hf_model.model.layers
    captured: dict[int, torch.Tensor] = {}

    def hook(idx):
        def fn(_module, _inputs, output):
            captured[idx] = output[0] if isinstance(output, tuple) else output
        return fn

    handles = [layers[i].register_forward_hook(hook(i)) for i in sorted(set(taps))]
    try:
        out = hf_model.model(input_ids=input_ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return torch.cat([captured[i] for i in taps], dim=-1), out.last_hidden_state


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


# ---------------------------------------------------------------------------------------------
# Head construction, export


def head_config_for(target_cfg, cfg: TrainConfig, vocab_embed: torch.Tensor | None = None,
                    fallback_mask: int | None = None) -> DraftHeadConfig:
    taps = cfg.taps or default_target_layer_ids(target_cfg.num_layers, min(5, max(1, target_cfg.num_layers - 3)))
    bad = [i for i in taps if not 0 <= i < target_cfg.num_layers]
    if bad:
        raise ConfigError(f"--taps {bad} out of range: the target has layers 0..{target_cfg.num_layers - 1}")
    head_cfg = DraftHeadConfig.for_target(target_cfg, cfg.draft_layers, cfg.block_size, num_taps=len(taps),
                                          mask_token_id=cfg.mask_token_id)
    head_cfg = dataclasses.replace(head_cfg, target_layer_ids=tuple(taps))
    if cfg.intermediate_size is not None:
        head_cfg = dataclasses.replace(head_cfg, intermediate_size=cfg.intermediate_size)
    if cfg.attention_heads is not None:
        if cfg.attention_heads % head_cfg.num_kv_heads:
            raise ConfigError(f"--attention-heads must be a multiple of the target's {head_cfg.num_kv_heads} KV heads, "
                              f"got {cfg.attention_heads}")
        head_cfg = dataclasses.replace(head_cfg, num_heads=cfg.attention_heads)
    if cfg.mask_token_id is None and vocab_embed is not None and fallback_mask is not None:
        head_cfg = dataclasses.replace(head_cfg, mask_token_id=pick_mask_token(vocab_embed, head_cfg.mask_token_id,
                                                                               fallback_mask))
    return head_cfg


def pick_mask_token(embed: torch.Tensor, default: int, fallback: int) -> int:
    """The unused last vocabulary row is the usual MASK, unless its embedding is (near) zero:
    a zero MASK embedding gives all MASK rows identical, norm-free inputs, which starves the
    head of depth information. Then use `fallback` (e.g. the pad token), a trained row."""
    norms = embed[:: max(1, embed.shape[0] // 4096)].float().norm(dim=-1)
    return default if float(embed[default].float().norm()) > 0.1 * float(norms.median()) else fallback


def init_head(head: DraftHead, how: str, seed: int, hf_model=None) -> None:
    """random; target (the target's last layers into the draft layers); or a trained head's
    directory (published format) to continue training it with fresh data and a new schedule.
    A directory must hold a head of exactly this shape (layers, widths, block, taps, MASK)."""
    head.init_random(seed)
    if how == "random":
        return
    if how != "target":
        from ..draft_head import load_head_dir

        trained = load_head_dir(Path(how), next(head.parameters()).device, torch.float32)
        want, got = head.cfg.to_json(), trained.cfg.to_json()
        diff = sorted(k for k in set(want) | set(got) if not _same(want.get(k), got.get(k)))
        if diff:
            raise ConfigError(f"--init {how} holds a head of another shape ({', '.join(diff)} differ); "
                              "pass the same --draft-layers, --intermediate-size, --attention-heads, --block-size and --taps")
        with torch.no_grad():
            head.load_state_dict(trained.state_dict())
        return
    # Copy the target's last layers (same widths by construction); fc stays random.
    src_layers = hf_model.model.layers
    first = len(src_layers) - len(head.layers)
    with torch.no_grad():
        for i, layer in enumerate(head.layers):
            src = dict(src_layers[first + i].named_parameters())
            for name, p in hf_parameters(layer):  # transformers names (fused weights: their rows)
                if name in src and src[name].shape == p.shape:
                    p.copy_(src[name].float())
        head.norm.weight.copy_(hf_model.model.norm.weight.float())


def _same(a, b) -> bool:
    """Config values equal (floats up to fp32 rounding: a saved rms_norm_eps comes back as 9.99e-07)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6)
    return a == b


def export_head(head: DraftHead, directory: Path, dtype: torch.dtype, info: dict | None = None) -> Path:
    """Write the published format (loadable by load_head_dir) in `dtype`."""
    out = build_head(head.cfg, torch.device("cpu"), dtype)
    out.load_state_dict({k: v.detach().cpu() for k, v in head.state_dict().items()})
    out.save(directory)
    if info is not None:
        (Path(directory) / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    return Path(directory)


# ---------------------------------------------------------------------------------------------
# The workspace: engine (our target), transformers model (same weights), tokenizer


class Workspace:
    """Loads the target once: our engine (for evaluation with the real decoder) and a
    transformers model of the same weights (batched generation and features)."""

    def __init__(self, cfg: TrainConfig, log: LogFn):
        from ..models.loader import load_engine, resolve_device, resolve_dtype
        from ..models.oracle import transformers_model

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

    def prompt_ids(self, prompt: str) -> list[int]:
        """The prompt exactly as the chat renders it (same template path, thinking off)."""
        from ..session import ChatSession

        session = ChatSession(self.engine, thinking=False)
        session.messages.append({"role": "user", "content": prompt})
        return session.prompt_ids()

    def head_config(self, cfg: TrainConfig) -> DraftHeadConfig:
        return head_config_for(self.engine.target.cfg, cfg, self.hf.get_input_embeddings().weight, self.pad_id)


# ---------------------------------------------------------------------------------------------
# Stage 1: prompts


def prepare_prompts(cfg: TrainConfig, log: LogFn, ws: "Workspace | None" = None) -> tuple[list[str], list[str]]:
    """(train, dev) prompts; written once to DIR/prompts.jsonl and reused while settings match.
    Built-in prompts: --self-prompts of the training ones are proposed by the target (needs ws);
    the dev prompts are always built-in ones, so dev τ stays comparable across runs."""
    from . import prompts as P

    path = cfg.out / "prompts.jsonl"
    num_dev = max(cfg.eval_prompts, 16)
    # Evaluation alone needs only dev prompts: no proposals, and an earlier stage's file as it is.
    evaluating = cfg.stage in ("eval", "replay")
    proposing = ws is not None and not cfg.prompts_file and not evaluating
    n_self = round(cfg.num_prompts * cfg.self_prompts) if proposing else 0
    key = {"file": cfg.prompts_file, "num_prompts": cfg.num_prompts, "num_dev": num_dev, "seed": cfg.seed,
           "self_prompts": n_self}
    meta = cfg.out / "prompts.meta.json"
    if path.is_file() and meta.is_file():
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        train, dev = [r["prompt"] for r in rows if r["split"] == "train"], [r["prompt"] for r in rows if r["split"] == "dev"]
        if json.loads(meta.read_text()) == key or (evaluating and len(dev) >= num_dev):
            return train, dev
    if cfg.prompts_file:
        try:
            given = P.load_prompts_file(cfg.prompts_file)
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read --prompts {cfg.prompts_file}: {e}") from None
        train, dev = P.split_prompts(list(dict.fromkeys(given)))
        train = train[: cfg.num_prompts]
        if len(dev) < num_dev:  # a small file may have no held-out prompt: add built-in dev prompts
            dev += P.builtin_prompts(0, num_dev - len(dev), seed=cfg.seed)[1]
        dev = dev[:num_dev]
    else:
        log(f"generating {cfg.num_prompts - n_self} training prompts (+{num_dev} held out)")
        train, dev = P.builtin_prompts(cfg.num_prompts - n_self, num_dev, seed=cfg.seed)
        if n_self:
            exclude = set(train) | set(dev) | set(P.eval_prompts("coding")) | set(P.eval_prompts("chat"))
            train += propose_prompts(ws, cfg, n_self, exclude, log)
    cfg.out.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"prompt": p, "split": "train"}) for p in train]
    lines += [json.dumps({"prompt": p, "split": "dev"}) for p in dev]
    _atomic_write(path, "\n".join(lines) + "\n")
    _atomic_write(meta, json.dumps(key) + "\n")
    return train, dev


def collect_proposals(texts: Iterable[str], n: int, exclude: set[str]) -> list[str]:
    """Up to n distinct cleaned proposals, none in `exclude` and none on the dev side of the split.
    Stops reading `texts` at the n-th (so a lazy source makes no more than it needs)."""
    from . import prompts as P

    out: list[str] = []
    seen = set(exclude)
    for text in texts:
        q = P.clean_proposal(text)
        if q is None or q in seen or P.is_dev(q):
            continue
        seen.add(q)
        out.append(q)
        if len(out) == n:
            break
    return out


@torch.no_grad()
def propose_prompts(ws: "Workspace", cfg: TrainConfig, n: int, exclude: set[str], log: LogFn) -> list[str]:
    """n training prompts the target writes itself: it answers `propose_requests` (sampled at
    temperature 0.8 with our batched decoder) and `collect_proposals` keeps the usable ones.
    Twice as many requests as needed are made, since some answers are rejected or repeat."""
    from . import prompts as P

    requests = P.propose_requests(2 * n, cfg.seed)
    ids = [ws.prompt_ids(r) for r in requests]
    bs = gen_batch_size(ws, cfg, len(ids))
    torch.manual_seed(cfg.seed)
    decoder = BatchDecoder(ws.engine.target, bs, max(len(i) for i in ids), 96, ws.engine.stop_token_ids,
                           ws.pad_id, temperature=0.8)
    stops = ws.engine.stop_token_ids
    asked = 0

    def answers() -> Iterator[str]:  # one batch at a time, only as far as collect_proposals reads
        nonlocal asked
        for i in range(0, len(ids), bs):
            for answer, _ in decoder.decode(ids[i : i + bs]):
                asked += 1
                yield ws.tokenizer.decode([t for t in answer if t not in stops], skip_special_tokens=True)

    t0 = time.perf_counter()
    kept = collect_proposals(answers(), n, exclude)  # the decoder's cache goes with this function
    log(f"the target proposed {len(kept)} prompts ({asked} asked, {time.perf_counter() - t0:.0f} s)")
    return kept


def gen_batch_size(ws: "Workspace", cfg: TrainConfig, prompts: int) -> int:
    """Prompts decoded together: --gen-batch-size (default 256 on CUDA, 8 on CPU), at most `prompts`."""
    return max(1, min(cfg.gen_batch_size or (256 if ws.device.type == "cuda" else 8), prompts))


# ---------------------------------------------------------------------------------------------
# Stage 2: data (the target's own answers)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def data_settings(ws: Workspace, cfg: TrainConfig) -> dict:
    """What the data depends on; a resumed run must match it."""
    template = getattr(ws.tokenizer, "chat_template", None) or ""
    return {"format": DATA_FORMAT, "target": cfg.target, "max_new_tokens": cfg.max_new_tokens,
            "temperature": cfg.temperature, "template": _sha(str(template)), "vocab": ws.engine.target.cfg.vocab_size}


def data_shards(out: Path) -> list[Path]:
    return sorted((out / "data").glob("shard-*.pt"))


def done_prompts(out: Path) -> set[str]:
    done: set[str] = set()
    for shard in data_shards(out):
        done.update(torch.load(shard, weights_only=True)["prompt_sha"])
    return done


def generate_data(ws: Workspace, cfg: TrainConfig, train_prompts: list[str], deadline: float | None,
                  log: LogFn) -> dict:
    """Answer every training prompt not answered yet; one shard per generation batch."""
    data_dir = cfg.out / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    settings = data_settings(ws, cfg)
    meta = data_dir / "meta.json"
    if meta.is_file():
        old = json.loads(meta.read_text())
        if old != settings:
            changed = sorted(k for k in settings if old.get(k) != settings[k])
            raise ConfigError(f"{data_dir} holds data made with other settings ({', '.join(changed)}); "
                              "use another --out, or delete that directory")
    else:
        _atomic_write(meta, json.dumps(settings) + "\n")
    done = done_prompts(cfg.out)
    todo, skipped = [], 0
    for p in train_prompts:
        if _sha(p) in done:
            continue
        ids = ws.prompt_ids(p)
        if len(ids) > cfg.max_prompt_tokens:
            skipped += 1
            continue
        todo.append((p, ids))
    if skipped:
        log(f"skipped {skipped} prompts longer than --max-prompt-tokens {cfg.max_prompt_tokens}")
    bs = gen_batch_size(ws, cfg, len(todo))
    # Similar lengths per batch (little padding); batches in a seeded random order, so a
    # time-bounded run still covers all prompt kinds and lengths.
    todo.sort(key=lambda x: len(x[1]))
    batches = [todo[i : i + bs] for i in range(0, len(todo), bs)]
    order = torch.randperm(len(batches), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    next_shard = len(data_shards(cfg.out))
    stats = {"sequences": 0, "answer_tokens": 0, "finished_eos": 0, "stopped_by_time": False, "skipped": skipped}
    t0 = time.perf_counter()
    bar = _bar(cfg, total=len(todo), desc="data", unit="prompt")
    decoder = None
    if todo:
        decoder = BatchDecoder(ws.engine.target, bs, max(len(ids) for _, ids in todo), cfg.max_new_tokens,
                               ws.engine.stop_token_ids, ws.pad_id, cfg.temperature)
        log(f"data: batches of {bs}, KV cache {decoder.cache_bytes / 2**30:.2f} GiB")
    try:
        for bi in order:
            if deadline is not None and time.time() > deadline:
                stats["stopped_by_time"] = True
                log("data: time budget reached, keeping what is done")
                break
            batch = batches[bi]
            answers = decoder.decode([ids for _, ids in batch])
            shard = {"ids": [], "prompt_len": [], "prompt_sha": [], "finish": []}
            for (p, ids), (ans, finish) in zip(batch, answers):
                shard["ids"].append(torch.tensor(ids + ans, dtype=torch.int32))
                shard["prompt_len"].append(len(ids))
                shard["prompt_sha"].append(_sha(p))
                shard["finish"].append(finish)
                stats["answer_tokens"] += len(ans)
                stats["finished_eos"] += finish == "eos"
            stats["sequences"] += len(batch)
            path = data_dir / f"shard-{next_shard:05d}.pt"
            torch.save(shard, path.with_name(path.name + ".tmp"))
            path.with_name(path.name + ".tmp").replace(path)
            next_shard += 1
            bar.update(len(batch))
            bar.set_postfix(tok_s=f"{stats['answer_tokens'] / (time.perf_counter() - t0):.0f}")
    finally:
        bar.close()
        del decoder  # its KV cache: training needs the memory
        if ws.device.type == "cuda":
            torch.cuda.empty_cache()
    stats["seconds"] = round(time.perf_counter() - t0, 2)
    stats["total_sequences"] = len(done) + stats["sequences"]
    return stats


def load_sequences(out: Path, max_seq_len: int) -> list[Sequence]:
    """All generated sequences, truncated to max_seq_len; those without an answer token dropped."""
    seqs = []
    for shard in data_shards(out):
        data = torch.load(shard, weights_only=True)
        for ids, plen in zip(data["ids"], data["prompt_len"]):
            ids = ids[:max_seq_len]
            if len(ids) - plen >= 1 and len(ids) >= 2:
                seqs.append(Sequence(ids, plen))
    return seqs


# ---------------------------------------------------------------------------------------------
# Stage 3: training


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
    bar = _bar(cfg, total=st.total_steps, desc="train", unit="step", initial=st.step)
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
            gen = torch.Generator().manual_seed(cfg.seed * 7919 + st.step)
            batch = make_batch([seqs[i] for i in sampler.indices(st.step)], cfg.anchors_per_seq, gen, ws.pad_id)
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
                _append_log(cfg.out, {"step": st.step, "lr": lr_at(frac, cfg.lr, cfg.warmup), "tok_s": round(rate, 1),
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


# ---------------------------------------------------------------------------------------------
# Stage 4: evaluation with the real tree decoder


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
        from ..engine import SpecEngine

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
        from ..events import FinishEvent
        from ..params import GenerationParams, SpecParams
        from ..session import ChatSession

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
        _append_log(self.cfg.out, {"step": step, "eval": r.to_dict()})
        return {"step": step, "budget": budget, "tau": r.tau}

    def final(self, head: DraftHead, deadline: float | None) -> dict:
        """Dev prompts at every budget, then the built-in eval sets at the largest budget."""
        from .prompts import eval_prompts

        self._load(head)
        report: dict = {"dev": [], "sets": {}}
        bar = _bar(self.cfg, total=len(self.cfg.eval_budgets) + len(self.cfg.eval_sets), desc="eval", unit="run")
        try:
            for budget in self.cfg.eval_budgets:
                r = self.tau(self.dev, budget, deadline)
                report["dev"].append(r.to_dict())
                bar.set_postfix(budget=budget, tau=f"{r.tau:.2f}")
                bar.update(1)
            for name in self.cfg.eval_sets:
                r = self.tau(eval_prompts(name), max(self.cfg.eval_budgets), deadline)
                report["sets"][name] = r.to_dict()
                bar.update(1)
        finally:
            bar.close()
        return report


# ---------------------------------------------------------------------------------------------
# Orchestration


def _bar(cfg: TrainConfig, **kw):
    from tqdm.auto import tqdm

    return tqdm(disable=not cfg.progress, dynamic_ncols=True, file=sys.stderr, **kw)


def _append_log(out: Path, row: dict) -> None:
    with open(out / "log.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


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
    ws = Workspace(cfg, log)
    head_cfg = ws.head_config(cfg)
    summary: dict = {"target": cfg.target, "out": str(cfg.out), "head": head_cfg.to_json()}
    _atomic_write(cfg.out / "run_config.json",
                  json.dumps({k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(cfg).items()},
                             indent=2) + "\n")
    train_prompts, dev_prompts = prepare_prompts(cfg, log, ws)
    summary["prompts"] = {"train": len(train_prompts), "dev": len(dev_prompts)}

    if cfg.stage in ("data", "all"):
        summary["data"] = generate_data(ws, cfg, train_prompts, deadlines.data, log)
        log(f"data: {summary['data']['total_sequences']} sequences in {cfg.out / 'data'}")

    if cfg.stage == "replay":
        summary["replay"] = replay_stage(ws, cfg, dev_prompts, log)

    evaluate = cfg.eval_prompts > 0  # 0: no τ at all (e.g. to time training alone)
    needs_evaluator = cfg.stage in ("train", "eval", "all") and evaluate
    evaluator = Evaluator(ws, cfg, head_cfg, dev_prompts, log) if needs_evaluator else None
    head_dir = cfg.out / "head"
    if cfg.stage in ("train", "all"):
        seqs = load_sequences(cfg.out, cfg.max_seq_len)
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
        export_head(trainer.head, head_dir, _dtype(cfg.export_dtype), info)
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
        _atomic_write(cfg.out / "eval.json", json.dumps(summary["eval"], indent=2) + "\n")
        history = summary.get("train", {}).get("history", [])
        if history and history[0]["step"] == 0:
            summary["tau_before"] = history[0]["tau"]
        summary["tau_after"] = {r["budget"]: round(r["tau"], 4) for r in summary["eval"]["dev"]}
    summary["seconds"] = round(time.time() - start, 1)
    _atomic_write(cfg.out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def load_trained_head(ws: Workspace, head_dir: Path) -> DraftHead:
    """OUT/head, checked against the target (for the stages that only evaluate it)."""
    from ..draft_head import load_head_dir

    if not (head_dir / "config.json").is_file():
        raise ConfigError(f"no trained head in {head_dir}; run the train stage first")
    head = load_head_dir(head_dir, ws.device, torch.float32)
    head.cfg.check_against(ws.engine.target.cfg, str(head_dir))
    return head


def replay_stage(ws: Workspace, cfg: TrainConfig, dev_prompts: list[str], log: LogFn) -> dict:
    """--stage replay: where OUT/head loses τ, on the dev prompts and the eval sets (replay.py)."""
    from .prompts import eval_prompts
    from .replay import replay_report

    head = load_trained_head(ws, cfg.out / "head")
    sets = {"dev": dev_prompts[: max(cfg.eval_prompts, 1)], **{name: eval_prompts(name) for name in cfg.eval_sets}}
    report = replay_report(ws, head, sets, cfg.eval_budgets, cfg.eval_width, cfg.eval_max_new_tokens,
                           gen_batch_size(ws, cfg, max(len(p) for p in sets.values())), log)
    _atomic_write(cfg.out / "replay.json", json.dumps(report, indent=2) + "\n")
    return report


def _dtype(name: str) -> torch.dtype:
    from ..models.loader import DTYPES

    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {name!r}")
    return DTYPES[name]

"""Training batches and the distillation loss.

Block position k (1..D) predicts the token at a+k; its teacher is the target's next-token
distribution at position a+k-1, i.e. the final hidden state there times lm_head. Positions past
the sequence end carry no loss, nor does the anchor slot.

Loss: forward KL(target || head) over the FULL vocabulary (`--loss kl`, default) or CE against the
target's argmax (`--loss ce`). The target's logits are formed once per teacher position (a
position teaches every block covering it) and kept in the target's dtype; the head's are formed in
row chunks (`LinearDistill`): per chunk, one kernel (kernels/distill.py) turns them into the
loss's gradient in place, which is multiplied into the lm_head at once and the chunk dropped. So
the head side is O(chunk x vocab), never O(rows x vocab), nothing is recomputed in backward, and no
top-k approximation is needed. Depth weights w_k = exp(-(k-1)/depth_decay) (0 = uniform).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..kernels import distill_rows


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


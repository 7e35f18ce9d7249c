"""The draft head's distillation loss over the full vocabulary, one pass per row.

`distill_rows(logits, teacher, rows, weight, kind)` takes the head's logits for R block rows
([R, V], the lm_head GEMM's output) and the target's logits at its teacher positions
([U, V]; row r is taught by teacher[rows[r]]), and returns each row's weighted loss and whether
the two argmaxes agree. It overwrites `logits` with the loss's gradient with respect to them,
weight * (softmax(logits) - target), in the logits' dtype:

  kind "kl": loss = w * KL(p || q), p = softmax(teacher), q = softmax(logits), target = p
  kind "ce": loss = -w * log q[argmax teacher],                       target = one_hot(argmax)

Why a kernel: on the 1.5B target a training step forms ~15k such rows of 152k logits (2.3G
elements). Eager torch makes ~10 full fp32 passes over them (casts, two log-softmaxes, exp, the
product, the sum, and as many again when checkpointing recomputes the chunk for backward), tens of
GB of memory traffic per step. The kernel reads both rows twice (online max / sum / argmax, then
the gradient) and writes the gradient once, so the head's backward needs no recomputation: the
caller multiplies that gradient into the lm_head right away (train.LinearDistill).

Ties in an argmax go to the lowest index, as in torch.
"""
from __future__ import annotations

import torch

from .launch import launch_args, wait_for_previous

try:  # triton is optional: CPU-only installs use the torch reference.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None

KINDS = ("kl", "ce")
DISTILL_BLOCK = 2048


def distill_rows_ref(
    logits: torch.Tensor, teacher: torch.Tensor, rows: torch.Tensor, weight: torch.Tensor, kind: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of `distill_rows` (fp32 math): (loss [R] fp32, agree [R] bool)."""
    assert kind in KINDS, kind
    z = logits.float()
    t = teacher[rows].float()
    logq = torch.log_softmax(z, dim=-1)
    best = t.argmax(-1)
    if kind == "kl":
        logp = torch.log_softmax(t, dim=-1)
        target = logp.exp()
        loss = (target * (logp - logq)).sum(-1)
    else:
        target = torch.zeros_like(z).scatter_(1, best[:, None], 1.0)
        loss = -logq.gather(1, best[:, None])[:, 0]
    w = weight.float()
    agree = z.argmax(-1) == best
    logits.copy_((logq.exp() - target) * w[:, None])
    return loss * w, agree


if triton is not None:

    @triton.jit
    def _distill_rows_kernel(
        Z, T, ROWS, W, LOSS, AGREE, V, stride_z, stride_t,
        IS_KL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_for_previous(PDL)
        r = tl.program_id(0)
        z_row = Z + r.to(tl.int64) * stride_z
        t_row = T + tl.load(ROWS + r).to(tl.int64) * stride_t
        w = tl.load(W + r).to(tl.float32)
        offs = tl.arange(0, BLOCK)
        neg = -1.0e30  # finite: lanes that never see a column keep (max neg, sum 0) without nan
        # Pass 1, per lane: online max and sum of exp for both rows, sum p*(t - z) (KL), argmaxes.
        m_z = tl.full([BLOCK], neg, tl.float32)
        s_z = tl.zeros([BLOCK], tl.float32)
        m_t = tl.full([BLOCK], neg, tl.float32)
        s_t = tl.zeros([BLOCK], tl.float32)
        a_t = tl.zeros([BLOCK], tl.float32)
        bz_v = tl.full([BLOCK], neg, tl.float32)
        bz_i = tl.zeros([BLOCK], tl.int32)
        bt_v = tl.full([BLOCK], neg, tl.float32)
        bt_i = tl.zeros([BLOCK], tl.int32)
        for start in range(0, V, BLOCK):
            idx = start + offs
            ok = idx < V
            z = tl.load(z_row + idx, mask=ok, other=0.0).to(tl.float32)
            t = tl.load(t_row + idx, mask=ok, other=0.0).to(tl.float32)
            zm = tl.where(ok, z, neg)
            tm = tl.where(ok, t, neg)
            new_mz = tl.maximum(m_z, zm)
            s_z = s_z * tl.exp(m_z - new_mz) + tl.where(ok, tl.exp(zm - new_mz), 0.0)
            m_z = new_mz
            new_mt = tl.maximum(m_t, tm)
            scale = tl.exp(m_t - new_mt)
            e_t = tl.where(ok, tl.exp(tm - new_mt), 0.0)
            s_t = s_t * scale + e_t
            a_t = a_t * scale + e_t * (t - z)
            m_t = new_mt
            up_z = zm > bz_v  # strict: a lane keeps its first (lowest) index on ties
            bz_v = tl.where(up_z, zm, bz_v)
            bz_i = tl.where(up_z, idx, bz_i)
            up_t = tm > bt_v
            bt_v = tl.where(up_t, tm, bt_v)
            bt_i = tl.where(up_t, idx, bt_i)
        mz = tl.max(m_z, axis=0)
        sz = tl.sum(s_z * tl.exp(m_z - mz), axis=0)
        mt = tl.max(m_t, axis=0)
        sc = tl.exp(m_t - mt)
        st = tl.sum(s_t * sc, axis=0)
        bzv = tl.max(bz_v, axis=0)
        best_z = tl.min(tl.where(bz_v == bzv, bz_i, V), axis=0)
        btv = tl.max(bt_v, axis=0)
        best_t = tl.min(tl.where(bt_v == btv, bt_i, V), axis=0)
        lse_z = mz + tl.log(sz)
        if IS_KL:
            loss = tl.sum(a_t * sc, axis=0) / st - (mt + tl.log(st)) + lse_z
        else:
            loss = lse_z - tl.load(z_row + best_t).to(tl.float32)
        tl.store(LOSS + r, loss * w)
        tl.store(AGREE + r, (best_z == best_t).to(tl.int8))
        # Pass 2: the gradient w * (q - target), written over the logits.
        inv_sz = 1.0 / sz
        inv_st = 1.0 / st
        for start in range(0, V, BLOCK):
            idx = start + offs
            ok = idx < V
            z = tl.load(z_row + idx, mask=ok, other=0.0).to(tl.float32)
            q = tl.exp(z - mz) * inv_sz
            if IS_KL:
                t = tl.load(t_row + idx, mask=ok, other=0.0).to(tl.float32)
                p = tl.exp(t - mt) * inv_st
            else:
                p = tl.where(idx == best_t, 1.0, 0.0)
            tl.store(z_row + idx, (w * (q - p)).to(Z.dtype.element_ty), mask=ok)


def distill_rows_triton(
    logits: torch.Tensor, teacher: torch.Tensor, rows: torch.Tensor, weight: torch.Tensor, kind: str,
    *, block: int = DISTILL_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton `distill_rows_ref`: one program per row. logits [R, V] and teacher [U, V] need a
    unit last stride; rows [R] int; weight [R]."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    assert kind in KINDS, kind
    r, v = logits.shape
    assert teacher.shape[1] == v and logits.stride(1) == 1 and teacher.stride(1) == 1
    loss = torch.empty(r, device=logits.device, dtype=torch.float32)
    agree = torch.empty(r, device=logits.device, dtype=torch.int8)
    if r > 0:
        _distill_rows_kernel[(r,)](
            logits, teacher, rows.contiguous(), weight.float().contiguous(), loss, agree, v,
            logits.stride(0), teacher.stride(0), IS_KL=kind == "kl", BLOCK=block, num_warps=8,
            **launch_args(logits.device, r),
        )
    return loss, agree.bool()


def distill_rows(
    logits: torch.Tensor, teacher: torch.Tensor, rows: torch.Tensor, weight: torch.Tensor, kind: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row weighted loss and argmax agreement; `logits` becomes the loss's gradient.
    Triton on CUDA tensors, the torch reference elsewhere."""
    if logits.is_cuda and triton is not None:
        return distill_rows_triton(logits, teacher, rows, weight, kind)
    return distill_rows_ref(logits, teacher, rows, weight, kind)

"""The k largest log-softmax values of each logits row, with their token ids, in two launches.

Contract: `top_log_probs_ref` (kernels/reference.py): the k tokens of highest logit, descending,
ties broken by the lower id, with their fp32 log-softmax values. The ids and their order are
the reference's exactly; a value may differ from torch's log_softmax in the last bits (the
normaliser is summed in another order, with Triton's exp). The draft tree only proposes tokens
and the target decides, so an answer's losslessness does not depend on those bits.

Why: the draft's tree build needs only the top-k (k <= 64) of each depth's 152k-token row. Torch
spends a log-softmax over the whole row (one CUDA block a row: 15 blocks for 132 SMs) and a radix
top-k (four kernels) on it; here two launches read the row once.

- `_chunk_top_kernel`, a program per (row, chunk of CHUNK logits), so a row is read by many SMs
  at once: the chunk's maximum m_c, its share of the normaliser s_c = sum exp(x - m_c) (fp32),
  and its top-KP keys (a bitonic `tl.topk`) to a scratch row. A key is an int64 that holds the
  logit's order-preserving bits above (2^31 - 1 - id): unique per token, so the key order is
  (logit descending, id ascending), the reference's order.
- `_merge_top_kernel`, a program per row: the log-sum-exp M + log(sum s_c exp(m_c - M)) over the
  chunks (a fixed reduction order: the same inputs give the same bits), the top k of the
  chunks' candidates, and value = (x - M) - log(sum) as torch's log_softmax forms it.
Fixed shapes, no host sync: safe inside a CUDA graph.
"""
from __future__ import annotations

import torch

from .launch import launch_args, wait_for_previous
from .reference import top_log_probs_ref

try:  # triton is optional: CPU-only installs use the torch reference.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None

KERNELS = ("_chunk_top_kernel", "_merge_top_kernel")
MAX_K = 64  # the widest top-k the kernels take (the draft's MAX_WIDTH); wider: the reference
CHUNK = 4096  # logits a program of the first pass reads: 38 programs a 152k-token row
NARROW_MAX_CHUNK = 1 << 16  # 16-bit logits select on int32 keys: the chunk index takes 16 bits

if triton is not None:
    from .sort_keys import key_index, key_value, sort_key

    @triton.jit
    def _narrow_key(raw, local):
        """int32 key of a 16-bit float's bits `raw` (bf16 / fp16, as int16) at chunk index
        `local` (< 2^16): the bits in sign-magnitude order above (2^16 - 1 - local), so one
        integer comparison orders by value descending, then by index ascending, as `sort_key`."""
        bits = raw.to(tl.int32)  # sign-extended
        bits = tl.where((bits & 0x7FFF) == 0, 0, bits)  # -0.0 == 0.0: one key for both
        bits = bits ^ ((bits >> 31) & 0x7FFF)  # negative floats: flip the magnitude bits
        return (bits << 16) | (0xFFFF - local)

    @triton.jit
    def _narrow_value(key, DTYPE: tl.constexpr):
        """The float a `_narrow_key` holds, as fp32 (exact)."""
        bits = key >> 16
        bits = bits ^ ((bits >> 31) & 0x7FFF)
        return bits.to(tl.int16).to(DTYPE, bitcast=True).to(tl.float32)

    @triton.jit
    def _chunk_top_kernel(
        X, MAXS, SUMS, CAND,  # [D, V] logits (any float dtype), [D, NC] fp32 x2, [D, NC, KP] int64
        V, stride, n_chunks,
        CHUNK: tl.constexpr, KP: tl.constexpr, NARROW: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_for_previous(PDL)
        NONE: tl.constexpr = -(2**63)  # below every real key (-inf logits included)
        row = tl.program_id(0)
        c = tl.program_id(1)
        local = tl.arange(0, CHUNK)
        idx = c * CHUNK + local
        inside = idx < V
        raw = tl.load(X + row.to(tl.int64) * stride + idx, mask=inside, other=float("-inf"))
        x = raw.to(tl.float32)
        m = tl.max(x, 0)
        finite = x > float("-inf")
        w = tl.where(finite, tl.exp(tl.where(finite, x, 0.0) - tl.where(finite, m, 0.0)), 0.0)  # an all -inf chunk: 0, not NaN
        out = row * n_chunks + c
        tl.store(MAXS + out, m)
        tl.store(SUMS + out, tl.sum(w, 0))
        if NARROW:
            # 16-bit logits: the selection runs on int32 keys (half the bits a compare-exchange
            # moves), then the KP winners become the int64 keys the merge takes.
            keys = tl.where(inside, _narrow_key(raw.to(tl.int16, bitcast=True), local), -(2**31))
            top = tl.topk(keys, KP)
            win = c * CHUNK + (0xFFFF - (top & 0xFFFF))
            best = tl.where(top > -(2**31), sort_key(_narrow_value(top, raw.dtype), win), NONE)
        else:
            best = tl.topk(tl.where(inside, sort_key(x, idx), NONE), KP)
        tl.store(CAND + out.to(tl.int64) * KP + tl.arange(0, KP), best)

    @triton.jit
    def _merge_top_kernel(
        MAXS, SUMS, CAND, VALUES, IDS,  # scratch as above; [D, K] fp32, [D, K] int64
        n_chunks, k,
        NCP: tl.constexpr, KP: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_for_previous(PDL)
        NONE: tl.constexpr = -(2**63)
        row = tl.program_id(0)
        c = tl.arange(0, NCP)
        real = c < n_chunks
        m_c = tl.load(MAXS + row * n_chunks + c, mask=real, other=float("-inf"))
        s_c = tl.load(SUMS + row * n_chunks + c, mask=real, other=0.0)
        m = tl.max(m_c, 0)
        total = tl.sum(tl.where(m_c > float("-inf"), s_c * tl.exp(m_c - m), 0.0), 0)
        log_total = tl.log(total)
        j = tl.arange(0, NCP * KP)
        keys = tl.load(CAND + row.to(tl.int64) * n_chunks * KP + j, mask=j < n_chunks * KP, other=NONE)
        top = tl.topk(keys, KP)
        x = key_value(top)
        ids = key_index(top)
        r = tl.arange(0, KP)
        tl.store(VALUES + row * k + r, (x - m) - log_total, mask=r < k)
        tl.store(IDS + row * k + r, ids, mask=r < k)


def _pow2(x: int) -> int:
    return 1 << max(1, x - 1).bit_length()  # at least 2 (tl.arange, tl.topk)


def _chunk_warps(chunk: int) -> int:
    return 4 if chunk <= 2048 else 8


def _merge_warps(keys: int) -> int:
    # 4096 keys (k = 64, 38 chunks) take 168 registers a thread at 4 warps on sm_90, no spills
    return 4 if keys <= 2048 else 8


def top_log_probs_triton(logits: torch.Tensor, k: int, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton `top_log_probs_ref` (same ids in the same order; values to fp32 rounding): two
    launches, fixed shapes, no host sync. `chunk` (a power of two) is the first pass's length."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    depth, vocab = logits.shape
    assert 1 <= k <= min(MAX_K, vocab), f"k must be 1..{min(MAX_K, vocab)}, got {k}"
    assert logits.dtype in (torch.float32, torch.bfloat16, torch.float16), logits.dtype
    logits = logits if logits.stride(1) == 1 else logits.contiguous()
    kp = _pow2(k)
    chunk = max(chunk, kp)
    n_chunks = triton.cdiv(vocab, chunk)
    device = logits.device
    maxs = torch.empty(depth, n_chunks, dtype=torch.float32, device=device)
    sums = torch.empty(depth, n_chunks, dtype=torch.float32, device=device)
    cand = torch.empty(depth, n_chunks, kp, dtype=torch.long, device=device)
    values = torch.empty(depth, k, dtype=torch.float32, device=device)
    ids = torch.empty(depth, k, dtype=torch.long, device=device)
    _chunk_top_kernel[(depth, n_chunks)](
        logits, maxs, sums, cand, vocab, logits.stride(0), n_chunks,
        CHUNK=chunk, KP=kp, NARROW=logits.dtype != torch.float32 and chunk <= NARROW_MAX_CHUNK,
        num_warps=_chunk_warps(chunk), **launch_args(device, depth),
    )
    _merge_top_kernel[(depth,)](
        maxs, sums, cand, values, ids, n_chunks, k,
        NCP=_pow2(n_chunks), KP=kp, num_warps=_merge_warps(_pow2(n_chunks) * kp), **launch_args(device, depth),
    )
    return values, ids


def top_log_probs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest log-softmax values of each row of `logits` [D, V] and their token ids
    ([D, k] fp32, [D, k] int64; `top_log_probs_ref`): the Triton kernels on CUDA for k <= MAX_K,
    the torch reference elsewhere."""
    if logits.is_cuda and triton is not None and k <= MAX_K:
        return top_log_probs_triton(logits, k)
    return top_log_probs_ref(logits, k)

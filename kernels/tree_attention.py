"""Triton paged tree attention (verify / prefill chunk / AR decode) and a fused KV write.

Semantics are exactly those of `reference.paged_tree_attention_ref`: T new query tokens attend
to the committed prefix (logical 0..prefix_len-1, all visible) and to the new tokens themselves
(logical prefix_len..prefix_len+T-1) under a [T, T] visibility mask.

Work split (see kernels/NOTES.md for the full design and the H100 cost model):
  grid = (query tiles, KV heads, splits)
  * GQA packing: one program owns one KV head and BLOCK_M "rows", a row being a (token, query
    head of that KV head's group) pair, flattened as row = token * GROUP + g. Every K/V tile is
    therefore read once per KV head for all query heads and tokens of the tile. Any group size
    works (Qwen2.5-0.5B has 7).
  * Split-K: the prefix is cut into NUM_SPLITS contiguous chunks (flash-decoding), chunk bounds
    computed in the kernel from prefix_len read from device memory, so a CUDA graph captured
    once serves every prefix length. The tree part's 64-column tiles (under the mask) are
    dealt round-robin over the same splits. With NUM_SPLITS == 1 the program writes the final output; otherwise each split
    writes a normalised partial output + its log-sum-exp and a small merge kernel combines them.
  * The mask travels as bits: int64 words [T, ceil(T / 64)], bit j % 64 of word j // 64 of
    row i set iff query i sees new token j (`pack_tree_mask`); one word per row per 64-column
    tree tile, and tiles no row of a program sees are skipped. The engine can pack once per
    round and pass the packed tensor to every layer.
fp32 scores, softmax and accumulation (exp2 with the scale folded in); output in q's dtype.
fp32 inputs use IEEE fp32 dots (no TF32) so fp32 runs stay lossless.
"""
from __future__ import annotations

import functools

import torch

from .reference import logical_to_slots, paged_tree_attention_ref, write_kv_ref

try:  # triton is optional: CPU-only installs use the torch references.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None

LOG2E = 1.4426950408889634

# Tile sizes: BLOCK_N KV positions per step, at most MAX_BLOCK_M packed rows per program,
# 4 warps, 2 stages. Measured on an H200 (NOTES.md) against (64|128, 64|128, 4|8 warps,
# 2|3 stages): this is best or within ~10% everywhere. Tuning ideas, measure first:
# 128x128 tiles with 8 warps gain 3-10% for T*group >= 512; TMA / warp-specialised (FA3-style)
# loads for the full prefix tiles; a merge-free path when the prefix is short.
BLOCK_N = 64
MAX_BLOCK_M = 64
MIN_BLOCK_M = 16  # tl.dot needs M >= 16
MAX_SPLITS = 64
MASK_BITS = 64  # bits per packed mask word = columns per tree tile


# ----------------------------------------------------------------------------- mask packing


def pack_tree_mask(tree_mask: torch.Tensor) -> torch.Tensor:
    """[T, T] bool -> [T, ceil(T/64)] int64 words; bit j % 64 of word j // 64 = mask[:, j].

    One word covers one 64-column tile of the kernel's tree loop, so a tile's mask is a single
    int64 per query row. Bits past T are zero. Pure device ops with fixed shapes (no host sync),
    so it can live inside a CUDA graph.
    """
    t = tree_mask.shape[0]
    words = (t + MASK_BITS - 1) // MASK_BITS
    padded = torch.zeros(t, words * MASK_BITS, dtype=torch.int64, device=tree_mask.device)
    padded[:, : tree_mask.shape[1]] = tree_mask.to(torch.int64)
    shifts = torch.arange(MASK_BITS, device=tree_mask.device, dtype=torch.int64)
    # Disjoint bits, so the sum is their OR (bit 63 wraps to the sign bit, as intended).
    return (padded.view(t, words, MASK_BITS) << shifts).sum(-1)


def unpack_tree_mask(packed: torch.Tensor, t: int) -> torch.Tensor:
    """Inverse of `pack_tree_mask`: [T, W] int64 -> [T, t] bool."""
    shifts = torch.arange(MASK_BITS, device=packed.device, dtype=torch.int64)
    bits = (packed.unsqueeze(-1) >> shifts) & 1
    return bits.view(packed.shape[0], -1)[:, :t].bool()


# ----------------------------------------------------------------------------- triton kernels

if triton is not None:

    @triton.jit
    def _load_kv_tile(
        K, V, BT, pos, valid, kv, d,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        BLOCK_SIZE: tl.constexpr, MASKED: tl.constexpr,
    ):
        """Gather K^T [D, BLOCK_N] and V [BLOCK_N, D] for logical positions `pos` of KV head kv.

        MASKED=False (whole tile inside the valid range) keeps the loads unpredicated.
        """
        if MASKED:
            blk = tl.load(BT + pos // BLOCK_SIZE, mask=valid, other=0)
        else:
            blk = tl.load(BT + pos // BLOCK_SIZE)
        blk = blk.to(tl.int64)
        off = pos % BLOCK_SIZE
        k_ptr = K + (blk * stride_kb + off * stride_ks + kv * stride_kh)[None, :] + d[:, None]
        v_ptr = V + (blk * stride_vb + off * stride_vs + kv * stride_vh)[:, None] + d[None, :]
        if MASKED:
            kt = tl.load(k_ptr, mask=valid[None, :], other=0.0)
            v = tl.load(v_ptr, mask=valid[:, None], other=0.0)
        else:
            kt = tl.load(k_ptr)
            v = tl.load(v_ptr)
        return kt, v

    @triton.jit
    def _online_softmax_step(q, kt, v, visible, m_i, l_i, acc, qk_scale,
                             PRECISION: tl.constexpr, MASKED: tl.constexpr):
        """One flash-attention step in the log2 domain; rows with nothing visible stay at 0.

        MASKED=False: every score of the tile is visible (`visible` is ignored).
        """
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale
        if MASKED:
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # avoid -inf - -inf = nan
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        return m_new, l_i, acc

    @triton.jit
    def _tree_attn_kernel(
        Q, K, V, BT, PREFIX, BITS, OUT, OUT_PART, LSE_PART,
        T, N_HEADS, MASK_WORDS, qk_scale,
        stride_qt, stride_qh,
        stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh,
        stride_ot, stride_oh,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
        MASK_BITS: tl.constexpr, PRECISION: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        kv = tl.program_id(1)
        split = tl.program_id(2)

        # Packed rows: row = token * GROUP + g, query head = kv * GROUP + g.
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        row_valid = rows < T * GROUP
        tok = rows // GROUP
        head = kv * GROUP + rows % GROUP
        d = tl.arange(0, HEAD_DIM)
        q = tl.load(
            Q + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
            mask=row_valid[:, None], other=0.0,
        )

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

        # Prefix part: this split's chunk of [0, prefix_len), chunk rounded up to whole tiles.
        # prefix_len comes from device memory: never specialised, CUDA-graph safe.
        prefix = tl.load(PREFIX).to(tl.int32)
        chunk = tl.cdiv(tl.cdiv(prefix, NUM_SPLITS), BLOCK_N) * BLOCK_N
        lo = split * chunk
        hi = tl.maximum(tl.minimum(lo + chunk, prefix), lo)
        full_end = lo + (hi - lo) // BLOCK_N * BLOCK_N
        # Whole tiles: no masks at all (padded query rows are zeros and are never stored).
        for start in range(lo, full_end, BLOCK_N):
            pos = start + tl.arange(0, BLOCK_N)
            kt, v = _load_kv_tile(K, V, BT, pos, pos < hi, kv, d,
                                  stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                                  BLOCK_SIZE, False)
            m_i, l_i, acc = _online_softmax_step(q, kt, v, pos < hi, m_i, l_i, acc, qk_scale,
                                                 PRECISION, False)
        # The ragged last tile of the chunk (runs at most once).
        for start in range(full_end, hi, BLOCK_N):
            pos = start + tl.arange(0, BLOCK_N)
            col_valid = pos < hi
            kt, v = _load_kv_tile(K, V, BT, pos, col_valid, kv, d,
                                  stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                                  BLOCK_SIZE, True)
            visible = row_valid[:, None] & col_valid[None, :]
            m_i, l_i, acc = _online_softmax_step(q, kt, v, visible, m_i, l_i, acc, qk_scale,
                                                 PRECISION, True)

        # Tree part: new tokens j at logical prefix_len + j, 64-column tiles dealt round-robin
        # over the splits (so short prefixes still spread the work). A tile's mask is one int64
        # word per query row; tiles no row of this program sees are skipped (for topologically
        # ordered trees and causal chunks: everything right of the diagonal).
        bit = tl.arange(0, MASK_BITS).to(tl.int64)
        for start in range(split * MASK_BITS, T, NUM_SPLITS * MASK_BITS):
            word = tl.load(BITS + tok * MASK_WORDS + start // MASK_BITS, mask=row_valid, other=0)
            if tl.max((word != 0).to(tl.int32), 0) > 0:
                j = start + tl.arange(0, MASK_BITS)
                col_valid = j < T
                kt, v = _load_kv_tile(K, V, BT, prefix + j, col_valid, kv, d,
                                      stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                                      BLOCK_SIZE, True)
                # Bits past T are zero, and padded rows loaded word 0: no extra range mask.
                visible = ((word[:, None] >> bit[None, :]) & 1) != 0
                m_i, l_i, acc = _online_softmax_step(q, kt, v, visible, m_i, l_i, acc, qk_scale,
                                                     PRECISION, True)

        has_any = l_i > 0.0
        out = acc / tl.where(has_any, l_i, 1.0)[:, None]
        if NUM_SPLITS == 1:
            o_ptr = OUT + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
            tl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=row_valid[:, None])
        else:
            # Partials [S, T, N_HEADS, (D)]; an empty split writes only lse = -inf (its output
            # is never read by the merge).
            part_row = (split * T + tok) * N_HEADS + head
            lse = tl.where(has_any, m_i + tl.log2(tl.where(has_any, l_i, 1.0)), float("-inf"))
            tl.store(LSE_PART + part_row, lse, mask=row_valid)
            tl.store(OUT_PART + part_row[:, None] * HEAD_DIM + d[None, :], out,
                     mask=(row_valid & has_any)[:, None])

    @triton.jit
    def _merge_splits_kernel(
        OUT_PART, LSE_PART, OUT, T, N_HEADS, stride_ot, stride_oh,
        NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    ):
        """out[t, h] = sum_s 2^(lse_s - max) * out_s / sum_s 2^(lse_s - max)."""
        t = tl.program_id(0)
        h = tl.program_id(1)
        s = tl.arange(0, SPLITS_PAD)
        d = tl.arange(0, HEAD_DIM)
        part_row = (s * T + t) * N_HEADS + h
        lse = tl.load(LSE_PART + part_row, mask=s < NUM_SPLITS, other=float("-inf"))
        live = lse > float("-inf")
        m = tl.max(lse, 0)
        m = tl.where(m == float("-inf"), 0.0, m)
        w = tl.where(live, tl.exp2(lse - m), 0.0)
        o = tl.load(OUT_PART + part_row[:, None] * HEAD_DIM + d[None, :], mask=live[:, None], other=0.0)
        denom = tl.sum(w, 0)
        out = tl.sum(o * w[:, None], 0) / tl.where(denom > 0.0, denom, 1.0)
        tl.store(OUT + t * stride_ot + h * stride_oh + d, out.to(OUT.dtype.element_ty))

    @triton.jit
    def _write_kv_kernel(
        K_POOL, V_POOL, SLOTS, K, V, N_KV,
        stride_ps, stride_ph, stride_kt, stride_kh, stride_vt, stride_vh,
        HEAD_DIM: tl.constexpr, KV_PAD: tl.constexpr,
    ):
        """Row t of k/v -> physical slot SLOTS[t] of both pools, in one launch."""
        t = tl.program_id(0)
        slot = tl.load(SLOTS + t).to(tl.int64)
        h = tl.arange(0, KV_PAD)
        d = tl.arange(0, HEAD_DIM)
        mask = (h < N_KV)[:, None]
        k = tl.load(K + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
        v = tl.load(V + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
        dst = slot * stride_ps + h[:, None] * stride_ph + d[None, :]
        tl.store(K_POOL + dst, k.to(K_POOL.dtype.element_ty), mask=mask)
        tl.store(V_POOL + dst, v.to(V_POOL.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------- wrappers


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8  # interpreter: any small number; only shapes the split heuristic


def _launch_config(t: int, group: int) -> tuple[int, int, int, int]:
    """(BLOCK_M packed rows, BLOCK_N KV positions, num_warps, num_stages) for a call."""
    block_m = min(MAX_BLOCK_M, max(MIN_BLOCK_M, triton.next_power_of_2(t * group)))
    return block_m, BLOCK_N, 4, 2


def choose_num_splits(t: int, n_heads: int, n_kv: int, max_context: int, device: torch.device) -> int:
    """Split the prefix only while the (query tiles x KV heads) grid leaves the GPU underfilled.

    Depends on shapes only (never on prefix_len), so one CUDA graph serves every length.
    Measured on an H200 (Qwen3-8B shape, see NOTES.md): about two programs per SM is best for
    compute-heavy tiles (verify, prefill); decode-sized tiles (<= 16 packed rows) are
    memory-latency bound and want about four. Never more splits than KV tiles the table holds.
    """
    group = n_heads // n_kv
    block_m = _launch_config(t, group)[0]
    programs = triton.cdiv(t * group, block_m) * n_kv
    waves = 4 if t * group <= MIN_BLOCK_M else 2
    want = waves * _num_sms(device) // programs
    return max(1, min(want, triton.cdiv(max_context, BLOCK_N), MAX_SPLITS))


def _prefix_tensor(prefix_len: int | torch.Tensor, device: torch.device) -> torch.Tensor:
    if isinstance(prefix_len, torch.Tensor):
        return prefix_len.reshape(1).to(device=device, dtype=torch.int32)
    # Passing a python int straight to the kernel would specialise on it (==1, %16) and
    # recompile; a 1-element tensor never does.
    return torch.tensor([prefix_len], dtype=torch.int32, device=device)


def paged_tree_attention_triton(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor,
    prefix_len: int | torch.Tensor,
    tree_mask: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton version of `paged_tree_attention_ref` (same arguments and result).

    prefix_len: python int, or a 0-d / 1-element int32 tensor on q's device. Under CUDA-graph
               capture pass the tensor (an int means a host->device copy each call).
    tree_mask: [T, T] bool, or already packed [T, ceil(T/64)] int64 from `pack_tree_mask`.
    num_splits: prefix split-K factor; None picks it from the shapes (`choose_num_splits`).
    out: optional [T, n_heads, head_dim] destination (e.g. a CUDA-graph static buffer).
    """
    if triton is None:
        raise RuntimeError("triton is not installed")
    t, n_heads, head_dim = q.shape
    _, block_size, n_kv, kd = k_pool.shape
    assert kd == head_dim and v_pool.shape == k_pool.shape, "k/v pool shape mismatch"
    assert n_heads % n_kv == 0, "n_heads must be a multiple of n_kv_heads"
    assert head_dim >= 16 and head_dim & (head_dim - 1) == 0, "head_dim must be a power of two >= 16"
    assert k_pool.stride(-1) == 1 and v_pool.stride(-1) == 1, "pools need a contiguous head_dim"
    group = n_heads // n_kv
    if q.stride(-1) != 1:
        q = q.contiguous()
    bits = tree_mask if tree_mask.dtype == torch.int64 else pack_tree_mask(tree_mask)
    bits = bits.contiguous()
    assert bits.shape == (t, (t + MASK_BITS - 1) // MASK_BITS), \
        "tree_mask must be [T, T] bool or packed [T, ceil(T/64)] int64"
    prefix = _prefix_tensor(prefix_len, q.device)
    block_table = block_table.contiguous()

    if out is None:
        out = torch.empty_like(q)
    assert out.shape == q.shape and out.stride(-1) == 1, "out must be [T, n_heads, head_dim]"
    if t == 0:
        return out
    if num_splits is None:
        num_splits = choose_num_splits(t, n_heads, n_kv, block_table.numel() * block_size, q.device)
    block_m, block_n, num_warps, num_stages = _launch_config(t, group)
    if num_splits > 1:
        out_part = torch.empty(num_splits, t, n_heads, head_dim, device=q.device, dtype=torch.float32)
        lse_part = torch.empty(num_splits, t, n_heads, device=q.device, dtype=torch.float32)
    else:
        out_part = lse_part = out  # unused by the kernel when NUM_SPLITS == 1

    grid = (triton.cdiv(t * group, block_m), n_kv, num_splits)
    _tree_attn_kernel[grid](
        q, k_pool, v_pool, block_table, prefix, bits, out, out_part, lse_part,
        t, n_heads, bits.shape[1], scale * LOG2E,
        q.stride(0), q.stride(1),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_N=block_n, NUM_SPLITS=num_splits, MASK_BITS=MASK_BITS,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # tf32 is ignored for bf16/fp16
        num_warps=num_warps, num_stages=num_stages,
    )
    if num_splits > 1:
        _merge_splits_kernel[(t, n_heads)](
            out_part, lse_part, out, t, n_heads, out.stride(0), out.stride(1),
            NUM_SPLITS=num_splits, SPLITS_PAD=triton.next_power_of_2(num_splits), HEAD_DIM=head_dim,
            num_warps=4,
        )
    return out


def paged_tree_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor,
    prefix_len: int | torch.Tensor,
    tree_mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Paged tree attention: Triton on CUDA tensors, the torch reference elsewhere.

    Same contract as `paged_tree_attention_ref`; tree_mask may also be pre-packed (int64).
    """
    if q.is_cuda and triton is not None:
        return paged_tree_attention_triton(q, k_pool, v_pool, block_table, prefix_len, tree_mask, scale)
    if tree_mask.dtype == torch.int64:
        tree_mask = unpack_tree_mask(tree_mask, q.shape[0])
    return paged_tree_attention_ref(q, k_pool, v_pool, block_table, prefix_len, tree_mask, scale)


def write_kv_triton(
    k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Fused `write_kv_ref`: K and V rows ([T, n_kv, head_dim]) to their slots in one launch."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    t, n_kv, head_dim = k.shape
    if t == 0:
        return
    assert head_dim & (head_dim - 1) == 0, "head_dim must be a power of two"
    assert k_pool.stride(0) == k_pool.shape[1] * k_pool.stride(1), "pool blocks must be contiguous"
    assert v_pool.stride() == k_pool.stride() and k_pool.stride(-1) == 1
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    slots = slots.contiguous()
    _write_kv_kernel[(t,)](
        k_pool, v_pool, slots, k, v, n_kv,
        k_pool.stride(1), k_pool.stride(2), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        HEAD_DIM=head_dim, KV_PAD=triton.next_power_of_2(n_kv), num_warps=1,
    )


def write_kv(
    k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Store new K/V rows at physical slots: Triton on CUDA tensors, the torch reference elsewhere."""
    if k.is_cuda and triton is not None:
        write_kv_triton(k_pool, v_pool, slots, k, v)
    else:
        write_kv_ref(k_pool, v_pool, slots, k, v)


__all__ = [
    "choose_num_splits",
    "logical_to_slots",
    "pack_tree_mask",
    "paged_tree_attention",
    "paged_tree_attention_triton",
    "unpack_tree_mask",
    "write_kv",
    "write_kv_triton",
]

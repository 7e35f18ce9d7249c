"""Triton paged tree attention (verify / prefill chunk / AR decode) and a fused KV write.

Semantics are exactly those of `reference.paged_tree_attention_ref`: T new query tokens attend
to the committed prefix (logical 0..prefix_len-1, all visible) and to the new tokens themselves
(logical prefix_len..prefix_len+T-1) under a [T, T] visibility mask.

Batch invariance (issue 13). Each query row's result is bitwise independent of the other rows
of the call, of T and of prefix_len: a tree node verified at depth d computes exactly what the
AR step that produced the same token at the same position computes. So every row reduces over
its keys in *its own logical order*: the prefix, then the new tokens it sees, in index order
(for a tree: its ancestors by depth, i.e. the positions they will have once accepted). Keys are
cut into 64-position tiles aligned at absolute logical positions and into splits of
`split_len` positions (a function of the cache size only), so a row of length L always meets
the same tiles, the same split bounds and the same merge, whatever shares the call.

  grid = (query tiles, KV heads, splits)
  * GQA packing: one program owns one KV head and BLOCK_M (always 64) rows, a row being a
    (token, query head of the group) pair, row = token * GROUP + g. BLOCK_M, BLOCK_N, the warps
    and the dot instruction never change with T: a score or a P@V product of one row is the
    same number whatever the other rows of the tile hold. An AR step (T = 1) runs its own
    binary (`AR`), which takes the one tile reaching past the prefix without the per-row key
    lookup; it loads, masks and steps that tile exactly as the general path would.
  * Tiles wholly inside the prefix are the same keys for every row: one tl.dot serves all rows.
    Tiles that reach past prefix_len hold, for each row, that row's own new-token keys (through
    `visible_keys`): if all rows of the program agree on them (a causal prefill chunk, AR) one
    step serves all; otherwise (tree siblings) the tile is stepped once per token with the other
    rows masked out, which leaves their online-softmax state bit for bit unchanged.
  * Split s covers logical [s*split_len, (s+1)*split_len). A row with one split writes its
    output directly; otherwise each of its splits writes a normalised fp32 partial and its LSE,
    and `_merge_splits_kernel` folds them in split order.
fp32 scores, softmax and accumulation (exp2 with the scale folded in); output in q's dtype.
fp32 inputs use IEEE fp32 dots (no TF32) so fp32 runs stay lossless.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .launch import launch_args, wait_for_previous
from .reference import logical_to_slots, paged_tree_attention_ref, write_kv_ref

try:  # triton is optional: CPU-only installs use the torch references.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None

LOG2E = 1.4426950408889634

# Fixed for every call (batch invariance, see above). 64x64 tiles and 4 warps were best or within
# ~10% of the best in the H200 sweep of the previous kernel (NOTES.md); 8 warps: verify up to 1.6x slower.
BLOCK_M = 64
BLOCK_N = 64
NUM_WARPS = 4
# Pipeline depth (speed only: the same loads and arithmetic). Without a block table the loads of
# tile i + 1 depend on nothing loaded, and 3 stages keep them in flight while tile i is computed
# (H200: verify calls 0-9% faster than 2 stages, 4 stages up to 1.5x slower at 64 tokens); the AR
# binary measured the same with 2 or 3 (PERF_NOTES.md "Session 17").
NUM_STAGES = 3
AR_NUM_STAGES = 2
MIN_SPLIT_LEN = 256
MAX_SUB_T = 64  # tree calls up to this size run the splits past the prefix per token (H200: faster to 64, slower at 128-256)
MAX_SPLITS = 64


class VisibleKeys(NamedTuple):
    """Which new tokens each query row sees, in the row's key order.

    order[t, e] is the e-th new token (by index) that row t sees, for e < count[t]; for a tree in
    topological order that is t's ancestor at depth e (itself at depth count[t] - 1), whose key
    an AR run would hold at logical position prefix_len + e. Entries past count are unused.
    """

    order: torch.Tensor  # [T, T] int32
    count: torch.Tensor  # [T] int32


def visible_keys(tree_mask: torch.Tensor) -> VisibleKeys:
    """[T, T] bool visibility -> `VisibleKeys`. Fixed-shape device ops (no host sync), so it
    can live inside a CUDA graph; the mask is the same for every layer: build it once a forward."""
    t = tree_mask.shape[0]
    seen = tree_mask.to(torch.int32)
    count = seen.sum(1, dtype=torch.int32)
    rank = seen.cumsum(1) - 1
    # Unseen columns all go to a dump column T, cut off below.
    dest = torch.where(tree_mask, rank, t).long()
    cols = torch.arange(t, device=tree_mask.device, dtype=torch.int32).expand(t, t)
    order = torch.zeros(t, t + 1, dtype=torch.int32, device=tree_mask.device).scatter_(1, dest, cols)
    return VisibleKeys(order[:, :t].contiguous(), count)


def split_len_for(capacity: int) -> int:
    """Keys per split for a cache of `capacity` positions: at most MAX_SPLITS splits, each a
    whole number of tiles and at least MIN_SPLIT_LEN. It depends on the cache only, never on a
    call's T or prefix_len, so every row of a given length is split the same way."""
    per = -(-capacity // MAX_SPLITS)
    return max(MIN_SPLIT_LEN, -(-per // BLOCK_N) * BLOCK_N)


# ----------------------------------------------------------------------------- triton kernels

if triton is not None:

    @triton.jit
    def _load_kv_tile(
        K, V, BT, pos, valid, kv, d,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        BLOCK_SIZE: tl.constexpr, MASKED: tl.constexpr, PAGED: tl.constexpr,
    ):
        """Gather K^T [D, BLOCK_N] and V [BLOCK_N, D] at logical positions `pos` of KV head kv.

        MASKED=False (every position valid) keeps the loads unpredicated; masked-off columns
        load as zeros. Either way the values of the valid columns are the same. PAGED=False: the
        pool's blocks are in logical order (no table), so no dependent load of the block number
        stands before each tile's K/V loads.
        """
        if not PAGED:
            blk = pos // BLOCK_SIZE
        elif MASKED:
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
    def _online_softmax_step(q, kt, v, visible, m_i, l_i, acc, qk_scale, PRECISION: tl.constexpr):
        """One flash-attention step in the log2 domain. The one code path for every tile: a
        row's arithmetic is then the same whichever loop the tile came from. A row that sees
        nothing of the tile keeps m, l and acc exactly (alpha = 2^0 = 1, p = 0)."""
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # avoid -inf - -inf = nan
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        return m_new, l_i, acc

    # T is never specialised: one binary for every T > 1, and AR (T = 1, the `AR` constexpr) one
    # of its own whose tiles are stepped as the general binary steps them (same instructions).
    @triton.jit(do_not_specialize=["T"])
    def _tree_attn_kernel(
        Q, K, V, BT, PREFIX, ORDER, COUNT, OUT, OUT_PART, LSE_PART,
        T, N_HEADS, SPLIT_LEN, NUM_SPLITS, qk_scale,
        stride_qt, stride_qh,
        stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh,
        stride_ot, stride_oh,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB: tl.constexpr, AR: tl.constexpr, PAGED: tl.constexpr,
        PRECISION: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_for_previous(PDL)
        pid_m = tl.program_id(0)
        kv = tl.program_id(1)
        pid_s = tl.program_id(2)

        # Packed rows: row = token * GROUP + g, query head = kv * GROUP + g.
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        row_valid = rows < T * GROUP
        tok = rows // GROUP
        head = kv * GROUP + rows % GROUP
        # prefix_len comes from device memory: never specialised, CUDA-graph safe.
        prefix = tl.load(PREFIX).to(tl.int32)
        # Each row's key count; padded rows have none, so they never widen a tile or a loop.
        length = tl.where(row_valid, prefix + tl.load(COUNT + tok, mask=row_valid, other=0), 0)
        # Programs 0..NUM_SPLITS-1 take split pid_s for all rows of the query tile. With SUB > 1
        # (tree-sized calls) they leave the splits that reach past the prefix to the programs
        # after them: one per (such split, token of the tile), so the per-token tiles of a tree
        # run in parallel rather than one after another in one program. Which program owns a
        # row never changes its arithmetic (same steps, tiles and order).
        prefix_tiles_end = prefix // BLOCK_N * BLOCK_N
        tok_first = (pid_m * BLOCK_M) // GROUP
        tok_last = tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // GROUP, T - 1)
        per_token = pid_s >= NUM_SPLITS
        extra = pid_s - NUM_SPLITS
        split = tl.where(per_token, prefix_tiles_end // SPLIT_LEN + extra // SUB, pid_s)
        lo = split * SPLIT_LEN
        hi = tl.minimum(lo + SPLIT_LEN, tl.max(length, 0))
        shared_end = tl.minimum(hi, prefix_tiles_end)
        run = lo < hi
        if SUB > 1:
            run = run & (per_token == (shared_end < hi))
            tok_first = tl.where(per_token, tok_first + extra % SUB, tok_first)
            tok_last = tl.where(per_token, tl.minimum(tok_last, tok_first), tok_last)
        own = row_valid & (tok >= tok_first) & (tok <= tok_last)  # the rows this program stores
        if run & (tok_first <= tok_last):
            d = tl.arange(0, HEAD_DIM)
            q = tl.load(
                Q + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_valid[:, None], other=0.0,
            )
            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
            cols = tl.arange(0, BLOCK_N)

            # Tiles wholly inside the prefix: the same keys for every row (all visible).
            for start in range(lo, shared_end, BLOCK_N):
                pos = start + cols
                kt, v = _load_kv_tile(K, V, BT, pos, pos < hi, kv, d,
                                      stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                                      BLOCK_SIZE, False, PAGED)
                visible = pos[None, :] < length[:, None]
                m_i, l_i, acc = _online_softmax_step(q, kt, v, visible, m_i, l_i, acc, qk_scale, PRECISION)

            if AR:
                # One token (an AR step): the tile reaching past the prefix holds the row's keys at
                # their own positions (its new key is at prefix), so the branch below would load
                # the columns pos < hi and step with `pos < length`: the same loads, mask and step
                # here, without its per-row key lookup (whose [BLOCK_M, BLOCK_N] index tensors
                # spill and cost the AR step more than its tiles).
                for start in range(tl.maximum(lo, shared_end), hi, BLOCK_N):
                    pos = start + cols
                    kt, v = _load_kv_tile(K, V, BT, pos, pos < hi, kv, d,
                                          stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                                          BLOCK_SIZE, True, PAGED)
                    visible = pos[None, :] < length[:, None]
                    m_i, l_i, acc = _online_softmax_step(q, kt, v, visible, m_i, l_i, acc, qk_scale, PRECISION)
            else:
                # Tiles reaching past the prefix: each row's own keys. Logical position p >= prefix
                # is the row's (p - prefix)-th visible new token, stored at prefix + that index.
                for start in range(tl.maximum(lo, shared_end), hi, BLOCK_N):
                    pos = start + cols
                    sees = (pos[None, :] < length[:, None]) & own[:, None]  # [BLOCK_M, BLOCK_N]
                    depth = pos - prefix
                    new = sees & (depth >= 0)[None, :]
                    idx = tl.load(ORDER + tok[:, None] * T + depth[None, :], mask=new, other=0)
                    key_pos = tl.where(new, prefix + idx, pos[None, :])  # where row r's key sits
                    top = tl.max(tl.where(sees, key_pos, -1), 0)
                    bottom = tl.min(tl.where(sees, key_pos, 2147483647), 0)
                    if tl.min(((top == bottom) | (top < 0)).to(tl.int32), 0) == 1:
                        # Every row that sees a column sees the same key there.
                        kt, v = _load_kv_tile(K, V, BT, top, top >= 0, kv, d,
                                              stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                                              BLOCK_SIZE, True, PAGED)
                        m_i, l_i, acc = _online_softmax_step(q, kt, v, sees, m_i, l_i, acc, qk_scale, PRECISION)
                    else:
                        for tau in range(tok_first, tok_last + 1):
                            mine = (tok == tau)[:, None] & sees
                            keys = tl.max(tl.where(mine, key_pos, -1), 0)
                            if tl.max(keys, 0) >= 0:
                                kt, v = _load_kv_tile(K, V, BT, keys, keys >= 0, kv, d,
                                                      stride_kb, stride_ks, stride_kh, stride_vb, stride_vs,
                                                      stride_vh, BLOCK_SIZE, True, PAGED)
                                m_i, l_i, acc = _online_softmax_step(q, kt, v, mine, m_i, l_i, acc, qk_scale,
                                                                     PRECISION)

            has_any = l_i > 0.0
            out = acc / tl.where(has_any, l_i, 1.0)[:, None]
            n_splits = tl.cdiv(length, SPLIT_LEN)
            mine_here = own & (lo < length)
            o_ptr = OUT + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
            tl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=(mine_here & (n_splits == 1))[:, None])
            # Rows of several splits: partials [S, T, N_HEADS, (D)], folded by the merge kernel.
            part_row = (split * T + tok) * N_HEADS + head
            lse = tl.where(has_any, m_i + tl.log2(tl.where(has_any, l_i, 1.0)), float("-inf"))
            several = mine_here & (n_splits > 1)
            tl.store(LSE_PART + part_row, lse, mask=several)
            tl.store(OUT_PART + part_row[:, None] * HEAD_DIM + d[None, :], out, mask=several[:, None])

    @triton.jit(do_not_specialize=["T"])
    def _merge_splits_kernel(
        OUT_PART, LSE_PART, OUT, PREFIX, COUNT, T, N_HEADS, SPLIT_LEN, stride_ot, stride_oh,
        HEAD_DIM: tl.constexpr, PDL: tl.constexpr,
    ):
        """out[t, h] = sum_s 2^(lse_s - max) * out_s / sum_s 2^(lse_s - max) over the row's own
        splits, folded one by one in split order (a row of one split was written directly)."""
        wait_for_previous(PDL)
        t = tl.program_id(0)
        h = tl.program_id(1)
        n = tl.cdiv(tl.load(PREFIX).to(tl.int32) + tl.load(COUNT + t), SPLIT_LEN)
        if n > 1:
            d = tl.arange(0, HEAD_DIM)
            m = float("-inf")
            for s in range(0, n):
                m = tl.maximum(m, tl.load(LSE_PART + (s * T + t) * N_HEADS + h))
            m = tl.where(m == float("-inf"), 0.0, m)
            denom = 0.0
            acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
            for s in range(0, n):
                row = (s * T + t) * N_HEADS + h
                lse = tl.load(LSE_PART + row)
                if lse > float("-inf"):
                    w = tl.exp2(lse - m)
                    denom += w
                    acc += w * tl.load(OUT_PART + row * HEAD_DIM + d)
            out = acc / tl.where(denom > 0.0, denom, 1.0)
            tl.store(OUT + t * stride_ot + h * stride_oh + d, out.to(OUT.dtype.element_ty))

    @triton.jit
    def _write_kv_kernel(
        K_POOL, V_POOL, SLOTS, K, V, N_KV,
        stride_ps, stride_ph, stride_kt, stride_kh, stride_vt, stride_vh,
        HEAD_DIM: tl.constexpr, KV_PAD: tl.constexpr, PDL: tl.constexpr,
    ):
        """Row t of k/v -> physical slot SLOTS[t] of both pools, in one launch."""
        wait_for_previous(PDL)
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


def prefix_tensor(prefix_len: int | torch.Tensor, device: torch.device) -> torch.Tensor:
    """The committed length as the kernel reads it: a 1-element int32 tensor on `device` (a view,
    no copy, when it already is one). A forward converts once and hands the result to every
    layer: converting an int64 device length per call was a cast kernel a layer."""
    if isinstance(prefix_len, torch.Tensor):
        return prefix_len.reshape(1).to(device=device, dtype=torch.int32)
    # Passing a python int straight to the kernel would specialise on it (==1, %16) and
    # recompile; a 1-element tensor never does.
    return torch.tensor([prefix_len], dtype=torch.int32, device=device)


def paged_tree_attention_triton(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor | None,
    prefix_len: int | torch.Tensor,
    tree_mask: torch.Tensor | VisibleKeys,
    scale: float,
    split_len: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton version of `paged_tree_attention_ref` (same arguments and result), batch-invariant.

    block_table: logical -> physical block ([blocks] int32), or None: the pool's blocks are in
               logical order (the engine's caches), and no tile waits on a load of its block number.
    prefix_len: python int, or a 0-d / 1-element int32 tensor on q's device. Under CUDA-graph
               capture pass the tensor (an int means a host->device copy each call).
    tree_mask: [T, T] bool, or its `visible_keys` (build once, pass to every layer).
    split_len: keys per split (a multiple of 64); None derives it from the cache's size
               (`split_len_for`). Calls whose results must agree need the same split_len.
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
    assert group <= BLOCK_M, f"GQA groups above {BLOCK_M} heads are not supported"
    if q.stride(-1) != 1:
        q = q.contiguous()
    keys = tree_mask if isinstance(tree_mask, VisibleKeys) else visible_keys(tree_mask)
    assert keys.order.shape == (t, t) and keys.count.shape == (t,), "tree_mask must be [T, T]"
    prefix = prefix_tensor(prefix_len, q.device)
    if block_table is not None:
        block_table = block_table.contiguous()
    capacity = (k_pool.shape[0] if block_table is None else block_table.numel()) * block_size
    if split_len is None:
        split_len = split_len_for(capacity)
    assert split_len % BLOCK_N == 0, "split_len must be a multiple of 64"

    if out is None:
        out = torch.empty_like(q)
    assert out.shape == q.shape and out.stride(-1) == 1, "out must be [T, n_heads, head_dim]"
    if t == 0:
        return out
    # Grid and partials cover the longest row the cache can hold (shapes only: graph-safe);
    # programs past a row's length return at once.
    num_splits = -(-capacity // split_len)
    out_part = torch.empty(num_splits, t, n_heads, head_dim, device=q.device, dtype=torch.float32)
    lse_part = torch.empty(num_splits, t, n_heads, device=q.device, dtype=torch.float32)
    # Tree-sized calls: per-token programs for the splits past the prefix (keys from the last
    # prefix tile to prefix + T span at most T + 63 positions); a tile touches at most
    # BLOCK_M / group + 1 tokens. Prefill chunks (T > MAX_SUB_T) and AR keep one program a split.
    sub = -(-BLOCK_M // group) + 1 if 1 < t <= MAX_SUB_T else 1
    per_token = (-(-(t + BLOCK_N - 1) // split_len) + 1) * sub if sub > 1 else 0
    grid = (triton.cdiv(t * group, BLOCK_M), n_kv, num_splits + per_token)
    _tree_attn_kernel[grid](
        q, k_pool, v_pool, prefix if block_table is None else block_table,  # an unread stand-in
        prefix, keys.order, keys.count, out, out_part, lse_part,
        t, n_heads, split_len, num_splits, scale * LOG2E,
        q.stride(0), q.stride(1),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, SUB=sub, AR=t == 1, PAGED=block_table is not None,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # tf32 is ignored for bf16/fp16
        num_warps=NUM_WARPS, num_stages=AR_NUM_STAGES if t == 1 else NUM_STAGES, **launch_args(q.device, t),
    )
    if num_splits > 1:
        _merge_splits_kernel[(t, n_heads)](
            out_part, lse_part, out, prefix, keys.count, t, n_heads, split_len,
            out.stride(0), out.stride(1), HEAD_DIM=head_dim, num_warps=1, **launch_args(q.device, t),
        )
    return out


def paged_tree_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor | None,
    prefix_len: int | torch.Tensor,
    tree_mask: torch.Tensor,
    scale: float,
    keys: VisibleKeys | None = None,
) -> torch.Tensor:
    """Paged tree attention: Triton on CUDA tensors, the torch reference elsewhere.

    Same contract as `paged_tree_attention_ref`; `keys` (`visible_keys(tree_mask)`, built once
    a forward) spares each layer rebuilding it on the GPU.
    """
    if q.is_cuda and triton is not None:
        return paged_tree_attention_triton(q, k_pool, v_pool, block_table, prefix_len,
                                           keys if keys is not None else tree_mask, scale)
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
        HEAD_DIM=head_dim, KV_PAD=triton.next_power_of_2(n_kv), num_warps=1, **launch_args(k.device, t),
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
    "VisibleKeys",
    "logical_to_slots",
    "paged_tree_attention",
    "prefix_tensor",
    "paged_tree_attention_triton",
    "split_len_for",
    "visible_keys",
    "write_kv",
    "write_kv_triton",
]

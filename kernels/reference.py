"""Plain-torch references for the kernels. They are the oracle for the Triton kernels and
the attention the engine uses on the CPU.

Paged KV layout (shared by every kernel and the engine):
  k_pool, v_pool: [num_blocks, block_size, n_kv_heads, head_dim] (one pair per layer)
  block_table:    [max_blocks] int32, logical block -> physical block; None: blocks in logical order
  logical position p lives at physical slot block_table[p // block_size] * block_size + p % block_size
"""
from __future__ import annotations

import torch


def logical_to_slots(block_table: torch.Tensor | None, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Physical slot of each logical KV position (block_table None: blocks in logical order)."""
    if block_table is None:
        return positions.long()
    return block_table[positions // block_size].long() * block_size + positions % block_size


def write_kv_ref(
    k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Store k, v ([T, n_kv_heads, head_dim]) at the given physical slots."""
    k_pool.view(-1, *k_pool.shape[2:])[slots] = k.to(k_pool.dtype)
    v_pool.view(-1, *v_pool.shape[2:])[slots] = v.to(v_pool.dtype)


def paged_tree_attention_ref(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor | None,
    prefix_len: int | torch.Tensor,
    tree_mask: torch.Tensor,
    scale: float,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of T new tokens over a committed prefix plus themselves.

    q:         [T, n_heads, head_dim]
    prefix_len: committed tokens (logical positions 0..prefix_len-1), visible to every query
    tree_mask: [T, T] bool; query i sees new token j iff tree_mask[i, j] (ancestor-or-self for a
               draft tree, lower-triangular for a prefill chunk). The new tokens' K/V must already
               be written at logical positions prefix_len .. prefix_len + T - 1.
    window:    sliding window (0: none): a query at logical position p sees only keys at logical
               positions > p - window. Positions are logical: prefix key j sits at j, new token j at
               prefix_len + depth(j) (depth = its visible new tokens - 1), the position it has once
               accepted, so a tree node's window covers exactly what its AR step's would.
    sinks:     [n_heads] learned logits (gpt-oss): one more term exp(sink) in each softmax
               denominator, attached to no value.
    returns    [T, n_heads, head_dim] in q's dtype; softmax in fp32.
    """
    prefix_len = int(prefix_len)
    t, n_heads, head_dim = q.shape
    block_size, n_kv = k_pool.shape[1], k_pool.shape[2]
    total = prefix_len + t
    slots = logical_to_slots(block_table, torch.arange(total, device=q.device), block_size)
    k = k_pool.view(-1, n_kv, head_dim)[slots].float()  # [L, n_kv, d]
    v = v_pool.view(-1, n_kv, head_dim)[slots].float()
    group = n_heads // n_kv
    k = k.repeat_interleave(group, dim=1)  # [L, n_heads, d]
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,lhd->htl", q.float(), k) * scale  # [H, T, L]
    visible = torch.ones(t, total, dtype=torch.bool, device=q.device)
    visible[:, prefix_len:] = tree_mask
    if window > 0:
        depth = tree_mask.sum(dim=1) - 1
        key_pos = torch.cat([torch.arange(prefix_len, device=q.device), prefix_len + depth])
        visible &= key_pos[None, :] > (prefix_len + depth)[:, None] - window
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:  # softmax over [scores, sink], the sink's column dropped after
        sink = sinks.float()[:, None, None].expand(n_heads, t, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("htl,lhd->thd", probs, v)
    return out.to(q.dtype)


# ----------------------------------------------------------------------------- fused elementwise
# References for kernels/fused.py. Each one is the engine's eager code (engine/layers.py)
# verbatim, so swapping a dispatcher in changes nothing on the CPU.


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """engine.layers.RMSNorm.forward (transformers' arithmetic): normalize in fp32, round to
    x's dtype, then scale by weight (result in promote(x, weight) dtype). x: [..., H]."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm: returns (rms_norm(residual + x), residual + x).

    The engine's `h = h + o; y = norm(h)` with h = residual, o = x.
    """
    h = residual + x
    return rms_norm_ref(h, weight, eps), h


def silu_mul_ref(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The MLP's activation: F.silu(gate) * up (silu rounded to gate's dtype first)."""
    return torch.nn.functional.silu(gate) * up


def rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """engine.layers.Rotary.apply: half-split RoPE, x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def rope_cos_sin_ref(
    positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's (cos, sin) at `positions` [T] (integers), each [T, 1, D] in `dtype`, D = 2 *
    len(inv_freq) (half-split layout: the frequencies twice): the fp32 angle position *
    inv_freq, its cos and sin in fp32, times attention_factor (YaRN) unless that is 1.0, then
    one rounding to dtype. transformers' formula, step for step."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos.to(dtype)[:, None, :], sin.to(dtype)[:, None, :]


def qk_norm_rope_ref(
    q: torch.Tensor | None,
    k: torch.Tensor | None,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Per-head RMSNorm (Qwen3's q_norm / k_norm; skipped where the weight is None) then RoPE.

    q: [T, Hq, D], k: [T, Hk, D] (either may be None: its output is None).
    cos, sin: [T, D] or [T, 1, D] (Rotary.cos_sin's layout) in q's dtype.
    Returns (q_out, k_out) with the shapes of q and k.
    """
    if cos.dim() == 2:
        cos, sin = cos[:, None, :], sin[:, None, :]
    out = []
    for x, w in ((q, q_norm_weight), (k, k_norm_weight)):
        if x is None:
            out.append(None)
            continue
        if w is not None:
            x = rms_norm_ref(x, w, eps)
        out.append(rope_ref(x, cos, sin))
    return out[0], out[1]


def qkv_rope_write_ref(
    qkv: torch.Tensor,
    n_heads: int,
    n_kv: int,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """A fused qkv projection's output [T, (Hq + 2 Hk) * D] -> q [T, Hq, D] (normed, RoPE'd);
    k (normed, RoPE'd) and v written to the pools at `slots`: `qk_norm_rope_ref` + `write_kv_ref`."""
    t = qkv.shape[0]
    d = qkv.shape[1] // (n_heads + 2 * n_kv)
    q, k, v = qkv.split([n_heads * d, n_kv * d, n_kv * d], dim=-1)
    q, k = qk_norm_rope_ref(q.view(t, n_heads, d), k.view(t, n_kv, d), q_norm_weight, k_norm_weight, cos, sin, eps)
    write_kv_ref(k_pool, v_pool, slots, k, v.view(t, n_kv, d))
    return q


def ancestor_mask_ref(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """[N, N] bool, [i, j] iff j is i or an ancestor of i, from parent pointers (-1 for a root)
    of a forest at most max_depth deep. Pointer doubling: ceil(log2(max_depth + 1)) rounds of a
    few ops with fixed shapes (no host values: safe in a CUDA graph)."""
    n = parents.shape[0]
    idx = torch.arange(n, device=parents.device)
    jump = torch.where(parents >= 0, parents, idx)  # roots point at themselves: walks stop there
    hops = idx[:, None]  # hops[:, t] = the t-th ancestor (or the root), t < hops.shape[1]
    while hops.shape[1] < max_depth + 1:
        hops = torch.cat([hops, jump[hops]], dim=1)  # jump = 2^r-th ancestor: doubles the columns
        if hops.shape[1] < max_depth + 1:
            jump = jump[jump]
    mask = torch.zeros(n, n, dtype=torch.bool, device=parents.device)
    return mask.scatter_(1, hops, True)


def visible_keys_ref(tree_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, T] bool visibility -> (order [T, T] int32, count [T] int32): order[t, :count[t]] are
    the columns row t sees, ascending; the entries past count[t] are 0. Fixed-shape device ops
    (no host sync): safe in a CUDA graph."""
    t = tree_mask.shape[0]
    seen = tree_mask.to(torch.int32)
    count = seen.sum(1, dtype=torch.int32)
    rank = seen.cumsum(1) - 1
    # Unseen columns all go to a dump column T, cut off below.
    dest = torch.where(tree_mask, rank, t).long()
    cols = torch.arange(t, device=tree_mask.device, dtype=torch.int32).expand(t, t)
    order = torch.zeros(t, t + 1, dtype=torch.int32, device=tree_mask.device).scatter_(1, dest, cols)
    return order[:, :t].contiguous(), count


def top_log_probs_ref(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k tokens of highest logit in each row of `logits` [D, V] (any float dtype), in
    descending order with ties broken by the lower id, and their fp32 log-softmax values:
    ([D, k] fp32, [D, k] int64). The log-softmax is monotone in the logit, so these are the k
    largest log-probs (where distinct logits round to one log-prob, the higher logit first)."""
    x = logits.float()
    ids = x.sort(dim=-1, descending=True, stable=True).indices[:, :k]
    return torch.log_softmax(x, dim=-1).gather(1, ids), ids


def accum_tree_ref(
    top_lp: torch.Tensor, top_tok: torch.Tensor, root: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The best-first draft tree of n nodes: the root plus the n-1 best nodes by cumulative
    log-prob, where a node at depth d extends its parent with one of depth d's top-K tokens.

    top_lp [D, K] fp32 (each row sorted descending, as topk returns it), top_tok [D, K] int64,
    root a 0-d int64 tensor, 2 <= n <= 1 + sum_d min(K^d, n-1) (static_tree_size).
    Returns tokens, parents (-1 at the root), depths, scores (fp32, 0 at the root): [n] each,
    and the [n, n] ancestor-or-self mask. Node 0 is the root; nodes follow in the order below,
    which is best-first and topological.

    Canonical order, reproduced bit for bit by the Triton kernel (kernels/tree_build.py):
    - Frontier of depth d (M = n-1 entries): the first M of depth d's candidate grid, where
      candidate (i, k) extends slot i of depth d-1's frontier with rank k, scores
      prev[i] + lp[d, k] in fp32 (a plain left-to-right sum along the path), in the order
      (score descending, i*K + k ascending), i.e. a stable sort. Depth 1's single parent is the
      root: its frontier is top_lp[0] in rank order.
    - Tree: the first n-1 of all frontier entries in the order (score descending, depth
      ascending, slot ascending) (a stable sort of the [D, M] grid). A child never scores above
      its parent and comes at a greater depth, so every parent precedes its children: the set is
      prefix-closed and the order topological.
    - Where fewer than M candidates exist (K^d < M), the frontier is padded with -inf entries
      (in the same order, as if the root had M-1 more slots at -inf). They are valid nodes but
      are only chosen if log-probs within the top-K are -inf.
    A candidate (i, k) is preceded by the (i+1)(k+1)-1 candidates (i' <= i, k' <= k), so only
    those with (i+1)(k+1) <= M can reach a frontier (the kernel enumerates just those).
    """
    depth, k = top_lp.shape
    m = n - 1
    device = top_lp.device
    # Depth 1: grid entry j is (slot j // K, rank j % K); slots past 0 are the -inf padding.
    front = top_lp[0, :m] if k >= m else torch.nn.functional.pad(top_lp[0], (0, m - k), value=float("-inf"))
    fronts, picks = [front], [torch.arange(m, device=device)]
    for d in range(1, depth):
        cand = (front[:, None] + top_lp[d][None, :]).reshape(-1)  # flat index = slot * K + rank
        front, pick = cand.sort(descending=True, stable=True)
        front, pick = front[:m], pick[:m]
        fronts.append(front)
        picks.append(pick)
    grid_scores, grid_picks = torch.stack(fronts), torch.stack(picks)  # [D, M]
    scores, order = grid_scores.reshape(-1).sort(descending=True, stable=True)
    chosen = order[:m]
    # Node index of every grid entry (1-based, best-first), then of every entry's parent
    # (row 0's parent is the root, node 0).
    node_of = torch.empty_like(order).scatter_(0, order, torch.arange(1, order.numel() + 1, device=device))
    node_of = torch.cat([torch.zeros(1, m, dtype=order.dtype, device=device), node_of.view(depth, m)[:-1]])
    parent_grid = node_of.gather(1, grid_picks // k)
    token_grid = top_tok.gather(1, grid_picks % k)
    parents = torch.cat([torch.full((1,), -1, dtype=torch.long, device=device), parent_grid.view(-1)[chosen]])
    tokens = torch.cat([root.reshape(1).long(), token_grid.view(-1)[chosen]])
    depths = torch.cat([torch.zeros(1, dtype=torch.long, device=device), chosen // m + 1])
    scores = torch.cat([torch.zeros(1, dtype=scores.dtype, device=device), scores[:m]])
    return tokens, parents, depths, scores, ancestor_mask_ref(parents, depth)


# ----------------------------------------------------------------------------- mixture of experts
# References for kernels/moe.py: transformers' Qwen3MoeSparseMoeBlock (transformers 5), step by step.


def moe_route_ref(
    x: torch.Tensor, router_weight: torch.Tensor, top_k: int, norm_topk_prob: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3MoeTopKRouter: logits in x's dtype, softmax in fp32, the top_k experts (renormalised
    to sum 1 if norm_topk_prob), weights rounded back to x's dtype.
    Returns (weights [T, top_k] in x's dtype, expert ids [T, top_k] int64), best first."""
    logits = torch.nn.functional.linear(x, router_weight)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype), ids


def moe_block_ref(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    norm_topk_prob: bool,
) -> torch.Tensor:
    """A sparse MoE block on tokens x [T, H] (Qwen3MoeExperts.forward's arithmetic and order).

    router_weight [E, H]; gate_up [E, 2I, H] (gate rows then up rows); down [E, H, I].
    Rows are grouped by expert (ascending expert id, tokens in order within one), each group runs
    gate/up, SiLU * up and down, is scaled by its routing weight and added into the output
    (index_add_, in x's dtype). Reads the routing on the host: the CPU path, not a graph's.
    """
    weights, ids = moe_route_ref(x, router_weight, top_k, norm_topk_prob)
    return moe_experts_ref(x, gate_up, down, weights, ids)


def moe_experts_ref(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """moe_block_ref after the routing: tokens x [T, H] through their experts ids [T, k] (weights [T, k])."""
    out = torch.zeros_like(x)
    for e in ids.unique().tolist():  # sorted ascending, as transformers' expert_hit
        token, slot = torch.where(ids == e)
        gate, up = torch.nn.functional.linear(x[token], gate_up[e]).chunk(2, dim=-1)
        h = torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, down[e])
        out.index_add_(0, token, (h * weights[token, slot, None]).to(out.dtype))
    return out


# gpt-oss's MoE (transformers 5's GptOssTopKRouter / GptOssExperts), step by step.


def moe_route_gpt_oss_ref(
    x: torch.Tensor, router_weight: torch.Tensor, router_bias: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits with a bias, the top_k of them, softmax over those k only (in x's dtype).
    Returns (weights [T, top_k], expert ids [T, top_k] int64), best first."""
    logits = torch.nn.functional.linear(x, router_weight, router_bias)
    top, ids = torch.topk(logits, top_k, dim=-1)
    return torch.softmax(top, dim=1, dtype=top.dtype), ids


def clamped_swiglu_ref(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's activation on an interleaved gate/up row (gate at even, up at odd columns):
    gate clamped above at limit, up clamped to [-limit, limit], (up + 1) * gate * sigmoid(alpha * gate)."""
    gate = gate_up[..., ::2].clamp(max=limit)
    up = gate_up[..., 1::2].clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def moe_block_gpt_oss_ref(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    router_bias: torch.Tensor,
    gate_up: torch.Tensor,
    gate_up_bias: torch.Tensor,
    down: torch.Tensor,
    down_bias: torch.Tensor,
    top_k: int,
    alpha: float,
    limit: float,
) -> torch.Tensor:
    """gpt-oss's sparse MoE block on tokens x [T, H], in transformers' layout and order:
    router [E, H] + [E]; gate_up [E, H, 2I] (gate and up columns interleaved) + [E, 2I];
    down [E, I, H] + [E, H]. Experts in ascending id, each group's weighted output index_add_-ed."""
    weights, ids = moe_route_gpt_oss_ref(x, router_weight, router_bias, top_k)
    out = torch.zeros_like(x)
    for e in ids.unique().tolist():
        token, slot = torch.where(ids == e)
        h = clamped_swiglu_ref(x[token] @ gate_up[e] + gate_up_bias[e], alpha, limit)
        h = h @ down[e] + down_bias[e]
        out.index_add_(0, token, (h * weights[token, slot, None]).to(out.dtype))
    return out


# Gemma 4's MLPs (transformers 5's Gemma4TextMLP / Gemma4TextRouter / Gemma4TextExperts), step by step.


def gelu_tanh_mul_ref(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Gemma's activation: gelu (tanh approximation) of gate, times up."""
    return torch.nn.functional.gelu(gate, approximate="tanh") * up


def rms_normalize_ref(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without a weight (Gemma 4's v_norm and router norm): normalized in fp32, x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def moe_route_gemma4_ref(
    x: torch.Tensor, scale: torch.Tensor, proj: torch.Tensor, per_expert_scale: torch.Tensor, top_k: int, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gemma 4's router on the residual stream x [T, H]: x normalized (no weight), times `scale`
    and H^-0.5, projected to E logits; softmax in fp32 over all E, the top_k kept and renormalised,
    each times its expert's `per_expert_scale`. Returns (weights [T, top_k], expert ids [T, top_k])."""
    h = rms_normalize_ref(x, eps) * scale * x.shape[-1] ** -0.5
    probs = torch.softmax(torch.nn.functional.linear(h, proj), dim=-1, dtype=torch.float32)
    top, ids = torch.topk(probs, top_k, dim=-1)
    top = top / top.sum(dim=-1, keepdim=True)
    return top * per_expert_scale[ids], ids


def moe_block_gemma4_ref(
    x: torch.Tensor,
    residual: torch.Tensor,
    scale: torch.Tensor,
    proj: torch.Tensor,
    per_expert_scale: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    eps: float,
) -> torch.Tensor:
    """Gemma 4's sparse experts on tokens x [T, H] (the pre-normed input), routed on `residual`
    [T, H] (the stream before the norm): gate_up [E, 2I, H] (gate rows, then up rows), down
    [E, H, I], gelu-tanh. Experts in ascending id, each group's weighted output index_add_-ed."""
    weights, ids = moe_route_gemma4_ref(residual, scale, proj, per_expert_scale, top_k, eps)
    out = torch.zeros_like(x)
    inter = down.shape[-1]
    for e in ids.unique().tolist():
        token, slot = torch.where(ids == e)
        gu = torch.nn.functional.linear(x[token], gate_up[e])
        h = torch.nn.functional.linear(gelu_tanh_mul_ref(gu[:, :inter], gu[:, inter:]), down[e])
        out.index_add_(0, token, (h * weights[token, slot, None]).to(out.dtype))
    return out


# ----------------------------------------------------------------------------- Gated DeltaNet


def delta_step_ref(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                   beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the gated delta rule, fp32. state [H, dk, dv]; q, k [H, dk] (normed, q
    scaled); v [H, dv]; g, beta [H]. Returns (new state, output Sᵀq [H, dv])."""
    state = state * g.exp()[:, None, None]
    kv_mem = (state * k[:, :, None]).sum(dim=1)
    delta = (v - kv_mem) * beta[:, None]
    state = state + k[:, :, None] * delta[:, None, :]
    return state, (state * q[:, :, None]).sum(dim=1)


def gated_delta_inputs_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, v_heads: int):
    """The per-token operands of the recurrence from the conv's outputs: q, k [T, k_heads, dk]
    L2-normed (q also / sqrt(dk)) in fp32 and repeated over the value heads (head h reads key
    head h // (v_heads // k_heads)); v [T, v_heads, dv] in fp32."""
    rep = v_heads // q.shape[1]
    q = q.float().repeat_interleave(rep, dim=1)
    k = k.float().repeat_interleave(rep, dim=1)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    return q / (q.shape[-1] ** 0.5), k, v.float()


def gated_delta_tree_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                         ancestors: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """The recurrent tree walk: T nodes in topological order (every ancestor before its node)
    after the committed `state` [H, dk, dv] fp32; node i's state is its parent's (the committed
    one for a root) updated by its own token. q, k [T, k_heads, dk], v [T, H, dv] as the conv
    gives them; g, beta [T, H] fp32; ancestors [T, T] bool ancestor-or-self. Returns the outputs
    [T, H, dv] fp32. Holds a node's state only until its last child is done."""
    q, k, v = gated_delta_inputs_ref(q, k, v, state.shape[0])
    t = q.shape[0]
    strict = ancestors.bool() & ~torch.eye(t, dtype=torch.bool, device=ancestors.device)
    depth = strict.sum(dim=1)
    score = torch.where(strict, depth[None, :] + 1, 0)
    parents = torch.where(strict.any(dim=1), score.argmax(dim=1), -1).tolist()
    children = [0] * t
    for p in parents:
        if p >= 0:
            children[p] += 1
    out = torch.empty(t, *v.shape[1:], dtype=torch.float32, device=v.device)
    states: dict[int, torch.Tensor] = {}
    for i, p in enumerate(parents):
        before = state if p < 0 else states[p]
        if p >= 0:
            children[p] -= 1
            if children[p] == 0:
                del states[p]
        s, out[i] = delta_step_ref(before, q[i], k[i], v[i], g[i], beta[i])
        if children[i]:
            states[i] = s
    return out


def gated_delta_path_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                         path: torch.Tensor, count, state_in: torch.Tensor, state_out: torch.Tensor) -> None:
    """The commit: state_out = state_in updated by the tokens of nodes path[:count] in order
    (root first; count an int or a 0-d tensor). Operands as for gated_delta_tree_ref."""
    q, k, v = gated_delta_inputs_ref(q, k, v, state_in.shape[0])
    s = state_in
    for j in path[: int(count)].tolist():
        s, _ = delta_step_ref(s, q[j], k[j], v[j], g[j], beta[j])
    state_out.copy_(s)


# ----------------------------------------------------------------------------- sampling


def row_mass_ref(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """sum(exp(x - m)) of each row of x [N, V] fp32, the fp32 weights summed in float64; m [N]
    fp32 (the row maxima). [N, 1] float64."""
    return (x - m[:, None]).exp().sum(-1, keepdim=True, dtype=torch.float64)


def softmax64_ref(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim with the normaliser summed in float64 ([N, V] fp32 -> float64):
    what the nucleus's cumulative masses are compared in."""
    m = x.amax(-1)
    return (x - m[:, None]).exp().double() / row_mass_ref(x, m)


def nucleus_mask_ref(x: torch.Tensor, top_p: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-p by the sorted definition: (softmax64_ref(x), kept [N, V] bool). Tokens in stable
    descending order of x (ties: the lower index first); a token is kept while the probability
    mass before it is below top_p, so the top token always stays. top_p >= 1 keeps every token."""
    probs = softmax64_ref(x)
    if not isinstance(top_p, torch.Tensor) and top_p >= 1.0:
        return probs, torch.ones_like(x, dtype=torch.bool)
    order = x.sort(dim=-1, descending=True, stable=True).indices
    p = probs.gather(-1, order)
    keep_sorted = p.cumsum(-1) - p < top_p
    return probs, torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def inverse_cdf_ref(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One index per row of `weights` ([N, V] >= 0, float64): the first whose cumulative weight
    (in index order) exceeds u * total, u [N] uniform in [0, 1); never past the last positive
    weight (u * total may round up to the total). [N] int64."""
    cdf = weights.cumsum(-1)
    j = (cdf <= u[:, None] * cdf[:, -1:]).sum(-1)
    return torch.minimum(j, cdf.argmax(-1))  # argmax: the first index that reaches the total


def nucleus_sample_ref(x: torch.Tensor, top_p: float | torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of x [N, V] (fp32 logits, already divided by the temperature)
    from the top-p nucleus (nucleus_mask_ref) renormalised, by inverse CDF in index order with
    u [N]: (tokens [N] int64, kept token count [N] int32)."""
    probs, kept = nucleus_mask_ref(x, top_p)
    return inverse_cdf_ref(torch.where(kept, probs, 0.0), u), kept.sum(-1, dtype=torch.int32)

"""Triton kernels against their torch references.

On a CPU-only machine the Triton kernels run under TRITON_INTERPRET=1 (set by conftest.py), so
shapes here stay small; the big bf16 shapes and CUDA-graph checks run only on a GPU.
"""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from jetspec_chat.kernels import (  # after the importorskip
    logical_to_slots,
    paged_tree_attention,
    paged_tree_attention_ref,
    paged_tree_attention_triton,
    visible_keys,
    write_kv_ref,
    write_kv_triton,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
# fp32 512-wide tiles need 384 KB of shared memory: the interpreter runs them (the exact oracle),
# the GPU runs 512 in bf16 (test_bf16_gemma4_heads_rows_equal_their_ar_step).
fp32_512_interpreted = pytest.mark.skipif(torch.cuda.is_available(), reason="fp32 at 512 runs under the interpreter")


# ----------------------------------------------------------------------------- input builders


def random_tree_mask(t: int, gen: torch.Generator) -> torch.Tensor:
    """Random tree in topological order (parent[i] < i); mask = ancestor-or-self."""
    mask = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):
        mask[i, i] = True
        if i > 0:
            parent = int(torch.randint(0, i, (), generator=gen))
            mask[i] |= mask[parent]
    return mask


def causal_mask(t: int) -> torch.Tensor:
    return torch.ones(t, t, dtype=torch.bool).tril()


def make_inputs(t, prefix_len, n_heads, n_kv, head_dim, *, seed=0, dtype=torch.float32,
                block_size=16, mask="tree", device=DEVICE):
    """Random q and paged pools with a shuffled block table.

    Slots outside the visible range (spare blocks, the tail of the last block) hold NaN, so a
    kernel that reads them, even masked to zero weight, produces NaN and fails.
    """
    gen = torch.Generator().manual_seed(seed)
    total = prefix_len + t
    used_blocks = -(-total // block_size)
    num_blocks = used_blocks + 3  # spare physical blocks that must never be read
    k_pool = torch.randn(num_blocks, block_size, n_kv, head_dim, generator=gen)
    v_pool = torch.randn(num_blocks, block_size, n_kv, head_dim, generator=gen)
    # Table longer than needed (as in the engine); physical blocks in random order.
    block_table = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    visible = logical_to_slots(block_table, torch.arange(total), block_size)
    poison = torch.ones(num_blocks * block_size, dtype=torch.bool)
    poison[visible] = False
    k_pool.view(-1, n_kv, head_dim)[poison] = float("nan")
    v_pool.view(-1, n_kv, head_dim)[poison] = float("nan")
    q = torch.randn(t, n_heads, head_dim, generator=gen)
    tree_mask = random_tree_mask(t, gen) if mask == "tree" else causal_mask(t)
    return (q.to(device, dtype), k_pool.to(device, dtype), v_pool.to(device, dtype),
            block_table.to(device), tree_mask.to(device))


def check(t, prefix_len, n_heads, n_kv, head_dim, *, mask="tree", split_len=None, seed=0,
          dtype=torch.float32, block_size=16, rtol=1e-4, atol=1e-5, window=0, sinks=None):
    q, k_pool, v_pool, block_table, tree_mask = make_inputs(
        t, prefix_len, n_heads, n_kv, head_dim, seed=seed, dtype=dtype, block_size=block_size, mask=mask)
    scale = head_dim ** -0.5
    # Causal masks go in as the engine's prefill passes them: rows that share their keys.
    keys = visible_keys(tree_mask, shared=mask == "causal")
    out = paged_tree_attention_triton(q, k_pool, v_pool, block_table, prefix_len, keys, scale,
                                      split_len=split_len, window=window, sinks=sinks)
    ref = paged_tree_attention_ref(q, k_pool, v_pool, block_table, prefix_len, tree_mask, scale, window, sinks)
    assert out.dtype == q.dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), ref.float(), rtol=rtol, atol=atol)
    return out


# ----------------------------------------------------------------------------- visible keys


@pytest.mark.parametrize("t", [1, 5, 64, 130])
def test_visible_keys_lists_each_rows_columns_in_order(t):
    gen = torch.Generator().manual_seed(t)
    mask = torch.rand(t, t, generator=gen) < 0.4
    keys = visible_keys(mask)
    assert keys.order.dtype == torch.int32 and keys.order.shape == (t, t)
    for i in range(t):
        cols = mask[i].nonzero().flatten().tolist()
        assert int(keys.count[i]) == len(cols)
        assert keys.order[i, : len(cols)].tolist() == cols


def test_visible_keys_of_a_tree_are_ancestors_by_depth():
    gen = torch.Generator().manual_seed(3)
    mask = random_tree_mask(40, gen)
    keys = visible_keys(mask)
    for i in range(40):
        anc = keys.order[i, : int(keys.count[i])].tolist()
        assert anc[-1] == i and all(mask[b, a] for a, b in zip(anc, anc[1:]))  # each one a parent's child


# ----------------------------------------------------------------------------- attention (fp32)

# (T, prefix_len, n_heads, n_kv, head_dim, mask): every T, prefix, GQA shape and head_dim of the
# brief appears, without the full product (the interpreter is slow).
CASES = [
    (1, 0, 4, 2, 16, "tree"),       # AR decode, empty prefix
    (1, 1, 8, 1, 16, "tree"),
    (1, 17, 4, 4, 64, "tree"),
    (1, 1000, 8, 1, 64, "tree"),    # long decode: split-K by default
    (1, 2200, 4, 2, 16, "tree"),    # more tiles than AR programs: each program takes several
    (3, 0, 4, 4, 16, "causal"),
    (3, 17, 8, 1, 16, "tree"),
    (3, 200, 4, 2, 64, "tree"),
    (16, 1, 4, 2, 16, "tree"),
    (16, 17, 4, 4, 16, "causal"),
    (16, 200, 8, 1, 64, "tree"),
    (16, 1100, 4, 2, 16, "tree"),
    (37, 0, 8, 1, 16, "causal"),    # prefill chunk, T not a power of two
    (37, 17, 4, 2, 64, "tree"),
    (37, 200, 6, 2, 16, "tree"),    # GQA group of 3 (not a power of two)
    (37, 1000, 4, 4, 16, "tree"),
    (64, 0, 4, 4, 16, "tree"),
    (64, 1, 8, 1, 16, "tree"),      # 512 packed rows: several query tiles
    (64, 200, 4, 2, 16, "causal"),
    (64, 1000, 4, 2, 64, "tree"),
    (100, 30, 4, 4, 16, "causal"),  # several 64-column tree tiles; upper ones skipped per q tile
    (130, 5, 8, 1, 16, "tree"),
]


@pytest.mark.parametrize("t,prefix_len,n_heads,n_kv,head_dim,mask", CASES)
def test_tree_attention_matches_reference(t, prefix_len, n_heads, n_kv, head_dim, mask, poisoned_alloc, checked_pointers):
    check(t, prefix_len, n_heads, n_kv, head_dim, mask=mask, seed=t * 1000 + prefix_len)


@pytest.mark.parametrize("split_len", [64, 128, 256, 1024])
def test_split_lengths(split_len, poisoned_alloc):
    """Any split length is exact: rows of one split, of several, and splits past every row."""
    check(9, 300, 4, 2, 16, split_len=split_len, seed=split_len)


@pytest.mark.parametrize("t,prefix_len", [(1, 0), (1, 150), (9, 150), (70, 40)])
def test_no_block_table_is_the_identity_table(t, prefix_len, poisoned_alloc):
    """block_table=None (the pool's blocks in logical order, as in the engine's caches) gives
    bitwise the output of the identity table, for AR, tree and prefill-sized calls."""
    q, k_pool, v_pool, _, tree_mask = make_inputs(t, prefix_len, 4, 2, 16, seed=31 + t)
    identity = torch.arange(k_pool.shape[0], dtype=torch.int32, device=DEVICE)
    k_pool = torch.nan_to_num(k_pool)  # make_inputs poisons slots by its shuffled table
    v_pool = torch.nan_to_num(v_pool)
    scale = 16 ** -0.5
    paged = paged_tree_attention_triton(q, k_pool, v_pool, identity, prefix_len, tree_mask, scale, split_len=64)
    plain = paged_tree_attention_triton(q, k_pool, v_pool, None, prefix_len, tree_mask, scale, split_len=64)
    ref = paged_tree_attention_ref(q, k_pool, v_pool, None, prefix_len, tree_mask, scale)
    torch.testing.assert_close(plain, ref, rtol=1e-4, atol=1e-5)
    assert torch.equal(plain, paged)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's check (the GPU's bf16 tests are below)")
@pytest.mark.parametrize("t,prefix_len", [(1, 130), (12, 130)])
def test_bf16_under_the_interpreter_matches_the_reference(t, prefix_len):
    """bf16 under the interpreter, AR and a tree: its tl.dot multiplies bf16 tiles' raw bit
    patterns, so there the kernel runs every dot in fp32 on upcast operands (PRECISION "ieee");
    without that the scores are garbage (4e9 for tiles of ones) and the outputs far off or NaN."""
    check(t, prefix_len, 8, 2, 64, mask="tree", dtype=torch.bfloat16, rtol=2e-2, atol=2e-2, split_len=64)


@pytest.mark.parametrize("t,prefix_len,mask,window", [
    (6, 130, "tree", 0),     # flat programs: each whole prefix tile in a program of its own
    (6, 1100, "tree", 0),    # past FLAT_TILES: split programs fold the whole tiles in chains
    (40, 300, "causal", 0),  # a prefill chunk: shared keys
    (5, 300, "tree", 70),    # a window: each score's visibility still applied
    (1, 300, "tree", 0),     # AR: pointer loads either way
])
def test_tma_loads_change_no_bit(t, prefix_len, mask, window, monkeypatch):
    """Whole prefix tiles through the pools' TMA descriptors (2-byte elements, blocks in logical
    order) give the pointer loads' bits, at every KV head's columns, and match the reference.
    fp16: the interpreter's bf16 arithmetic is not the GPU's (numpy has no bf16)."""
    from jetspec_chat.kernels import tree_attention

    gen = torch.Generator().manual_seed(t + prefix_len)
    n_heads, n_kv, d, dtype = 4, 2, 64, torch.float16
    k_pool = torch.randn(-(-(prefix_len + t) // 16) + 1, 16, n_kv, d, generator=gen).to(dtype).to(DEVICE)
    v_pool = torch.randn(k_pool.shape, generator=gen).to(dtype).to(DEVICE)
    q = torch.randn(t, n_heads, d, generator=gen).to(dtype).to(DEVICE)
    tree_mask = (causal_mask(t) if mask == "causal" else random_tree_mask(t, gen)).to(DEVICE)
    keys = visible_keys(tree_mask, shared=mask == "causal")
    assert tree_attention.tma_loads(q, k_pool, v_pool, None, ar=False)  # the pools qualify
    outs = []
    for tma in (False, True):
        monkeypatch.setattr(tree_attention, "TMA_LOADS", tma)
        outs.append(paged_tree_attention_triton(q, k_pool, v_pool, None, prefix_len, keys, d ** -0.5, split_len=256,
                                                window=window))
    assert torch.equal(outs[0], outs[1])
    ref = paged_tree_attention_ref(q.float(), k_pool.float(), v_pool.float(), None, prefix_len, tree_mask, d ** -0.5,
                                   window)
    torch.testing.assert_close(outs[1].float(), ref, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("shared", [False, True])
def test_arbitrary_mask(shared, poisoned_alloc):
    """Any [T, T] mask, not only trees in topological order (later columns visible too); also
    when a caller wrongly calls its rows' keys shared (they then take a step per token)."""
    t, n_heads, n_kv, d = 70, 4, 2, 16
    q, k_pool, v_pool, block_table, _ = make_inputs(t, 50, n_heads, n_kv, d, seed=11)
    gen = torch.Generator().manual_seed(11)
    mask = (torch.rand(t, t, generator=gen) < 0.3) | torch.eye(t, dtype=torch.bool)
    mask[5] = False  # a row that sees no new token at all (only the prefix)
    mask = mask.to(DEVICE)
    keys = visible_keys(mask, shared=shared)
    out = paged_tree_attention_triton(q, k_pool, v_pool, block_table, 50, keys, d ** -0.5, split_len=64)
    ref = paged_tree_attention_ref(q, k_pool, v_pool, block_table, 50, mask, d ** -0.5)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("t,prefix_len", [(9, 0), (40, 100), (70, 250)])
def test_shared_keys_change_no_bit(t, prefix_len, poisoned_alloc, ordered_dot):
    """A causal call folded in its split programs (shared) gives the bits of the same call run as a
    tree (a program per token past the prefix): the mode is speed only."""
    q, k_pool, v_pool, block_table, mask = make_inputs(t, prefix_len, 4, 2, 16, seed=t, mask="causal")
    outs = [paged_tree_attention_triton(q, k_pool, v_pool, block_table, prefix_len, visible_keys(mask, shared=s),
                                        0.25, split_len=64) for s in (False, True)]
    assert torch.equal(outs[0], outs[1])


def tail_apart_and_not(t, prefix_len, n_heads, n_kv, head_dim, monkeypatch, window=0, with_sinks=False,
                       split_len=64, **kw):
    """A TREE call with its tile programs in the split programs' launch, then in a launch of their own."""
    from jetspec_chat.kernels import tree_attention

    q, k_pool, v_pool, block_table, mask = make_inputs(t, prefix_len, n_heads, n_kv, head_dim, seed=t, **kw)
    sinks = torch.randn(n_heads, generator=torch.Generator().manual_seed(7)).to(q.device, q.dtype) if with_sinks else None
    outs = []
    for programs in (1 << 30, 0):
        monkeypatch.setattr(tree_attention, "SEPARATE_TAIL_PROGRAMS", programs)
        outs.append(paged_tree_attention_triton(q, k_pool, v_pool, block_table, prefix_len, visible_keys(mask),
                                                head_dim ** -0.5, split_len=split_len if q.device.type == "cpu" else None,
                                                window=window, sinks=sinks))
    return outs


@pytest.mark.parametrize("t,prefix_len,window,with_sinks,split_len", [
    (9, 0, 0, False, 64), (40, 100, 0, False, 64), (70, 250, 0, False, 64), (70, 250, 0, False, 256),
    (40, 100, 48, True, 128)])
def test_tail_launched_apart_changes_no_bit(t, prefix_len, window, with_sinks, split_len, poisoned_alloc, ordered_dot,
                                            monkeypatch):
    """The tree's tile programs in a launch of their own run the same code per tile: speed only
    (also with a sliding window and sinks, and with splits of several tiles)."""
    outs = tail_apart_and_not(t, prefix_len, 4, 2, 16, monkeypatch, window=window, with_sinks=with_sinks,
                              split_len=split_len)
    assert torch.equal(outs[0], outs[1])


def test_short_prefix_short_splits(poisoned_alloc):
    check(2, 17, 8, 1, 16, split_len=64)


@pytest.mark.parametrize("mask", ["tree", "causal"])
def test_new_tokens_spread_over_splits(mask, poisoned_alloc):
    """T > 64: rows whose own keys cross split bounds (prefix 40 and 0, splits of 64)."""
    check(130, 40, 2, 1, 16, mask=mask, split_len=64, seed=1)
    check(130, 0, 2, 1, 16, mask=mask, split_len=64, seed=2)


def test_block_size_not_tile_multiple(poisoned_alloc, checked_pointers):
    """Pages of 8 and 32 positions: tiles straddle pages either way."""
    check(5, 150, 4, 2, 16, block_size=8, split_len=64)
    check(5, 150, 4, 2, 16, block_size=32)


def test_prefix_len_tensor_and_visible_keys(poisoned_alloc):
    """prefix_len as a 0-d / 1-element int32 tensor, keys built beforehand: same result, and
    the compiled kernel is reused across prefix lengths (prefix_len is read from memory)."""
    t, n_heads, n_kv, d = 7, 4, 2, 16
    q, k_pool, v_pool, block_table, tree_mask = make_inputs(t, 300, n_heads, n_kv, d, seed=3)
    packed = visible_keys(tree_mask)
    for prefix_len in (300, 123, 0):
        # The pools hold K/V for prefix 300; a shorter prefix just means the tree's K/V
        # sits at prefix_len .. prefix_len + t - 1 of the same table (all non-NaN slots).
        ref = paged_tree_attention_ref(q, k_pool, v_pool, block_table, prefix_len, tree_mask, d ** -0.5)
        for p in (torch.tensor(prefix_len, dtype=torch.int32, device=DEVICE),
                  torch.tensor([prefix_len], dtype=torch.int32, device=DEVICE)):
            out = paged_tree_attention_triton(q, k_pool, v_pool, block_table, p, packed, d ** -0.5,
                                              split_len=128)
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_strided_q_and_out_buffer():
    """q as a view of a fused qkv projection; result written into a caller's buffer."""
    t, n_heads, n_kv, d = 6, 4, 2, 16
    q, k_pool, v_pool, block_table, tree_mask = make_inputs(t, 40, n_heads, n_kv, d, seed=5)
    qkv = torch.randn(t, n_heads + 2 * n_kv, d, device=DEVICE)
    qkv[:, :n_heads] = q
    q_view = qkv[:, :n_heads]
    out = torch.full_like(q, float("nan"))
    res = paged_tree_attention_triton(q_view, k_pool, v_pool, block_table, 40, tree_mask, 0.3, out=out)
    assert res is out
    ref = paged_tree_attention_ref(q, k_pool, v_pool, block_table, 40, tree_mask, 0.3)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_dispatch_matches_reference():
    """The public entry: Triton on CUDA tensors, the reference on CPU; prebuilt keys accepted."""
    q, k_pool, v_pool, block_table, tree_mask = make_inputs(5, 30, 4, 2, 16, seed=7)
    ref = paged_tree_attention_ref(q, k_pool, v_pool, block_table, 30, tree_mask, 0.25)
    for keys in (None, visible_keys(tree_mask)):
        out = paged_tree_attention(q, k_pool, v_pool, block_table, 30, tree_mask, 0.25, keys)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- batch invariance


def ar_equivalents(q, k_pool, v_pool, block_table, prefix_len, tree_mask, scale, split_len, window=0, sinks=None):
    """For each new token j: the output of the AR step that would compute it, i.e. a T=1 call
    after j's visible new tokens were accepted (moved to logical prefix_len, prefix_len+1, ...)."""
    block_size, n_kv, d = k_pool.shape[1], k_pool.shape[2], k_pool.shape[3]
    keys = visible_keys(tree_mask.cpu())
    outs = []
    for j in range(q.shape[0]):
        order = keys.order[j, : int(keys.count[j])].long()
        k_ar, v_ar = k_pool.clone(), v_pool.clone()
        src = logical_to_slots(block_table, (prefix_len + order).to(block_table.device), block_size)
        dst = logical_to_slots(block_table, torch.arange(prefix_len, prefix_len + len(order), device=block_table.device), block_size)
        for pool, new in ((k_pool, k_ar), (v_pool, v_ar)):
            new.view(-1, n_kv, d)[dst] = pool.view(-1, n_kv, d)[src]
        one = torch.ones(1, 1, dtype=torch.bool, device=tree_mask.device)
        outs.append(paged_tree_attention_triton(q[j : j + 1], k_ar, v_ar, block_table, prefix_len + len(order) - 1,
                                                one, scale, split_len=split_len, window=window, sinks=sinks))
    return torch.cat(outs)


def assert_batch_invariant(t, prefix_len, n_heads, n_kv, d, *, mask="tree", split_len=64, dtype=torch.float32, seed=0,
                           window=0, sinks=None):
    q, k_pool, v_pool, block_table, tree_mask = make_inputs(t, prefix_len, n_heads, n_kv, d, seed=seed,
                                                            dtype=dtype, mask=mask)
    # The AR layouts write past the tree: give the table room (NaN-free spare blocks).
    k_pool[torch.isnan(k_pool)] = 0.0
    v_pool[torch.isnan(v_pool)] = 0.0
    scale = d ** -0.5
    keys = visible_keys(tree_mask, shared=mask == "causal")  # as the engine's prefill and verify pass them
    sinks = sinks.to(q.device) if sinks is not None else None
    tree = paged_tree_attention_triton(q, k_pool, v_pool, block_table, prefix_len, keys, scale, split_len=split_len,
                                       window=window, sinks=sinks)
    ref = paged_tree_attention_ref(q, k_pool, v_pool, block_table, prefix_len, tree_mask, scale, window, sinks)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(tree.float(), ref.float(), rtol=tol, atol=tol)
    ar = ar_equivalents(q, k_pool, v_pool, block_table, prefix_len, tree_mask, scale, split_len, window, sinks)
    assert torch.equal(tree, ar), f"{int((tree != ar).any(-1).any(-1).sum())} of {t} rows differ from their AR step"


@pytest.mark.parametrize("t,prefix_len,mask", [(12, 57, "tree"), (20, 120, "tree"), (9, 0, "causal"), (70, 3, "tree"),
                                                 (6, 1100, "tree")])  # past FLAT_TILES: the prefix in a chain
def test_rows_equal_their_ar_step(t, prefix_len, mask, ordered_dot):
    """(The previous kernel, which reduced a node's keys in tree order, fails this.) Bitwise: a verified node's output is the AR step's for the same token and keys, also when
    the prefix ends inside a tile, rows cross split bounds (splits of 64) and siblings share tiles.
    (ordered_dot: on the CPU, the interpreter's dot made per element, as the GPU's MMA is.)"""
    assert_batch_invariant(t, prefix_len, 4, 2, 16, mask=mask, seed=t)


# ----------------------------------------------------------------------------- sliding window, sinks (gpt-oss)


def sink_logits(n_heads: int) -> torch.Tensor:
    return torch.linspace(-2.0, 3.0, n_heads, device=DEVICE)  # from negligible to dominant


@pytest.mark.parametrize("t,prefix_len,mask,window", [
    (1, 150, "tree", 8),     # AR: the window inside one tile
    (1, 150, "tree", 70),    # AR: the window across tiles
    (12, 100, "tree", 20),   # a tree: each node's window on its own logical positions
    (9, 90, "causal", 5),    # a prefill chunk: shared keys, windows ending among the new tokens
    (5, 3, "tree", 4),       # the window cuts into the new tokens only
])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_window_and_sinks_match_reference(t, prefix_len, mask, window, with_sinks, poisoned_alloc):
    check(t, prefix_len, 4, 2, 16, mask=mask, split_len=64, window=window,
          sinks=sink_logits(4) if with_sinks else None)


def test_sinks_without_window_match_reference(poisoned_alloc):
    check(7, 40, 4, 2, 16, split_len=64, sinks=sink_logits(4))


@pytest.mark.parametrize("t,prefix_len,mask,window", [(12, 57, "tree", 20), (9, 70, "causal", 6)])
def test_window_and_sinks_rows_equal_their_ar_step(t, prefix_len, mask, window, ordered_dot):
    """Bitwise, as without them: a tile outside a row's window folds as the empty partial."""
    assert_batch_invariant(t, prefix_len, 4, 2, 16, mask=mask, seed=t, window=window, sinks=sink_logits(4))


@pytest.mark.parametrize("t,prefix_len,mask,window", [(6, 100, "tree", 0), (5, 90, "causal", 20)])
def test_head_dim_256_matches_reference(t, prefix_len, mask, window, poisoned_alloc):
    """The widest head of the one-program tiles (Gemma 4's sliding layers, the Qwen3.5 family's
    attention; 4 query heads over 1 KV head here)."""
    check(t, prefix_len, 4, 1, 256, mask=mask, split_len=64, window=window)


@pytest.mark.parametrize("t,prefix_len,mask,window,with_sinks", [
    (6, 61, "tree", 0, False),    # a tree: prefix tiles (32 keys) flat, then each node's own, across a tile
    (1, 90, "tree", 0, False),    # AR: every tile alone, the merge folds them
    (4, 40, "causal", 0, False),  # a prefill chunk: shared keys, one split, the output written directly
    (4, 62, "causal", 20, True),  # windowed, with sinks, across a split of 64 (the merge)
])
@fp32_512_interpreted
def test_head_dim_512_matches_reference(t, prefix_len, mask, window, with_sinks, poisoned_alloc, checked_pointers):
    """Gemma 4's global heads (512): 32-key tiles, V and the output cut over two programs; every
    output column and partial written (poisoned_alloc), every access in bounds (checked_pointers)."""
    check(t, prefix_len, 2, 1, 512, mask=mask, split_len=64, window=window,
          sinks=sink_logits(2) if with_sinks else None)


@pytest.mark.parametrize("t,prefix_len,mask,window", [(6, 61, "tree", 0), (4, 30, "causal", 24)])
@fp32_512_interpreted
def test_head_dim_512_rows_equal_their_ar_step(t, prefix_len, mask, window, ordered_dot):
    """Bitwise, as at 256: a row's result alone in an AR call (T = 1) is the one it gets among
    the other rows of a tree or a prefill chunk (rows spread over two query heads here)."""
    assert_batch_invariant(t, prefix_len, 2, 1, 512, mask=mask, seed=t, window=window)


@fp32_512_interpreted
def test_head_dim_512_deep_chain_matches_reference(poisoned_alloc):
    """A 40-node chain verified as a tree (a program per node): each node's own keys span two
    32-key tiles past the prefix, and more than one tile slot each."""
    q, k_pool, v_pool, block_table, _ = make_inputs(40, 30, 1, 1, 512, seed=9)
    chain = causal_mask(40)
    out = paged_tree_attention_triton(q, k_pool, v_pool, block_table, 30, visible_keys(chain), 512 ** -0.5,
                                      split_len=64)
    ref = paged_tree_attention_ref(q, k_pool, v_pool, block_table, 30, chain, 512 ** -0.5)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_heads_wider_than_the_tiles_fit_are_refused_in_one_sentence():
    """Beyond 512 even the split tiles would not fit an SM's 227 KB of shared memory: the kernel
    says so instead of failing at launch."""
    with pytest.raises(ValueError, match="heads up to 512 wide, not 1024"):
        check(2, 20, 4, 1, 1024, mask="tree", split_len=64)


def test_sm90_128_binaries_take_tma_loads_without_spills():
    """Offline sm_90 compile (no GPU): at the Qwen heads' width every attention binary takes the
    whole prefix tiles through TMA descriptors and fits an SM without spills. And a tile's
    arithmetic is what `_tile_partial` and `_fold_sums` write: one FMA a score (scale and max
    subtracted together), and a fold of a split program's running state that costs a multiply
    and an FMA an accumulator element (not two multiplies and an add)."""
    from sm90 import run_compile_script

    lines = run_compile_script("sm90_tree_attention_compile.py", ["128"])
    assert [line["mode"] for line in lines if line.get("tma")] == ["TREE", "CHUNK", "TAIL"]
    for line in lines:
        assert line["shared"] <= 227 * 1024 and line["local"] == 0, line
    threads = 4 * 32
    scores, acc = 64 * 64 // threads, 64 * 128 // threads  # a thread's share of a 64 x 64 tile, of a 64 x 128 state
    for line in lines[:4]:  # AR, TREE, CHUNK, TAIL
        loop = line["tile_loop"]
        assert loop["HGMMA"] > 0 and loop["FFMA"] >= scores, line
        folds = line["mode"] in ("TREE", "CHUNK")  # split programs fold their tiles in registers
        assert loop["FMUL"] <= (acc if folds else 0) + 4, line
        assert loop["FADD"] <= scores + 8, line  # the row sums' adds only


def test_sm90_512_binaries_fit_shared_memory_and_registers():
    """Offline sm_90 compile (no GPU): the 512-wide binaries (every MODE, and the merge) within an
    H100/H200 SM's 227 KB of shared memory, without spills."""
    from sm90 import run_compile_script

    lines = run_compile_script("sm90_tree_attention_compile.py", ["512"])
    assert len(lines) == 7  # AR, TREE, CHUNK, TAIL, the merge (TREE, CHUNK, AR)
    assert not any(line.get("tma") for line in lines)  # TMA loads up to 128 wide (`tma_shape`)
    for line in lines:
        assert line["shared"] <= 227 * 1024 and line["local"] == 0, line


# ----------------------------------------------------------------------------- write_kv


@pytest.mark.parametrize("n_kv,head_dim", [(2, 16), (3, 64), (2, 512)])  # 512: Gemma 4's global layers
def test_write_kv_matches_reference(n_kv, head_dim):
    gen = torch.Generator().manual_seed(n_kv)
    num_blocks, block_size, t = 6, 16, 21
    k_pool = torch.randn(num_blocks, block_size, n_kv, head_dim, generator=gen)
    v_pool = torch.randn(num_blocks, block_size, n_kv, head_dim, generator=gen)
    block_table = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    slots = logical_to_slots(block_table, torch.arange(30, 30 + t), block_size)
    k = torch.randn(t, n_kv, head_dim, generator=gen)
    v = torch.randn(t, n_kv, head_dim, generator=gen)
    k_ref, v_ref = k_pool.clone(), v_pool.clone()
    write_kv_ref(k_ref, v_ref, slots, k, v)
    k_dev, v_dev = k_pool.to(DEVICE), v_pool.to(DEVICE)
    write_kv_triton(k_dev, v_dev, slots.to(DEVICE), k.to(DEVICE), v.to(DEVICE))
    assert torch.equal(k_dev.cpu(), k_ref) and torch.equal(v_dev.cpu(), v_ref)


# ----------------------------------------------------------------------------- GPU only


@gpu_only
@pytest.mark.parametrize(
    "t,prefix_len,mask",
    [(1, 4096, "tree"), (1, 32768, "tree"), (16, 4000, "tree"), (128, 4096, "tree"),
     (256, 4096, "tree"), (256, 32000, "tree"), (512, 0, "causal"), (512, 3000, "causal")],
)
def test_bf16_qwen3_8b_shapes(t, prefix_len, mask):
    """Qwen3-8B attention shape (32 q heads, 8 KV heads, head_dim 128) in bf16."""
    check(t, prefix_len, 32, 8, 128, mask=mask, dtype=torch.bfloat16, rtol=2e-2, atol=2e-2)


@gpu_only
@pytest.mark.parametrize("t,prefix_len", [(16, 500), (128, 512), (256, 4000)])
@pytest.mark.parametrize("n_heads,n_kv", [(12, 2), (32, 8)])
def test_bf16_tail_launched_apart_changes_no_bit(t, prefix_len, n_heads, n_kv, monkeypatch):
    """The TAIL binary (fewer registers, other pipeline depth) gives the TREE binary's bits."""
    outs = tail_apart_and_not(t, prefix_len, n_heads, n_kv, 128, monkeypatch, dtype=torch.bfloat16)
    assert torch.equal(outs[0], outs[1])


@gpu_only
@pytest.mark.parametrize("n_heads,n_kv,head_dim", [(14, 2, 64), (12, 2, 128), (32, 4, 128)])
def test_fp32_gpu_is_exact(n_heads, n_kv, head_dim):
    """fp32 on the GPU must not fall back to TF32 (the fp32 lossless check depends on it)."""
    check(64, 2000, n_heads, n_kv, head_dim, rtol=1e-4, atol=1e-5)
    check(1, 9000, n_heads, n_kv, head_dim, rtol=1e-4, atol=1e-5)


@gpu_only
def test_cuda_graph_replay_across_prefix_lengths():
    """Captured once, replayed with other prefix lengths written into the device scalar."""
    t, n_heads, n_kv, d = 32, 32, 8, 128
    q, k_pool, v_pool, block_table, tree_mask = make_inputs(t, 5000, n_heads, n_kv, d, dtype=torch.bfloat16)
    packed = visible_keys(tree_mask)
    prefix = torch.tensor([5000], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)

    def step():
        paged_tree_attention_triton(q, k_pool, v_pool, block_table, prefix, packed, d ** -0.5, out=out)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for prefix_len in (5000, 77, 0, 4321):
        prefix.fill_(prefix_len)
        graph.replay()
        ref = paged_tree_attention_ref(q, k_pool, v_pool, block_table, prefix_len, tree_mask, d ** -0.5)
        torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


@gpu_only
@pytest.mark.parametrize("t,prefix_len,mask", [(64, 1000, "tree"), (256, 3000, "tree"), (33, 500, "causal")])
@pytest.mark.parametrize("n_heads,n_kv", [(12, 2), (32, 8)])
def test_bf16_rows_equal_their_ar_step(t, prefix_len, mask, n_heads, n_kv):
    """Batch invariance in bf16 on the GPU (Qwen2.5-1.5B and Qwen3-8B head shapes)."""
    assert_batch_invariant(t, prefix_len, n_heads, n_kv, 128, mask=mask, split_len=256, dtype=torch.bfloat16)


@gpu_only
@pytest.mark.parametrize("t,prefix_len,mask", [(64, 1000, "tree"), (1, 700, "tree"), (33, 500, "causal")])
@pytest.mark.parametrize("window", [0, 128])
def test_bf16_window_and_sinks_rows_equal_their_ar_step(t, prefix_len, mask, window):
    """gpt-oss-20b's heads (64 query, 8 KV, head_dim 64), its window 128 and sinks, in bf16."""
    assert_batch_invariant(t, prefix_len, 64, 8, 64, mask=mask, split_len=256, dtype=torch.bfloat16,
                           window=window, sinks=sink_logits(64))


@gpu_only
@pytest.mark.parametrize("t,prefix_len,mask", [(64, 1500, "tree"), (1, 1500, "tree"), (33, 700, "causal")])
@pytest.mark.parametrize("n_kv,head_dim,window", [(8, 256, 1024), (2, 512, 0), (2, 512, 1024)])
def test_bf16_gemma4_heads_rows_equal_their_ar_step(t, prefix_len, mask, n_kv, head_dim, window):
    """Gemma 4 26B-A4B's heads in bf16, 16 query heads: its sliding layers' (8 KV, head_dim 256,
    window 1024) and its global layers' (2 KV, head_dim 512, no window; and windowed, as the
    512 path takes a window too): against the reference, and each row bitwise its AR step."""
    assert_batch_invariant(t, prefix_len, 16, n_kv, head_dim, mask=mask, split_len=256, dtype=torch.bfloat16,
                           window=window)


@gpu_only
def test_write_kv_bf16_gpu():
    k_pool = torch.randn(64, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    v_pool = torch.randn_like(k_pool)
    slots = torch.randperm(64 * 16, device="cuda")[:200]
    k = torch.randn(200, 8, 128, device="cuda")
    v = torch.randn(200, 8, 128, device="cuda")
    k_ref, v_ref = k_pool.clone(), v_pool.clone()
    write_kv_ref(k_ref, v_ref, slots, k, v)
    write_kv_triton(k_pool, v_pool, slots, k, v)
    assert torch.equal(k_pool, k_ref) and torch.equal(v_pool, v_ref)


def test_prefix_tensor_converts_once():
    """A forward converts the committed length once (`prefix_tensor`) and every layer's attention
    takes the result as it is: an int32 1-element tensor comes back as a view, not a copy (a cast
    a layer was a kernel launch a layer on the GPU)."""
    from jetspec_chat.kernels import prefix_tensor

    length = torch.tensor(57, dtype=torch.int64, device=DEVICE)  # the caches' device_length
    once = prefix_tensor(length, length.device)
    assert once.dtype == torch.int32 and once.shape == (1,) and int(once) == 57
    assert prefix_tensor(once, once.device).data_ptr() == once.data_ptr()
    assert int(prefix_tensor(12, torch.device(DEVICE))) == 12

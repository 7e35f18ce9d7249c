"""Split programs capped per query tile (each walking every cap-th split) give bitwise the output
of one program per split: the same code folds each split's tiles whichever program runs it.

On the CPU the kernels run under the interpreter: small heads, 64-key splits, a cap of 2 so the
programs' loops run several iterations.
"""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from jetspec_chat.kernels import paged_tree_attention_ref, paged_tree_attention_triton, tree_attention  # noqa: E402
from jetspec_chat.kernels.tree_attention import split_programs_per_tile, visible_keys  # noqa: E402

from test_kernels import make_inputs  # noqa: E402


def call(inputs, prefix_len, mask, cap, monkeypatch, **kw):
    q, k_pool, v_pool, block_table, tree_mask = inputs
    monkeypatch.setattr(tree_attention, "SPLIT_PROGRAMS_CAP", cap)
    keys = visible_keys(tree_mask, shared=mask == "causal")
    return paged_tree_attention_triton(q, k_pool, v_pool, block_table, prefix_len, keys, q.shape[-1] ** -0.5,
                                       split_len=64, **kw)


# (tokens, prefix, mask): a tree whose prefix goes to the split programs' chains (past FLAT_TILES
# tiles: 18 splits of its prefix), two query tiles (40 tokens x 2 heads a KV head = 80 rows); a
# tree whose prefix goes to flat programs (the split programs have nothing to do); chunks of
# several splits and of one split (its rows written by the split program itself).
@pytest.mark.parametrize("t,prefix_len,mask", [(6, 1100, "tree"), (40, 1100, "tree"), (12, 300, "tree"),
                                                (9, 450, "causal"), (40, 200, "causal"), (5, 20, "causal")])
def test_capped_grid_keeps_the_bits(t, prefix_len, mask, monkeypatch, poisoned_alloc):
    inputs = make_inputs(t, prefix_len, 4, 2, 16, seed=t + prefix_len, mask=mask)
    capped = call(inputs, prefix_len, mask, 2, monkeypatch)
    uncapped = call(inputs, prefix_len, mask, 10 ** 9, monkeypatch)
    q, k_pool, v_pool, block_table, tree_mask = inputs
    ref = paged_tree_attention_ref(q, k_pool, v_pool, block_table, prefix_len, tree_mask, q.shape[-1] ** -0.5)
    torch.testing.assert_close(capped, ref, rtol=1e-4, atol=1e-5)
    assert torch.equal(capped, uncapped), f"{int((capped != uncapped).sum())} elements differ from one program a split"


def test_capped_grid_keeps_the_bits_with_windows_and_sinks(monkeypatch, poisoned_alloc):
    inputs = make_inputs(9, 700, 4, 2, 16, seed=3, mask="causal")
    sinks = torch.linspace(-2.0, 3.0, 4, device=inputs[0].device)
    capped = call(inputs, 700, "causal", 3, monkeypatch, window=150, sinks=sinks)
    uncapped = call(inputs, 700, "causal", 10 ** 9, monkeypatch, window=150, sinks=sinks)
    assert torch.equal(capped, uncapped)


def test_split_programs_per_tile(monkeypatch):
    monkeypatch.setattr(tree_attention, "SPLIT_PROGRAMS_CAP", 16)
    # The app's cache (33,792 rows: 59 splits of 576) gets 16; a cache of 15 splits one a split.
    assert split_programs_per_tile(-(-33792 // tree_attention.split_len_for(33792))) == 16
    assert split_programs_per_tile(15) == 15
    assert split_programs_per_tile(1) == 1


def test_ar_tile_programs_follow_the_kv_heads():
    assert tree_attention.ar_tile_programs(8) == 32  # the 8B: 256 programs
    assert tree_attention.ar_tile_programs(2) == 128  # the 1.5B: 256 programs, was 64
    assert tree_attention.ar_tile_programs(64) == tree_attention.AR_TILE_PROGRAMS_MIN


# An AR row of 40 tiles spread over 3, 7 and 64 tile programs a KV head (each walking every n-th
# tile; 64: most of them without a tile): the same bits.
def test_ar_tile_program_count_keeps_the_bits(monkeypatch, poisoned_alloc):
    q, k_pool, v_pool, block_table, one = make_inputs(1, 40 * 64 - 1, 4, 2, 16, seed=11)
    outs = []
    for programs in (3, 7, 64):
        monkeypatch.setattr(tree_attention, "AR_TILE_PROGRAMS_TOTAL", 0)
        monkeypatch.setattr(tree_attention, "AR_TILE_PROGRAMS_MIN", programs)
        outs.append(paged_tree_attention_triton(q, k_pool, v_pool, block_table, 40 * 64 - 1, one, 16 ** -0.5,
                                                split_len=256))
    ref = paged_tree_attention_ref(q, k_pool, v_pool, block_table, 40 * 64 - 1, one, 16 ** -0.5)
    torch.testing.assert_close(outs[0], ref, rtol=1e-4, atol=1e-5)
    assert all(torch.equal(o, outs[0]) for o in outs[1:])

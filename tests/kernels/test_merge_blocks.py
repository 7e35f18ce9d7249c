"""The merge's tile partials loaded in blocks (all in flight, then folded in order) and an AR
row's columns cut over several programs give bitwise the output of the merge that loads and
folds one partial after another in one program a row.

Both merges run on the same partials (the attention programs do not change), so any difference
is the merge's. MERGE_LOADS_A_THREAD = 0 loads one tile partial at a time and AR_MERGE_PARTS = 1
gives a row one program: the merge as it was. Small budgets (1, 4 floats a thread) cut a split's
tiles into blocks of 2 (the last block past the split's tiles, masked off). On the CPU the kernels
run under the interpreter: head 64 (an AR row in 4 parts of 16 columns), short splits.
"""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from jetspec_chat.kernels import paged_tree_attention_ref, paged_tree_attention_triton, tree_attention  # noqa: E402
from jetspec_chat.kernels.tree_attention import visible_keys  # noqa: E402

from test_kernels import DEVICE, make_inputs  # noqa: E402

N_HEADS, N_KV, HEAD_DIM = 4, 2, 64
# name: (MERGE_LOADS_A_THREAD, AR_MERGE_PARTS); the first is the one-at-a-time merge
VARIANTS = {"one at a time": (0, 1), "blocks of 2": (1, 1), "small blocks, parts": (4, 4), "default": (None, None)}


def outputs(t, prefix_len, split_len, *, mask="tree", serial_splits=None, window=0, sinks=None, seed=0,
            monkeypatch):
    """Each variant's output of one call (T = t over prefix_len keys), and the reference's."""
    q, k_pool, v_pool, block_table, tree_mask = make_inputs(t, prefix_len, N_HEADS, N_KV, HEAD_DIM, seed=seed,
                                                            mask=mask)
    keys = visible_keys(tree_mask, shared=mask == "causal")
    if serial_splits is not None:
        monkeypatch.setattr(tree_attention, "AR_SERIAL_SPLITS", serial_splits)
        monkeypatch.setattr(tree_attention, "VERIFY_SERIAL_SPLITS", serial_splits)
    outs = {}
    for name, (loads, parts) in VARIANTS.items():
        with monkeypatch.context() as m:
            if loads is not None:
                m.setattr(tree_attention, "MERGE_LOADS_A_THREAD", loads)
                m.setattr(tree_attention, "AR_MERGE_PARTS", parts)
            outs[name] = paged_tree_attention_triton(q, k_pool, v_pool, block_table, prefix_len, keys,
                                                     HEAD_DIM ** -0.5, split_len=split_len, window=window,
                                                     sinks=sinks)
    ref = paged_tree_attention_ref(q, k_pool, v_pool, block_table, prefix_len, tree_mask, HEAD_DIM ** -0.5,
                                   window, sinks)
    return outs, ref


def assert_same_bits(outs, ref):
    first = outs["one at a time"]
    torch.testing.assert_close(first, ref, rtol=1e-5, atol=1e-5)
    for name, out in outs.items():
        assert torch.equal(out, first), f"{name}: {int((out != first).sum())} elements differ"


def test_the_configs_take_blocks_and_parts():
    # The variants above exercise what they claim: blocks of 2 tiles and 4 parts at head 64.
    with pytest.MonkeyPatch.context() as m:
        m.setattr(tree_attention, "MERGE_LOADS_A_THREAD", 1)
        assert tree_attention.merge_config(False, 64, HEAD_DIM, 9).tiles_block == 1
        assert tree_attention.merge_config(True, 1, HEAD_DIM, 9).tiles_block == 2  # one warp, 16 columns
        m.setattr(tree_attention, "MERGE_LOADS_A_THREAD", 4)
        assert tree_attention.merge_config(False, 64, HEAD_DIM, 9).tiles_block == 2
        ar = tree_attention.merge_config(True, 64, HEAD_DIM, 9)
        assert (ar.splits_block, ar.parts) == (16, 4)
    cfg = tree_attention.merge_config(True, 64, 128, 9)
    assert (cfg.parts, cfg.tiles_block) == (tree_attention.AR_MERGE_PARTS, 9)
    assert tree_attention.merge_config(False, 64, 128, 9).tiles_block == 9  # a whole engine split at once


# AR rows: one split of 9 tiles (577 keys, the engine's 576-key splits: one split and a tile past it),
# 1000 keys in 128-key splits folded in turn (serial) and side by side.
@pytest.mark.parametrize("keys,split_len,serial", [(577, 576, None), (1000, 128, 10 ** 9), (1000, 128, 0)])
def test_ar_rows_keep_the_bits(keys, split_len, serial, monkeypatch, poisoned_alloc):
    outs, ref = outputs(1, keys - 1, split_len, serial_splits=serial, seed=keys + split_len, monkeypatch=monkeypatch)
    assert_same_bits(outs, ref)


# An AR row in parts with a sliding window and attention sinks (the sink folds into every part's m and l).
@pytest.mark.parametrize("serial", [10 ** 9, 0])
def test_ar_rows_keep_the_bits_with_windows_and_sinks(serial, monkeypatch, poisoned_alloc):
    sinks = torch.randn(N_HEADS, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    outs, ref = outputs(1, 900, 128, serial_splits=serial, window=300, sinks=sinks, seed=9, monkeypatch=monkeypatch)
    assert_same_bits(outs, ref)


# Tree rows: a short prefix (flat prefix tiles: every tile a partial, 9 to a split), a longer one
# whose tree crosses a split bound (state-only splits, then tile partials); a causal chunk (the
# merge folds split states alone).
@pytest.mark.parametrize("t,prefix_len,split_len,mask", [(9, 500, 576, "tree"), (12, 1530, 128, "tree"),
                                                         (20, 700, 128, "causal")])
def test_verify_and_chunk_rows_keep_the_bits(t, prefix_len, split_len, mask, monkeypatch, poisoned_alloc):
    outs, ref = outputs(t, prefix_len, split_len, mask=mask, seed=t + prefix_len, monkeypatch=monkeypatch)
    assert_same_bits(outs, ref)

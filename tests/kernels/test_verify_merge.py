"""The merge of verify (TREE) and prefill chunk (CHUNK) calls: a row's leading splits without tile
partials folded from blocks of split states loaded at once give bitwise the output of the merge
that loads one split's state after another.

Both merges run on the same partials (the attention programs do not change), so any difference
is the merge's. VERIFY_SERIAL_SPLITS = 0 takes the blocked path for every row with a state-only
split; a huge value compiles it out. On the CPU the kernels run under the interpreter: small
heads, 128-key splits (2 tiles), so a prefix of a few thousand keys spans many splits.
"""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from jetspec_chat.kernels import paged_tree_attention_ref, paged_tree_attention_triton, tree_attention  # noqa: E402
from jetspec_chat.kernels.tree_attention import visible_keys  # noqa: E402

from test_kernels import DEVICE, make_inputs  # noqa: E402

N_HEADS, N_KV, SPLIT_LEN = 4, 2, 128


def call(t, prefix_len, head_dim, *, mask, serial_splits, block, window=0, sinks=None, seed=0, split_len=SPLIT_LEN,
         monkeypatch):
    """One call over prefix_len committed keys and t new tokens (a random tree or a causal chunk),
    and the reference's result."""
    q, k_pool, v_pool, block_table, tree_mask = make_inputs(t, prefix_len, N_HEADS, N_KV, head_dim, seed=seed,
                                                            mask=mask)
    monkeypatch.setattr(tree_attention, "VERIFY_SERIAL_SPLITS", serial_splits)
    monkeypatch.setattr(tree_attention, "VERIFY_SPLITS_BLOCK", block)
    keys = visible_keys(tree_mask, shared=mask == "causal")
    out = paged_tree_attention_triton(q, k_pool, v_pool, block_table, prefix_len, keys, head_dim ** -0.5,
                                      split_len=split_len, window=window, sinks=sinks)
    ref = paged_tree_attention_ref(q, k_pool, v_pool, block_table, prefix_len, tree_mask, head_dim ** -0.5,
                                   window, sinks)
    return out, ref


def assert_same_bits(t, prefix_len, head_dim=16, *, block=16, **kw):
    blocked, ref = call(t, prefix_len, head_dim, serial_splits=0, block=block, **kw)
    serial, _ = call(t, prefix_len, head_dim, serial_splits=10 ** 9, block=block, **kw)
    torch.testing.assert_close(blocked, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(blocked, serial), f"{int((blocked != serial).sum())} elements differ from the serial merge"


# Prefixes (128-key splits, 64-key tiles; blocks of 4 states): inside a tile (1500: 11
# state-only splits, the tree's first tile holds 28 prefix keys), at a split bound (1536: 12), a
# tree crossing a split bound (1530 + 12 tokens), a short prefix whose tiles go to flat programs
# (700: no state-only split); 2200 keys (17 state-only splits) in blocks of 16: the second block
# mostly past the row's splits.
@pytest.mark.parametrize("t,prefix_len,block", [(9, 1500, 4), (7, 1536, 4), (12, 1530, 4), (6, 700, 4),
                                                 (5, 2200, 16)])
def test_tree_rows_keep_the_bits(t, prefix_len, block, monkeypatch, poisoned_alloc):
    assert_same_bits(t, prefix_len, block=block, mask="tree", seed=prefix_len + block, monkeypatch=monkeypatch)


def test_tree_rows_of_two_state_splits_keep_the_bits(monkeypatch, poisoned_alloc):
    # 512-key splits: a 1100-key prefix (17 whole tiles) leaves 2 splits without tile partials.
    assert_same_bits(5, 1100, block=4, mask="tree", seed=3, split_len=512, monkeypatch=monkeypatch)


@pytest.mark.parametrize("window,sinks", [(100, False), (300, True)])
def test_tree_rows_keep_the_bits_with_windows_and_sinks(window, sinks, monkeypatch, poisoned_alloc):
    sink_logits = torch.randn(N_HEADS, generator=torch.Generator().manual_seed(2)).to(DEVICE) if sinks else None
    assert_same_bits(6, 1300, block=4, mask="tree", window=window, sinks=sink_logits, seed=window,
                     monkeypatch=monkeypatch)


# Causal chunks: rows of 8-9 splits past a prefix, and rows of 1-2 splits from position 100 (a
# row of one split is written by its split program; the merge takes the others).
@pytest.mark.parametrize("t,prefix_len", [(20, 1000), (60, 100)])
def test_chunk_rows_keep_the_bits(t, prefix_len, monkeypatch, poisoned_alloc):
    assert_same_bits(t, prefix_len, block=4, mask="causal", seed=t, monkeypatch=monkeypatch)


def test_chunk_rows_keep_the_bits_with_windows_and_sinks(monkeypatch, poisoned_alloc):
    sink_logits = torch.randn(N_HEADS, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    assert_same_bits(10, 1100, block=4, mask="causal", window=200, sinks=sink_logits, seed=5, monkeypatch=monkeypatch)


def test_wide_heads_keep_the_bits(monkeypatch, poisoned_alloc):
    # 256 wide: VERIFY_SPLITS_BLOCK_ELEMS // 256 states a block (fp32 at every width on the CPU).
    wide_on_gpu = DEVICE == "cuda" and 256 > tree_attention.MAX_FP32_HEAD_DIM
    if wide_on_gpu:
        pytest.skip("fp32 at 256 wide: the interpreter's case")
    assert_same_bits(3, 1200, 256, mask="tree", seed=256, monkeypatch=monkeypatch)

"""The AR call's merge of many splits (splits folded side by side, then their states in order)
gives bitwise the output of the merge that folds split after split, tile by tile.

Both merges run on the same partials (the attention programs do not change), so any difference
is the merge's. On the CPU the kernels run under the interpreter: small heads, short splits.
"""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from jetspec_chat.kernels import paged_tree_attention_ref, paged_tree_attention_triton, tree_attention  # noqa: E402

from test_kernels import DEVICE, make_inputs  # noqa: E402


def ar_call(prefix_len, n_heads, n_kv, head_dim, split_len, *, serial_splits, window=0, sinks=None, seed=0,
            dtype=torch.float32, monkeypatch):
    """One AR step (T = 1) over prefix_len + 1 keys, its merge folding the splits side by side
    in rows of more than serial_splits splits (a huge value: never)."""
    q, k_pool, v_pool, block_table, one = make_inputs(1, prefix_len, n_heads, n_kv, head_dim, seed=seed, dtype=dtype)
    monkeypatch.setattr(tree_attention, "AR_SERIAL_SPLITS", serial_splits)
    out = paged_tree_attention_triton(q, k_pool, v_pool, block_table, prefix_len, one, head_dim ** -0.5,
                                      split_len=split_len, window=window, sinks=sinks)
    ref = paged_tree_attention_ref(q, k_pool, v_pool, block_table, prefix_len, one, head_dim ** -0.5, window, sinks)
    return out, ref


def assert_same_bits(keys, n_heads, n_kv, head_dim, split_len, **kw):
    mp = kw.pop("monkeypatch")
    parallel, ref = ar_call(keys - 1, n_heads, n_kv, head_dim, split_len, serial_splits=0, monkeypatch=mp, **kw)
    serial, _ = ar_call(keys - 1, n_heads, n_kv, head_dim, split_len, serial_splits=10 ** 9, monkeypatch=mp, **kw)
    tol = 1e-5 if parallel.dtype == torch.float32 else 2e-2
    torch.testing.assert_close(parallel.float(), ref.float(), rtol=tol, atol=tol)
    assert torch.equal(parallel, serial), f"{int((parallel != serial).sum())} elements differ from the serial merge"


# Keys of the row: one tile, a tile less one key, a whole tile, past a split (576 = 9 tiles at
# the engine's cache), a whole number of splits, and 8192 keys in 256-key splits (32 splits:
# several blocks of splits side by side).
@pytest.mark.parametrize("keys,split_len", [(1, 128), (63, 128), (64, 128), (577, 576), (768, 256), (8192, 256)])
def test_side_by_side_merge_keeps_the_bits(keys, split_len, monkeypatch, poisoned_alloc):
    assert_same_bits(keys, 4, 2, 16, split_len, seed=keys, monkeypatch=monkeypatch)


@pytest.mark.parametrize("window,sinks", [(100, False), (0, True), (200, True)])
def test_side_by_side_merge_keeps_the_bits_with_windows_and_sinks(window, sinks, monkeypatch, poisoned_alloc):
    sink_logits = torch.randn(4, generator=torch.Generator().manual_seed(1)).to(DEVICE) if sinks else None
    assert_same_bits(1000, 4, 2, 16, 128, window=window, sinks=sink_logits, seed=window, monkeypatch=monkeypatch)


@pytest.mark.parametrize("head_dim", [64, 256])  # 32 and 8 splits a block
def test_side_by_side_merge_keeps_the_bits_at_other_head_widths(head_dim, monkeypatch, poisoned_alloc):
    # The GPU attention takes fp32 heads up to MAX_FP32_HEAD_DIM wide (shared memory): wider
    # ones in bf16 there; the interpreter runs fp32 at every width.
    wide_on_gpu = DEVICE == "cuda" and head_dim > tree_attention.MAX_FP32_HEAD_DIM
    assert_same_bits(1500, 2, 1, head_dim, 128, seed=head_dim, monkeypatch=monkeypatch,
                     dtype=torch.bfloat16 if wide_on_gpu else torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 at the 8B's shape: on a GPU")
@pytest.mark.parametrize("keys", [512, 2048, 8192, 33792])
def test_side_by_side_merge_keeps_the_bits_bf16_8b_shape(keys, monkeypatch):
    assert_same_bits(keys, 32, 8, 128, tree_attention.split_len_for(33792), dtype=torch.bfloat16, seed=keys,
                     monkeypatch=monkeypatch)

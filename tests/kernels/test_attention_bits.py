"""The attention kernel against the one it replaced (b8bab39): the same bits for every row.

Session 9 made the T == 1 path one loop and moved the split merge into the kernel; neither may
change a row's arithmetic. The previous kernel is read from git (`git show`), not kept in the
package. Interpreter cases are small; the GPU cases use the real Qwen2.5-1.5B / Qwen3-8B heads.
"""
from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

from jetspec_chat.kernels import paged_tree_attention_triton, split_len_for, visible_keys  # noqa: E402
from jetspec_chat.kernels import tree_attention  # noqa: E402

from test_kernels import assert_batch_invariant, gpu_only, make_inputs  # noqa: E402

OLD_COMMIT = "b8bab39"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def old(tmp_path_factory):
    """The previous kernel module, its relative import made absolute."""
    try:
        src = subprocess.run(["git", "show", f"{OLD_COMMIT}:kernels/tree_attention.py"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"needs the git history ({OLD_COMMIT})")
    path = tmp_path_factory.mktemp("old") / "old_tree_attention.py"
    path.write_text(src.replace("from .reference import", "from jetspec_chat.kernels.reference import"))
    spec = importlib.util.spec_from_file_location("old_tree_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def both(old, t, prefix_len, n_heads, n_kv, d, *, mask="tree", dtype=torch.float32, table_blocks=None,
         split_len=None, seed=0):
    q, k_pool, v_pool, table, tree_mask = make_inputs(t, prefix_len, n_heads, n_kv, d, seed=seed, dtype=dtype,
                                                      mask=mask)
    if table_blocks is not None:  # the engine's table size sets split_len: pad with spare blocks
        extra = table_blocks - table.numel()
        k_pool = torch.cat([k_pool, torch.zeros_like(k_pool[:1]).expand(extra, -1, -1, -1)])
        v_pool = torch.cat([v_pool, torch.zeros_like(v_pool[:1]).expand(extra, -1, -1, -1)])
        table = torch.cat([table, torch.arange(table.numel(), table_blocks, dtype=table.dtype, device=table.device)])
    scale = d ** -0.5
    new_out = paged_tree_attention_triton(q, k_pool, v_pool, table, prefix_len, tree_mask, scale, split_len=split_len)
    old_out = old.paged_tree_attention_triton(q, k_pool, v_pool, table, prefix_len, tree_mask, scale,
                                              split_len=split_len)
    return new_out, old_out


def assert_same_bits(new_out, old_out):
    differ = int((new_out != old_out).flatten(1).any(1).sum())
    assert torch.equal(new_out, old_out), f"{differ} of {new_out.shape[0]} rows differ from the previous kernel"


def counters_are_zero():
    return all(int(buf.abs().sum()) == 0 for buf in tree_attention._COUNTERS.values())


# ----------------------------------------------------------------------------- interpreter (small)


@pytest.mark.parametrize("prefix_len,split_len", [(0, 64), (63, 64), (64, 64), (130, 64), (200, 128), (257, 64)])
def test_ar_step_equals_previous_kernel(old, prefix_len, split_len):
    """T == 1: the whole split as one loop gives the previous kernel's bits (prefix ending
    inside a tile, on a tile bound, rows over one and several splits)."""
    assert_same_bits(*both(old, 1, prefix_len, 6, 1, 16, split_len=split_len, seed=prefix_len))


@pytest.mark.parametrize("t,prefix_len,mask", [(12, 57, "tree"), (20, 120, "tree"), (9, 0, "causal"),
                                               (70, 3, "tree"), (5, 190, "causal")])
def test_tree_calls_equal_previous_kernel(old, t, prefix_len, mask):
    """Verify-sized and prefill-sized calls, merged in the kernel now: same bits."""
    assert_same_bits(*both(old, t, prefix_len, 4, 2, 16, mask=mask, split_len=64, seed=t))


def test_counters_are_reset_by_every_launch(old):
    """The last program of each column puts its counter back to 0: a second call (a graph
    replay reuses the same counters) merges exactly as the first."""
    first, ref = both(old, 7, 150, 4, 2, 16, split_len=64, seed=3)
    assert counters_are_zero()
    second, _ = both(old, 7, 150, 4, 2, 16, split_len=64, seed=3)
    assert torch.equal(first, second) and torch.equal(first, ref)
    assert counters_are_zero()


# ----------------------------------------------------------------------------- GPU (real shapes)

HEADS = {"1.5b": (12, 2), "8b": (32, 8)}


@gpu_only
@pytest.mark.parametrize("shape", list(HEADS))
@pytest.mark.parametrize("context,table_blocks", [(512, 38), (2048, 528), (8192, 528), (512, 528)])
def test_gpu_ar_step_equals_previous_kernel(old, shape, context, table_blocks):
    """The AR step at the real head shapes and the engine's cache sizes (capacity 608 / 8448 of
    16-slot blocks: 3 and 33 splits of 256), bf16: bitwise the previous kernel."""
    n_heads, n_kv = HEADS[shape]
    new_out, old_out = both(old, 1, context, n_heads, n_kv, 128, dtype=torch.bfloat16, table_blocks=table_blocks)
    assert split_len_for(table_blocks * 16) == 256
    assert_same_bits(new_out, old_out)
    assert counters_are_zero()


@gpu_only
@pytest.mark.parametrize("shape", list(HEADS))
@pytest.mark.parametrize("t,context,mask", [(16, 512, "tree"), (64, 512, "tree"), (64, 4096, "tree"),
                                            (128, 4096, "tree"), (256, 4096, "tree"), (512, 3000, "causal")])
def test_gpu_calls_equal_previous_kernel(old, shape, t, context, mask):
    n_heads, n_kv = HEADS[shape]
    new_out, old_out = both(old, t, context, n_heads, n_kv, 128, mask=mask, dtype=torch.bfloat16, table_blocks=528)
    assert_same_bits(new_out, old_out)
    assert counters_are_zero()


@gpu_only
@pytest.mark.parametrize("shape", list(HEADS))
@pytest.mark.parametrize("t,prefix_len", [(16, 512), (64, 512), (64, 3000)])
def test_gpu_rows_equal_their_ar_step(shape, t, prefix_len):
    """Every tree row is bitwise its AR step (the AR step now takes the one-loop path)."""
    n_heads, n_kv = HEADS[shape]
    assert_batch_invariant(t, prefix_len, n_heads, n_kv, 128, split_len=256, dtype=torch.bfloat16, seed=t)


@gpu_only
@pytest.mark.parametrize("t", [1, 64])
def test_gpu_graph_replays_equal_previous_kernel(old, t):
    """Captured once, replayed across prefix lengths (1, 2 and 3+ splits): each replay's bits are
    the previous kernel's, so the in-kernel counters are back at 0 after every replay."""
    n_heads, n_kv, d = HEADS["1.5b"][0], HEADS["1.5b"][1], 128
    q, k_pool, v_pool, table, tree_mask = make_inputs(t, 3000, n_heads, n_kv, d, dtype=torch.bfloat16)
    keys = visible_keys(tree_mask)
    prefix = torch.tensor([3000], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)

    def step():
        paged_tree_attention_triton(q, k_pool, v_pool, table, prefix, keys, d ** -0.5, out=out)

    step()  # compile and allocate outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for prefix_len in (3000, 100, 300, 0, 2999, 3000, 600):
        prefix.fill_(prefix_len)
        for _ in range(2):
            graph.replay()
        ref = old.paged_tree_attention_triton(q, k_pool, v_pool, table, prefix_len, tree_mask, d ** -0.5)
        assert_same_bits(out, ref)
    torch.cuda.synchronize()
    assert counters_are_zero()


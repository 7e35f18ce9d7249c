"""The Gated DeltaNet tree walk (kernels/gated_delta.py) against its torch reference on random
trees, and batch invariance: every node's output is bitwise the AR step's after its path. Small
heads under the interpreter on a CPU; on a GPU also Qwen3.6-35B-A3B's head shape and 256 nodes."""
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

from jetspec_chat.kernels.gated_delta import gated_delta_path_triton, gated_delta_tree_triton
from jetspec_chat.kernels.reference import ancestor_mask_ref, gated_delta_path_ref, gated_delta_tree_ref

sys.path.insert(0, str(Path(__file__).parent))
from sm90 import run_compile_script  # noqa: E402

K_HEADS, V_HEADS, DK, DV = 2, 4, 16, 64  # two value blocks of 32 per head; key heads shared by 2
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _parents(shape: str, t: int, gen: torch.Generator) -> list[int]:
    if shape == "chain":
        return [-1] + list(range(t - 1))
    if shape == "depth1":
        return [-1] + [0] * (t - 1)
    if shape == "forest":  # padding-like roots beside a tree
        return [-1, 0, 0, 1, -1, -1, 3, 6][:t]
    # bushy: each node's parent is a random earlier node
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, t)]


def _operands(t: int, dtype: torch.dtype, gen: torch.Generator, heads=(K_HEADS, V_HEADS, DK, DV)):
    """Views of one conv output row per node, as the layer hands them over."""
    hk, h, dk, dv = heads
    mixed = torch.randn(t, 2 * hk * dk + h * dv, generator=gen).to(dtype).to(DEVICE)
    q = mixed[:, : hk * dk].unflatten(-1, (hk, dk))
    k = mixed[:, hk * dk : 2 * hk * dk].unflatten(-1, (hk, dk))
    v = mixed[:, 2 * hk * dk :].unflatten(-1, (h, dv))
    g = -torch.rand(t, h, generator=gen).to(DEVICE)
    beta = torch.rand(t, h, generator=gen).to(DEVICE)
    state = (torch.randn(h, dk, dv, generator=gen) * 0.3).to(DEVICE)
    return q, k, v, g, beta, state


def _mask(parents):
    depth = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    return ancestor_mask_ref(torch.tensor(parents, device=DEVICE), max(depth))


@pytest.mark.parametrize("shape,t", [("chain", 9), ("depth1", 6), ("bushy", 12), ("bushy", 1), ("forest", 8)])
def test_tree_walk_matches_reference(shape, t, poisoned_alloc):
    gen = torch.Generator().manual_seed(t)
    parents = _parents(shape, t, gen)
    mask = _mask(parents)
    q, k, v, g, beta, state = _operands(t, torch.float32, gen)
    ours = gated_delta_tree_triton(q, k, v, g, beta, mask, state)
    ref = gated_delta_tree_ref(q, k, v, g, beta, mask, state)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)
    # The commit: the state of every node equals the reference's replay of its path.
    for node in range(t):
        path = mask[node].nonzero()[:, 0]
        padded = torch.cat([path, torch.zeros(3, dtype=path.dtype, device=DEVICE)])  # entries past count: ignored
        count = torch.tensor(len(path), device=DEVICE)
        got, want = torch.empty_like(state), torch.empty_like(state)
        gated_delta_path_triton(q, k, v, g, beta, padded, count, state, got)
        gated_delta_path_ref(q, k, v, g, beta, padded, count, state, want)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_node_equals_the_ar_step_bitwise(dtype):
    """Commit a node's parent path (the kernel's commit), then run the node alone as a one-token
    tree: its output is bitwise the one the whole tree gave it."""
    gen = torch.Generator().manual_seed(3)
    parents = [-1, 0, 0, 1, 1, 2, 3, 5, 5, 6, 9, 10]  # branching at several depths, not depth-first
    mask = _mask(parents)
    t = len(parents)
    q, k, v, g, beta, state = _operands(t, dtype, gen)
    tree_out = gated_delta_tree_triton(q, k, v, g, beta, mask, state)
    one = torch.ones(1, 1, dtype=torch.bool, device=DEVICE)
    for i, p in enumerate(parents):
        before = state.clone()
        if p >= 0:
            path = mask[p].nonzero()[:, 0]
            gated_delta_path_triton(q, k, v, g, beta, path, len(path), state, before)
        ar = gated_delta_tree_triton(q[i : i + 1], k[i : i + 1], v[i : i + 1], g[i : i + 1], beta[i : i + 1], one, before)
        assert torch.equal(ar[0], tree_out[i]), i


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_real_shape_tree_on_cuda():
    """Qwen3.6-35B-A3B's linear-attention heads (16 key, 32 value heads of 128), a random
    256-node tree in bf16: the reference's outputs and commit, and a sample of nodes bitwise
    equal to their AR step."""
    gen = torch.Generator().manual_seed(7)
    t = 256
    parents = _parents("bushy", t, gen)
    mask = _mask(parents)
    q, k, v, g, beta, state = _operands(t, torch.bfloat16, gen, heads=(16, 32, 128, 128))
    ours = gated_delta_tree_triton(q, k, v, g, beta, mask, state)
    torch.testing.assert_close(ours, gated_delta_tree_ref(q, k, v, g, beta, mask, state), rtol=1e-3, atol=1e-4)
    one = torch.ones(1, 1, dtype=torch.bool, device=DEVICE)
    for i in (0, 1, 17, 100, 255):
        p = parents[i]
        before = state.clone()
        if p >= 0:
            path = mask[p].nonzero()[:, 0]
            gated_delta_path_triton(q, k, v, g, beta, path, len(path), state, before)
        ar = gated_delta_tree_triton(q[i : i + 1], k[i : i + 1], v[i : i + 1], g[i : i + 1], beta[i : i + 1], one, before)
        assert torch.equal(ar[0], ours[i]), i


def test_compiles_for_sm90_without_spills():
    """Offline sm_90 compile at the real head shapes: the state tile stays in registers."""
    out = run_compile_script("sm90_gated_delta_compile.py", [])
    assert len(out) == 4
    assert all(r["local"] == 0 and r["regs"] is not None and r["regs"] <= 128 for r in out), out

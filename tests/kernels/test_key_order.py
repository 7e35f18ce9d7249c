"""visible_keys_triton (kernels/key_order.py) against the torch reference visible_keys_ref: the
same order and count tensors, every entry, for random, tree, causal, full and empty masks of
one block, a block's edge and several blocks. On the CPU the kernel runs in Triton's interpreter."""
import pytest
import torch

pytest.importorskip("triton")

from jetspec_chat.kernels import ancestor_mask_ref, visible_keys, visible_keys_ref, visible_keys_triton  # noqa: E402
from jetspec_chat.kernels.key_order import MAX_BLOCK  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SIZES = [1, 2, 63, 64, 65, 256, 300, 700]


@pytest.fixture
def poisoned_ints(monkeypatch):
    """Every int32 tensor torch.empty hands out starts as -7: an entry the kernel leaves unwritten
    shows (the reference's entries are all in 0..T)."""
    real_empty = torch.empty

    def empty(*args, **kwargs):
        x = real_empty(*args, **kwargs)
        return x.fill_(-7) if x.dtype == torch.int32 else x

    monkeypatch.setattr(torch, "empty", empty)


def random_parents(t: int, gen: torch.Generator) -> torch.Tensor:
    """A tree in topological order: node 0 the root, each other node's parent an earlier node."""
    parents = [-1] + [int(torch.randint(0, i, (), generator=gen)) for i in range(1, t)]
    return torch.tensor(parents)


def mask_of(kind: str, t: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1000 + t)
    if kind == "random":
        return torch.rand(t, t, generator=gen) < torch.rand((), generator=gen)
    if kind == "tree":
        return ancestor_mask_ref(random_parents(t, gen), t)
    if kind == "chain":  # a tree of one path: the causal mask built from parent pointers
        return ancestor_mask_ref(torch.arange(t) - 1, t)
    if kind == "causal":
        return torch.ones(t, t, dtype=torch.bool).tril()
    if kind == "full":
        return torch.ones(t, t, dtype=torch.bool)
    if kind == "empty":
        return torch.zeros(t, t, dtype=torch.bool)
    raise ValueError(kind)


def assert_same(mask: torch.Tensor) -> None:
    order, count = visible_keys_triton(mask)
    ref_order, ref_count = visible_keys_ref(mask)
    assert order.dtype == count.dtype == torch.int32
    assert order.shape == ref_order.shape and count.shape == ref_count.shape
    assert torch.equal(count, ref_count), (count, ref_count)
    assert torch.equal(order, ref_order), (order != ref_order).nonzero()[:8]


@pytest.mark.parametrize("t", SIZES)
@pytest.mark.parametrize("kind", ["random", "tree", "causal"])
def test_kernel_equals_reference(kind, t, poisoned_ints, checked_pointers):
    if (kind == "tree" and t > 256) or (kind == "causal" and t > 300):
        pytest.skip("trees are at most 256 nodes; 300 covers a causal row of two blocks")
    assert_same(mask_of(kind, t).to(DEVICE))


@pytest.mark.parametrize("t", [1, 64, 65, 257])
@pytest.mark.parametrize("kind", ["full", "empty", "chain"])
def test_kernel_equals_reference_on_edge_masks(kind, t, poisoned_ints):
    assert_same(mask_of(kind, t).to(DEVICE))


def test_block_edges_and_strided_masks(poisoned_ints):
    """A row whose visible columns end exactly at, just before and just after a block edge, and
    masks read through strides (a transpose, a slice of a wider mask)."""
    t = MAX_BLOCK + 44
    mask = torch.zeros(t, t, dtype=torch.bool)
    for row, last in enumerate([MAX_BLOCK - 1, MAX_BLOCK, MAX_BLOCK + 1, t - 1]):
        mask[row, : last + 1] = True
    mask[10, MAX_BLOCK:] = True  # nothing in the first block
    mask[11, ::MAX_BLOCK] = True
    assert_same(mask.to(DEVICE))
    tree = mask_of("tree", 100, seed=1).to(DEVICE)
    assert_same(tree.t())
    wide = mask_of("random", 130, seed=2).to(DEVICE)
    assert_same(wide[3:68, 3:68])  # a square slice with a row stride of 130
    assert_same(wide[::2, ::2])


def test_visible_keys_dispatch_and_rejects_non_square():
    mask = mask_of("tree", 40, seed=3).to(DEVICE)
    keys = visible_keys(mask, shared=False)
    ref_order, ref_count = visible_keys_ref(mask)
    assert torch.equal(keys.order, ref_order) and torch.equal(keys.count, ref_count) and not keys.shared
    with pytest.raises(AssertionError, match="square bool mask"):
        visible_keys_triton(torch.ones(3, 4, dtype=torch.bool))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernel_in_a_cuda_graph():
    """Captured once and replayed on new masks of the same shape: each replay's outputs equal the
    reference of the mask it read (no host values baked in)."""
    t = 64
    static = mask_of("tree", t).cuda()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        visible_keys_triton(static)  # compile outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        order, count = visible_keys_triton(static)
    for seed in range(4):
        static.copy_(mask_of("tree" if seed % 2 else "random", t, seed=seed + 10).cuda())
        graph.replay()
        ref_order, ref_count = visible_keys_ref(static)
        assert torch.equal(order, ref_order) and torch.equal(count, ref_count)

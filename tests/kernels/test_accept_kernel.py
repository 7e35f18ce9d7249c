"""The one-launch acceptance and packing (kernels/accept.py) against the torch code it replaces
(engine/accept.py: accept + pack_round), bit for bit.

On a CPU the kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py); the
GPU tests add the engine's bucket sizes, CUDA-graph replay and finish_round on CUDA.
"""
from __future__ import annotations

import contextlib
import random
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

sys.path.insert(0, str(Path(__file__).parent))
from sm90 import run_compile_script  # noqa: E402

from jetspec_chat.engine.accept import accept, finish_round, pack_round, unpack_round
from jetspec_chat.engine.kv_cache import PagedKVCache
from jetspec_chat.engine.tree import Tree, ancestor_mask, root_only
from jetspec_chat.kernels.accept import accept_pack_triton

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
gpu_only = pytest.mark.skipif(not CUDA, reason="needs a GPU")
VOCAB = 6  # small: drafted tokens often equal the target's choices


def random_tree(rng: random.Random, n: int, chain: float = 0.0) -> Tree:
    """A valid tree of n nodes: parents before children, distinct sibling tokens. `chain`: the
    chance a node hangs under the previous one (deeper trees)."""
    parents = [-1] + [i - 1 if rng.random() < chain else rng.randrange(i) for i in range(1, n)]
    tokens = [rng.randrange(VOCAB)]
    for i in range(1, n):
        used = {tokens[k] for k in range(1, i) if parents[k] == parents[i]}
        free = [t for t in range(VOCAB + n) if t not in used]
        tokens.append(rng.choice(free[:VOCAB] if len(free) >= VOCAB else free))
    depths = [0] * n
    for i in range(1, n):
        depths[i] = depths[parents[i]] + 1
    p = torch.tensor(parents)
    return Tree(torch.tensor(tokens), p, torch.tensor(depths), torch.randn(n, generator=torch.Generator().manual_seed(n)),
                ancestor_mask(p, max(depths)), max(depths))


def follow_choices(rng: random.Random, tree: Tree, follow: float) -> torch.Tensor:
    """The target's choice at each node: with chance `follow` one of its children's tokens (a
    longer accepted path), else a random token."""
    parents = tree.parents.tolist()
    out = []
    for i in range(tree.size):
        kids = [c for c, q in enumerate(parents) if q == i]
        out.append(int(tree.tokens[rng.choice(kids)]) if kids and rng.random() < follow else rng.randrange(VOCAB + 3))
    return torch.tensor(out)


def pad(tree: Tree, size: int, rng: random.Random) -> Tree:
    """Padded as a verify bucket pads (entries past the real nodes are stale values: here the
    root's parent -1, which always matches, and deep depths); the padding sees only itself."""
    n, extra = tree.size, size - tree.size
    ancestors = torch.eye(size, dtype=torch.bool)
    ancestors[:n, :n] = tree.ancestors
    return Tree(
        tokens=torch.cat([tree.tokens, torch.randint(0, VOCAB, (extra,))]),
        parents=torch.cat([tree.parents, torch.full((extra,), -1)]),
        depths=torch.cat([tree.depths, torch.tensor([rng.randrange(1, 12) for _ in range(extra)], dtype=torch.long)]),
        scores=torch.cat([tree.scores, torch.randn(extra)]),
        ancestors=ancestors,
        max_depth=tree.max_depth,
    )


def on(tree: Tree, device) -> Tree:
    return Tree(tree.tokens.to(device), tree.parents.to(device), tree.depths.to(device), tree.scores.to(device),
                tree.ancestors.to(device), tree.max_depth)


def check(tree: Tree, choices: torch.Tensor, size, path_len: int) -> None:
    """The kernel on `tree` against accept + pack_round on the CPU."""
    want = accept(tree, choices, size, path_len)
    want_packed = pack_round(tree, want)
    t = on(tree, DEVICE)
    dsize = size.to(DEVICE) if isinstance(size, torch.Tensor) else size
    head, packed = accept_pack_triton(t.tokens, t.parents, t.depths, t.ancestors, t.scores, choices.to(DEVICE),
                                      dsize, path_len)
    assert head.dtype == torch.long and packed.dtype == torch.int32
    assert packed.shape == want_packed.shape
    got_packed = packed.cpu()
    assert torch.equal(got_packed, want_packed), f"packed differs at {torch.nonzero(got_packed != want_packed).flatten()[:8].tolist()}"
    assert torch.equal(head[2:].cpu(), want.path) and want.path.dtype == torch.long
    assert torch.equal(head[0].cpu(), want.count) and torch.equal(head[1].cpu(), want.bonus)
    assert want.count.dtype == want.bonus.dtype == torch.long and want.count.dim() == 0


@pytest.mark.parametrize("n", [1, 2, 16, 33, 64, 128])
def test_kernel_equals_torch_on_random_trees(n):
    rng = random.Random(n)
    for trial in range(4 if n <= 64 else 2):
        tree = random_tree(rng, n, chain=rng.choice([0.0, 0.5, 0.9]))
        choices = follow_choices(rng, tree, follow=rng.choice([0.0, 0.6, 1.0]))
        check(tree, choices, None, tree.max_depth + 1)


def test_kernel_accepts_the_full_depth_and_nothing():
    rng = random.Random(1)
    tree = random_tree(rng, 40, chain=0.8)
    full = follow_choices(rng, tree, follow=1.0)
    acc = accept(tree, full)
    assert int(acc.count) >= 2  # the checks below cover a path past the root
    check(tree, full, None, tree.max_depth + 1)
    nothing = torch.full((tree.size,), VOCAB + 100)  # no child matches anywhere: the root only
    assert int(accept(tree, nothing).count) == 1
    check(tree, nothing, None, tree.max_depth + 1)


@pytest.mark.parametrize("size_kind", ["int", "tensor"])
def test_padding_is_never_accepted(size_kind):
    """A bucket-padded tree: the padding's parent -1 always matches, its depths run deeper than
    the tree, and its tokens are what the target chose; it must still never be accepted."""
    rng = random.Random(7)
    for n, bucket in [(1, 1), (1, 16), (5, 16), (20, 32), (40, 64), (100, 128)]:
        tree = random_tree(rng, n, chain=0.6)
        big = pad(tree, bucket, rng)
        choices = torch.cat([follow_choices(rng, tree, 0.8), big.tokens[n:]])
        size = torch.tensor(n) if size_kind == "tensor" else n
        path_len = min(bucket, 16)
        path_len = max(path_len, tree.max_depth + 1)
        check(big, choices, size, path_len)


def test_the_ar_round_and_a_path_longer_than_the_tree():
    """N = 1 (the AR round: a root-only tree), and path_len past every depth (levels past the
    accepted depth point at node 0, as an all-zero row's argmax does)."""
    root = root_only(torch.tensor(3))
    check(root, torch.tensor([4]), torch.tensor(1), 1)
    check(root, torch.tensor([4]), None, 5)
    rng = random.Random(3)
    tree = random_tree(rng, 12, chain=0.5)
    check(tree, follow_choices(rng, tree, 1.0), None, tree.max_depth + 9)
    check(tree, follow_choices(rng, tree, 1.0), 7, 40)  # P > N as well


def test_ties_go_to_the_first_index_across_row_blocks():
    """Nodes whose parent is -1 always match: with size None every such node is accepted, so many
    accepted nodes share the deepest depth (not a valid tree, but torch's argmax semantics: the
    first index of the maximum), here across the kernel's blocks of ancestor rows."""
    rng = random.Random(5)
    for n in (64, 200, 256):
        tree = random_tree(rng, 8, chain=0.9)
        big = pad(tree, n, rng)
        choices = torch.cat([follow_choices(rng, tree, 1.0), big.tokens[8:]])
        check(big, choices, None, 12)


def test_arbitrary_masks_follow_torch_semantics():
    """Random masks, parents and depths (no tree at all): every rule of the torch code (clamped
    parent gather, ancestor-or-self rejection, first index of the deepest, first node per level,
    int32 truncation, score bits) holds on any input."""
    g = torch.Generator().manual_seed(0)
    for n in (3, 17, 70, 130):
        tokens = torch.randint(-(2**40), 2**40, (n,), generator=g)
        tokens[::2] = torch.randint(0, 4, (n - n // 2,), generator=g)
        parents = torch.randint(-3, n, (n,), generator=g)
        depths = torch.randint(-5, 6, (n,), generator=g)  # accepted nodes may key below the rejected (-1)
        ancestors = torch.rand(n, n, generator=g) < 0.05
        scores = torch.randn(n, generator=g)
        scores[0], scores[-1] = float("-inf"), float("nan")
        choices = torch.randint(0, 4, (n,), generator=g)
        tree = Tree(tokens, parents, depths, scores, ancestors, 5)
        for size, path_len in ((None, 8), (n // 2, 40), (torch.tensor(1), 3)):  # 40: several blocks of levels
            check(tree, choices, size, path_len)


def test_every_node_accepted_below_depth_zero():
    """Roots only (parent -1 always matches), all accepted, all of negative depth: the deepest is
    still the first index of the largest depth, however low (rows past N never compete)."""
    for depths in ([-4, -3, -5], [-9, -7, -7, -8, -9]):
        n = len(depths)
        tree = Tree(torch.arange(n), torch.full((n,), -1), torch.tensor(depths), torch.zeros(n),
                    torch.eye(n, dtype=torch.bool), 0)
        check(tree, torch.arange(n), None, 2)


def test_a_strided_ancestor_mask():
    """The adaptive builder's trees slice a bigger mask: rows of stride > N."""
    rng = random.Random(9)
    tree = random_tree(rng, 30, chain=0.5)
    big = pad(tree, 50, rng)
    sliced = Tree(tree.tokens, tree.parents, tree.depths, tree.scores, big.ancestors[:30, :30], tree.max_depth)
    assert not sliced.ancestors.is_contiguous()
    check(sliced, follow_choices(rng, tree, 0.9), None, tree.max_depth + 1)


def test_sm90_compile_at_every_bucket_does_not_spill():
    """The AR round's launch (every int argument 1, which Triton passes as a constant) and the
    buckets up to 1024 nodes compile for sm_90 and stay in registers."""
    out = run_compile_script("sm90_accept_compile.py", [])
    assert [o["n"] for o in out] == [1, 1, 16, 16, 64, 64, 256, 256, 1024, 1024, 64]
    for o in out:
        assert o["local"] == 0, o


@gpu_only
@pytest.mark.parametrize("n", [256, 512, 1024])
def test_kernel_equals_torch_at_large_sizes(n):
    rng = random.Random(n)
    tree = random_tree(rng, n, chain=0.9)
    check(tree, follow_choices(rng, tree, 0.95), None, tree.max_depth + 1)
    half = random_tree(rng, n // 2, chain=0.7)
    big = pad(half, n, rng)
    check(big, torch.cat([follow_choices(rng, half, 0.9), big.tokens[n // 2:]]), torch.tensor(n // 2), 64)


@gpu_only
def test_kernel_replays_in_a_cuda_graph():
    """Captured once with the size as a device scalar, replayed on other trees and sizes."""
    rng = random.Random(11)
    n, path_len = 64, 16
    first = on(pad(random_tree(rng, 20, chain=0.6), n, rng), "cuda")
    static = Tree(*(x.clone() for x in (first.tokens, first.parents, first.depths, first.scores, first.ancestors)), 15)
    choices = torch.zeros(n, dtype=torch.long, device="cuda")
    size = torch.tensor(20, device="cuda")
    for _ in range(2):  # compile and warm up outside the capture
        accept_pack_triton(static.tokens, static.parents, static.depths, static.ancestors, static.scores, choices, size, path_len)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        head, packed = accept_pack_triton(static.tokens, static.parents, static.depths, static.ancestors, static.scores,
                                          choices, size, path_len)
    for real in (20, 5, 40, 1):
        tree = random_tree(rng, real, chain=0.7)
        big = pad(tree, n, rng)
        want_choices = torch.cat([follow_choices(rng, tree, 0.8), big.tokens[real:]])
        for dst, src in zip((static.tokens, static.parents, static.depths, static.scores, static.ancestors, choices),
                            (big.tokens, big.parents, big.depths, big.scores, big.ancestors, want_choices)):
            dst.copy_(src)
        size.fill_(real)
        graph.replay()
        want = accept(big, want_choices, torch.tensor(real), path_len)
        assert torch.equal(packed.cpu(), pack_round(big, want))
        assert torch.equal(head.cpu(), torch.cat([want.count[None], want.bonus[None], want.path]))


def round_results(tree: Tree, choices: torch.Tensor, pool: torch.Tensor, device: str, size, path_len,
                  guard=contextlib.nullcontext) -> tuple:
    """finish_round (inside `guard()`) on `device` from a KV pool's contents: the packed round,
    the pool after the commit, the lengths, the anchor and the draft-context append, on the CPU."""
    kv = PagedKVCache(2, 2, 4, 256 + 1024, torch.device(device), torch.float32, block_size=4)
    kv.pool.copy_(pool)
    kv.length = 9
    anchor = torch.tensor(-1, device=device)
    appended = []
    taps = torch.arange(tree.size * 6, dtype=torch.float32).view(tree.size, 6)
    size = size.to(device) if isinstance(size, torch.Tensor) else size
    tree, choices, taps = on(tree, device), choices.to(device), taps.to(device)
    with guard():
        out = finish_round(tree, choices, kv, taps, anchor, lambda rows, count: appended.append((rows, count)), size, path_len)
    (rows, count), = ((rows.cpu(), count.cpu()) for rows, count in appended)
    assert count.dtype == torch.long and count.dim() == 0  # what the draft cache advances by
    return out.ints.cpu(), out.path_len, kv.pool.cpu(), int(kv.device_length), kv.length, int(anchor), rows, count


def assert_same_rounds(a: tuple, b: tuple) -> None:
    for x, y in zip(a, b):
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y


def finish_round_cases(rng: random.Random):
    """(tree, choices, size, path_len): exact trees (the eager round) and bucket-padded ones
    (the graphed round), the AR round's one-node tree among them."""
    for n in (1, 1, 5, 30, 64):
        tree = random_tree(rng, n, chain=0.6)
        yield tree, follow_choices(rng, tree, 0.8), None, None
        bucket = 1 if n == 1 else 64
        big = pad(tree, bucket, rng)
        yield big, torch.cat([follow_choices(rng, tree, 0.8), big.tokens[n:]]), torch.tensor(n), max(min(bucket, 16), tree.max_depth + 1)


@pytest.mark.skipif(CUDA, reason="the interpreter's check: on a GPU the kernel takes CUDA tensors (the next test)")
def test_finish_round_through_the_kernel_equals_the_torch_round(monkeypatch):
    """finish_round with the kernel (forced on, interpreted on the CPU) against its torch path:
    the same packed round, committed rows, draft-context append, lengths and anchor, with no host
    reads of device values."""
    from engine_helpers import NoHostReads
    import jetspec_chat.engine.accept as accept_module

    rng = random.Random(13)
    pool = PagedKVCache(2, 2, 4, 256 + 1024, torch.device("cpu"), torch.float32, block_size=4).pool.normal_()
    for tree, choices, size, path_len in finish_round_cases(rng):
        want = round_results(tree, choices, pool, "cpu", size, path_len)
        with monkeypatch.context() as m:
            m.setattr(accept_module, "triton_accepts", lambda choices, n: True)
            got = round_results(tree, choices, pool, "cpu", size, path_len, NoHostReads)
        assert_same_rounds(got, want)
        r = unpack_round(got[0], got[1], tree.size if size is None else int(size))
        assert (r.count, r.bonus) == (int(accept(tree, choices, size, path_len).count), got[5])


@gpu_only
def test_finish_round_on_cuda_equals_the_cpu_round():
    """finish_round through the kernel (CUDA) against the torch path (CPU)."""
    rng = random.Random(17)
    pool = PagedKVCache(2, 2, 4, 256 + 1024, torch.device("cpu"), torch.float32, block_size=4).pool.normal_()
    for tree, choices, size, path_len in finish_round_cases(rng):
        assert_same_rounds(round_results(tree, choices, pool, "cuda", size, path_len),
                           round_results(tree, choices, pool, "cpu", size, path_len))

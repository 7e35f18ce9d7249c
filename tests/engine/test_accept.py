"""Acceptance rules on hand-made trees; the whole post-verify step (finish_round) on random ones."""
import random

import pytest
import torch

from engine_helpers import NoHostReads
from jetspec_chat.engine.accept import accept, finish_round, unpack_round
from jetspec_chat.engine.sampling import processed_probs
from jetspec_chat.engine.graphs import TREE_BUCKETS, bucket_for
from jetspec_chat.engine.kv_cache import PagedKVCache
from jetspec_chat.engine.params import SamplingParams
from jetspec_chat.engine.tree import TREE_BUILDERS, Tree, ancestor_mask, root_only


def make_tree(tokens, parents):
    parents_t = torch.tensor(parents)
    depths = [0] * len(parents)
    for i in range(1, len(parents)):
        depths[i] = depths[parents[i]] + 1
    return Tree(torch.tensor(tokens), parents_t, torch.tensor(depths), torch.zeros(len(tokens)),
                ancestor_mask(parents_t, max(depths)), max(depths))


def path_of(acc):
    return acc.path[: int(acc.count)].tolist()


#        0(root=5)
#       /    \
#     1(a=10) 2(b=11)
#     |        |
#     3(12)    4(13)
#     |
#     5(14)
TREE = make_tree([5, 10, 11, 12, 13, 14], [-1, 0, 0, 1, 2, 3])


def test_greedy_follows_the_matching_child_to_the_deepest_node():
    # target choice at each node (what comes after that node)
    choices = torch.tensor([10, 12, 99, 14, 98, 77])
    acc = accept(TREE, choices)
    assert path_of(acc) == [0, 1, 3, 5]
    assert int(acc.bonus) == 77


def test_rejection_at_the_root_gives_the_target_token():
    acc = accept(TREE, torch.tensor([42, 12, 13, 14, 0, 0]))
    assert path_of(acc) == [0]
    assert int(acc.bonus) == 42


def test_second_branch_and_a_mismatch_deeper():
    acc = accept(TREE, torch.tensor([11, 0, 13, 0, 55, 0]))
    assert path_of(acc) == [0, 2, 4]
    assert int(acc.bonus) == 55


def test_a_matching_node_under_a_rejected_parent_is_not_accepted():
    # node 3's token (12) equals the choice at node 1, but node 1 itself is rejected
    acc = accept(TREE, torch.tensor([99, 12, 0, 14, 0, 0]))
    assert path_of(acc) == [0]


def test_processed_probs_top_k_top_p():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    p = processed_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (p[0, 2:] == 0).all() and abs(float(p.sum()) - 1) < 1e-6
    full = torch.softmax(logits, -1)[0]
    p = processed_probs(logits, SamplingParams(temperature=1.0, top_p=float(full[0]) + 1e-3))
    assert (p[0, :2] > 0).all() and (p[0, 2:] == 0).all()
    p = processed_probs(logits, SamplingParams(temperature=1.0, top_p=0.01))
    assert float(p[0, 0]) == 1.0


# ---------------------------------------------------------------- finish_round (the post-verify step)
VOCAB = 12  # small, so drafted tokens often equal the target's choices


def random_tree(rng: random.Random, algo: str):
    """A tree from one of the engine's builders on random draft log-probs, or (algo 'random')
    random parent pointers; siblings always carry distinct tokens."""
    if algo == "random":
        n = rng.randint(1, 40)
        parents = [-1] + [rng.randrange(i) for i in range(1, n)]
        tokens = [rng.randrange(VOCAB)]
        for i in range(1, n):
            used = {tokens[j] for j in range(1, i) if parents[j] == parents[i]}
            tokens.append(rng.choice([t for t in range(VOCAB) if t not in used]))
        return make_tree(tokens, parents)
    depth = rng.randint(1, 8)
    logp = torch.log_softmax(torch.randn(depth, VOCAB, generator=torch.Generator().manual_seed(rng.randrange(1 << 30))) * 3, -1)
    return TREE_BUILDERS[algo](torch.tensor(rng.randrange(VOCAB)), logp, rng.choice([2, 5, 16, 33, 64]), rng.randint(1, 6))


def follow_choices(rng: random.Random, tree) -> torch.Tensor:
    """Target choices that usually continue into the tree (long accepted paths), else random."""
    parents = tree.parents.tolist()
    choices = []
    for i in range(tree.size):
        kids = [c for c, p in enumerate(parents) if p == i]
        take = kids and rng.random() < 0.75
        choices.append(int(tree.tokens[rng.choice(kids)]) if take else rng.randrange(VOCAB))
    return torch.tensor(choices)


def reference_accept(tree, choices: list[int]) -> tuple[list[int], int]:
    """Step by step: from the root, follow the child whose token is the target's choice."""
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    path = [0]
    while True:
        kids = [c for c, p in enumerate(parents) if p == path[-1] and tokens[c] == choices[path[-1]]]
        if not kids:
            return path, choices[path[-1]]
        path.append(kids[0])


def padded(tree, size: int, rng: random.Random):
    """The tree padded as a verify bucket pads it, with hostile padding: parent -1 (the root's,
    which always 'matches'), deep depths, and the tokens the target chose; its mask is the
    bucket's (padding sees only itself)."""
    n, pad = tree.size, size - tree.size
    ancestors = torch.eye(size, dtype=torch.bool)
    ancestors[:n, :n] = tree.ancestors
    return Tree(
        tokens=torch.cat([tree.tokens, torch.randint(0, VOCAB, (pad,))]),
        parents=torch.cat([tree.parents, torch.full((pad,), -1)]),
        depths=torch.cat([tree.depths, torch.full((pad,), 5 + rng.randrange(10))]),
        scores=torch.cat([tree.scores, torch.randn(pad)]),
        ancestors=ancestors,
        max_depth=tree.max_depth,
    )


def logical_rows(kv: PagedKVCache, rows: int) -> torch.Tensor:
    flat = kv.pool.view(kv.pool.shape[0], 2, -1, *kv.pool.shape[4:])
    return flat[:, :, kv.slots_of(torch.arange(rows))].clone()


@pytest.mark.parametrize("algo", ["random", "accum_logp", "chain", "adaptive"])
@pytest.mark.parametrize("pad", [False, True])
def test_finish_round_equals_the_step_by_step_round(algo, pad):
    """finish_round (accept + KV commit + packing + next anchor) against a plain step-by-step
    reference, on random trees, eagerly (the CPU path) and padded to a verify bucket with
    device-scalar lengths (what the CUDA graph captures), with no host reads of device values."""
    rng = random.Random(hash((algo, pad)) & 0xFFFF)
    for trial in range(25):
        tree = random_tree(rng, algo)
        n = tree.size
        choices = follow_choices(rng, tree)
        path, bonus = reference_accept(tree, choices.tolist())
        kv = PagedKVCache(2, 2, 4, 128 + 1024, torch.device("cpu"), torch.float32, block_size=4)
        kv.block_table = torch.randperm(kv.capacity // kv.block_size).int()  # any block order
        kv.pool.normal_()
        base = rng.randint(1, 100)
        kv.length = base
        before = logical_rows(kv, base + n)
        taps = torch.randn(n, 6)
        anchor = torch.tensor(-1)
        appended = []

        def append(rows, count, appended=appended):  # records the draft-context append
            appended.append((rows.clone(), count.clone()))
        if pad:
            size = bucket_for(n, TREE_BUCKETS)
            path_len = min(size, rng.choice([tree.max_depth + 1, 16]))  # as a bucket's (>= any real depth + 1)
            path_len = max(path_len, tree.max_depth + 1)
            big = padded(tree, size, rng)
            big_choices = torch.cat([choices, big.tokens[n:]])  # the padding "matches" its own tokens
            big_taps = torch.cat([taps, torch.randn(size - n, 6)])
            with NoHostReads():
                out = finish_round(big, big_choices, kv, big_taps, anchor, append, torch.tensor(n), path_len)
        else:
            out = finish_round(tree, choices, kv, taps, anchor, append)
            path_len = tree.max_depth + 1
        assert out.path_len == path_len
        r = unpack_round(out.ints, out.path_len, n)
        assert (r.count, r.path, r.bonus) == (len(path), path, bonus), (trial, algo)
        assert r.tokens == tree.tokens.tolist() and r.parents == tree.parents.tolist()
        assert r.depths == tree.depths.tolist() and r.scores == tree.scores.tolist()
        assert int(anchor) == bonus
        (rows, count), = appended
        assert rows.shape[0] == path_len and int(count) == r.count  # fixed-size rows, the count to advance by
        assert torch.equal(rows[: r.count], taps[path])
        assert int(kv.device_length) == base + r.count and kv.length == base  # the host follows from the count
        after = logical_rows(kv, base + len(path))
        assert torch.equal(after[:, :, :base], before[:, :, :base])  # the committed prefix is untouched
        assert torch.equal(after[:, :, base:], before[:, :, [base + i for i in path]])  # the path moved down


def test_finish_round_reads_a_root_only_tree_before_setting_the_anchor():
    """The AR round's tree is a view of the anchor, which finish_round overwrites with the bonus."""
    anchor = torch.tensor(7)
    kv = PagedKVCache(1, 1, 2, 32, torch.device("cpu"), torch.float32)
    kv.length = 4
    out = finish_round(root_only(anchor), torch.tensor([3]), kv, None, anchor)
    r = unpack_round(out.ints, out.path_len, 1)
    assert (r.tokens, r.path, r.bonus, r.count, int(anchor)) == ([7], [0], 3, 1, 3)
    assert int(kv.device_length) == 5

"""Tree construction: fixed-shape best-first trees are exactly the top-budget prefix-closed set."""
import itertools

import pytest
import torch

from jetspec_chat.engine.tree import TREE_ALGOS, ancestor_mask, build_accum_logp, static_tree_size


def brute_force_best(logp: torch.Tensor, budget: int, width: int) -> list[float]:
    """Scores of the best budget-1 non-root nodes, by enumerating the whole K-ary tree."""
    top_lp, _ = logp.topk(width, dim=-1)
    scores = []
    for d in range(1, logp.shape[0] + 1):
        for path in itertools.product(range(width), repeat=d):
            scores.append(sum(float(top_lp[i, k]) for i, k in enumerate(path)))
    return sorted(scores, reverse=True)[: budget - 1]


def random_logp(depth, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(depth, vocab, generator=g) * 3, dim=-1)


@pytest.mark.parametrize("budget,width,depth", [(1, 4, 3), (2, 2, 3), (5, 3, 2), (16, 4, 3), (30, 3, 4), (64, 8, 3), (40, 2, 6)])
def test_accum_logp_is_the_best_prefix_closed_set(budget, width, depth):
    for seed in range(5):
        logp = random_logp(depth, 50, seed)
        tree = build_accum_logp(torch.tensor(7), logp, budget, width)
        n = tree.size
        assert n == static_tree_size(budget, width, depth)
        assert int(tree.tokens[0]) == 7 and int(tree.parents[0]) == -1 and float(tree.scores[0]) == 0.0
        # parents precede children, depth = parent depth + 1, score = parent score + logp
        top_lp, top_tok = logp.topk(width, dim=-1)
        for i in range(1, n):
            p = int(tree.parents[i])
            assert 0 <= p < i
            d = int(tree.depths[i])
            assert d == int(tree.depths[p]) + 1
            tok = int(tree.tokens[i])
            assert tok in top_tok[d - 1].tolist()
            assert float(tree.scores[i]) == pytest.approx(float(tree.scores[p]) + float(logp[d - 1, tok]), abs=1e-5)
        # siblings are distinct tokens
        pairs = {(int(tree.parents[i]), int(tree.tokens[i])) for i in range(1, n)}
        assert len(pairs) == n - 1
        # best-first: the chosen scores are the global best
        expected = brute_force_best(logp, budget, width)
        got = sorted(tree.scores[1:].tolist(), reverse=True)
        assert got == pytest.approx(expected[: n - 1], abs=1e-5)
        assert tree.scores[1:].tolist() == sorted(tree.scores[1:].tolist(), reverse=True)


def test_ancestor_mask_matches_parent_walk():
    g = torch.Generator().manual_seed(0)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, 40)]
    p = torch.tensor(parents)
    depth = [0] * 40
    for i in range(1, 40):
        depth[i] = depth[parents[i]] + 1
    mask = ancestor_mask(p, max(depth))
    for i in range(40):
        chain, j = set(), i
        while j >= 0:
            chain.add(j)
            j = parents[j]
        assert set(torch.nonzero(mask[i]).flatten().tolist()) == chain


def test_chain_is_top1_per_depth():
    logp = random_logp(5, 30, 1)
    tree = TREE_ALGOS["chain"](torch.tensor(3), logp, 64, 8)
    assert tree.size == 6
    assert tree.tokens[1:].tolist() == logp.argmax(-1).tolist()
    assert tree.parents.tolist() == [-1, 0, 1, 2, 3, 4]


def test_adaptive_spends_fewer_nodes_where_the_draft_is_confident():
    logp = torch.full((4, 20), -30.0)
    logp[:, 0] = 0.0  # fully confident at every depth
    logp[2, 1] = -0.7  # one plausible alternative at depth 3
    logp = torch.log_softmax(logp, -1)
    tree = TREE_ALGOS["adaptive"](torch.tensor(1), logp, 64, 8)
    full = TREE_ALGOS["accum_logp"](torch.tensor(1), logp, 64, 8)
    assert full.size == 64
    assert tree.size == 1 + 1 + 1 + 2 + 2  # chain with one branch at depth 3 continuing to depth 4
    assert torch.isfinite(tree.scores).all()
    assert (tree.parents[1:] < torch.arange(1, tree.size)).all()


def test_budget_larger_than_the_tree_can_be():
    logp = random_logp(3, 10, 2)
    tree = build_accum_logp(torch.tensor(0), logp, 1000, 2)
    assert tree.size == 1 + 2 + 4 + 8

"""Tree construction: fixed-shape best-first trees are exactly the top-budget prefix-closed set."""
import itertools

import pytest
import torch

from jetspec_chat.engine.tree import TREE_BUILDERS, ancestor_mask, build_accum_logp, static_tree_size
from jetspec_chat.kernels import accum_tree_ref


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


def tied_logp(depth, vocab, seed):
    """Log-probs with many exact ties: logits on a coarse grid (as bf16 logits are), and rows
    where the top tokens share one value."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, 4, (depth, vocab), generator=g).float()
    logits[::2, :6] = 5.0
    return torch.log_softmax(logits, dim=-1)


def slow_accum_logp(root, logp, budget, width):
    """The depth-by-depth build the engine used before `accum_tree` (commit eb47e52), with its
    per-depth topk made a stable sort so that ties have one defined order: the oracle that the
    new build must match node for node."""
    depth = logp.shape[0]
    n = static_tree_size(budget, width, depth)
    m = budget - 1
    width = min(width, logp.shape[1])
    top_lp, top_tok = logp.topk(width, dim=-1)
    flat_scores, flat_tokens, flat_parents = [], [], []
    prev_scores = torch.zeros(1)
    prev_index = torch.full((1,), -1, dtype=torch.long)
    offset = 0
    for d in range(depth):
        cand = (prev_scores[:, None] + top_lp[d][None, :]).reshape(-1)
        keep = min(m, cand.shape[0])
        scores, order = cand.sort(descending=True, stable=True)
        scores, order = scores[:keep], order[:keep]
        flat_scores.append(scores)
        flat_tokens.append(top_tok[d][order % width])
        flat_parents.append(prev_index[order // width])
        prev_scores = scores
        prev_index = torch.arange(offset, offset + keep)
        offset += keep
    scores = torch.cat(flat_scores)
    tokens = torch.cat(flat_tokens)
    parents_flat = torch.cat(flat_parents)
    depths_flat = torch.cat([torch.full((s.shape[0],), d + 1) for d, s in enumerate(flat_scores)])
    _, order = torch.sort(scores, descending=True, stable=True)
    chosen = order[: n - 1]
    node_of_flat = torch.full((scores.shape[0],), -1, dtype=torch.long)
    node_of_flat[chosen] = torch.arange(1, n)
    p = parents_flat[chosen]
    parents = torch.cat([torch.tensor([-1]), torch.where(p < 0, 0, node_of_flat[p.clamp(min=0)])])
    return (torch.cat([root.reshape(1).long(), tokens[chosen]]), parents,
            torch.cat([torch.zeros(1, dtype=torch.long), depths_flat[chosen].long()]),
            torch.cat([torch.zeros(1), scores[chosen]]))


def slow_ancestor_mask(parents):
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = int(parents[j])
    return mask


SHAPES = [(2, 1, 1), (2, 8, 15), (3, 2, 3), (5, 3, 2), (16, 4, 3), (16, 8, 15), (30, 3, 4), (64, 8, 3),
          (64, 8, 15), (40, 2, 6), (100, 64, 4), (128, 8, 15), (256, 8, 15), (1000, 2, 3), (7, 20, 5)]


@pytest.mark.parametrize("budget,width,depth", SHAPES)
@pytest.mark.parametrize("make_logp", [random_logp, tied_logp])
def test_accum_logp_equals_the_depth_by_depth_build(budget, width, depth, make_logp):
    """Same nodes, same order, same parents and bit-identical scores as the old build."""
    for seed in range(3):
        logp = make_logp(depth, 50, seed)
        tree = build_accum_logp(torch.tensor(7), logp, budget, width)
        tokens, parents, depths, scores = slow_accum_logp(torch.tensor(7), logp, budget, width)
        assert torch.equal(tree.tokens, tokens)
        assert torch.equal(tree.parents, parents)
        assert torch.equal(tree.depths, depths)
        assert torch.equal(tree.scores, scores)  # same fp32 sums, bit for bit
        assert torch.equal(tree.ancestors, slow_ancestor_mask(parents))
        assert tree.max_depth == depth


def test_accum_tree_ref_pads_with_valid_minus_inf_nodes():
    """With -inf inside the top-K and more nodes asked than finite ones exist, the padding nodes
    come last, and every node still has a real parent that precedes it."""
    logp = torch.full((3, 10), float("-inf"))
    logp[:, 0] = 0.0
    top_lp, top_tok = logp.topk(4, dim=-1)
    _, parents, depths, scores, ancestors = accum_tree_ref(top_lp, top_tok, torch.tensor(1), 12)
    assert scores[:4].tolist() == [0.0] * 4 and torch.isinf(scores[4:]).all()
    assert parents[1:4].tolist() == [0, 1, 2]
    assert (parents[1:] < torch.arange(1, 12)).all() and (parents[1:] >= 0).all()
    assert torch.equal(depths[1:], depths[parents[1:]] + 1)
    assert torch.equal(ancestors, slow_ancestor_mask(parents))


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
    tree = TREE_BUILDERS["chain"](torch.tensor(3), logp, 64, 8)
    assert tree.size == 6
    assert tree.tokens[1:].tolist() == logp.argmax(-1).tolist()
    assert tree.parents.tolist() == [-1, 0, 1, 2, 3, 4]


def test_adaptive_spends_fewer_nodes_where_the_draft_is_confident():
    logp = torch.full((4, 20), -30.0)
    logp[:, 0] = 0.0  # fully confident at every depth
    logp[2, 1] = -0.7  # one plausible alternative at depth 3
    logp = torch.log_softmax(logp, -1)
    tree = TREE_BUILDERS["adaptive"](torch.tensor(1), logp, 64, 8)
    full = TREE_BUILDERS["accum_logp"](torch.tensor(1), logp, 64, 8)
    assert full.size == 64
    assert tree.size == 1 + 1 + 1 + 2 + 2  # chain with one branch at depth 3 continuing to depth 4
    assert torch.isfinite(tree.scores).all()
    assert (tree.parents[1:] < torch.arange(1, tree.size)).all()


def test_budget_larger_than_the_tree_can_be():
    logp = random_logp(3, 10, 2)
    tree = build_accum_logp(torch.tensor(0), logp, 1000, 2)
    assert tree.size == 1 + 2 + 4 + 8


def test_every_named_algorithm_has_a_builder():
    """params.TREE_ALGOS (torch-free, what the UI offers and validate checks) names exactly the
    builders tree.TREE_BUILDERS has."""
    from jetspec_chat.engine import params

    assert tuple(TREE_BUILDERS) == params.TREE_ALGOS

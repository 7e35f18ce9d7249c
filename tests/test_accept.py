"""Acceptance rules on hand-made trees."""
import torch

from jetspec_chat.engine.accept import accept, processed_probs
from jetspec_chat.engine.params import SamplingParams
from jetspec_chat.engine.tree import Tree, ancestor_mask


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

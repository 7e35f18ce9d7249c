"""The sort-free sampler (engine/sampling.py) is the sorted definition (nucleus_sample_ref): the
same kept sets, the same token for the same uniform, hence the same distribution."""
import pytest
import torch
from scipy.stats import chisquare

from jetspec_chat.engine import sampling
from jetspec_chat.engine.params import SamplingParams
from jetspec_chat.kernels import sample_candidates_triton
from jetspec_chat.kernels.reference import nucleus_mask_ref, nucleus_sample_ref

V = 1000
KINDS = ("flat", "medium", "peaked", "spiked", "quantised", "tied top", "top-k masked")


def logit_rows(seed: int, per_kind: int) -> tuple[torch.Tensor, list[str]]:
    """Rows of every kind: flat to peaked distributions, many exact ties (also at the nucleus's
    boundary), a block of equal top logits, and rows masked to a few finite logits (top-k)."""
    g = torch.Generator().manual_seed(seed)
    rows, kinds = [], []
    for kind in KINDS:
        for _ in range(per_kind):
            x = torch.randn(V, generator=g)
            if kind == "flat":
                x = x * 0.05
            elif kind == "peaked":
                x = x * 5
            elif kind == "spiked":
                x = x * 20
            elif kind == "quantised":
                x = (x * (6 + len(rows) % 3)).round()
            elif kind == "tied top":
                x[torch.randperm(V, generator=g)[:40]] = float(x.max()) + 0.5
            elif kind == "top-k masked":
                x = (x * 2).masked_fill(torch.rand(V, generator=g) > 0.05, float("-inf"))
            rows.append(x)
            kinds.append(kind)
    return torch.stack(rows), kinds


@pytest.fixture
def few_candidates(monkeypatch):
    """64 candidates of 1000: both the fast path and the fallback run."""
    monkeypatch.setattr(sampling, "CANDIDATES", 64)


@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.95, 0.999])
def test_fast_path_kept_sets_equal_the_sorted_definition(few_candidates, top_p):
    x, kinds = logit_rows(int(top_p * 1000), 12)
    c = sampling.nucleus_candidates(x, top_p)
    kept = torch.zeros_like(x, dtype=torch.bool).scatter(-1, c.index, c.kept)
    ref = nucleus_mask_ref(x, top_p)[1]
    exact = c.exact.tolist()
    for i, kind in enumerate(kinds):
        if exact[i]:
            assert torch.equal(kept[i], ref[i]), (kind, i)
        else:  # the fallback's rows: the nucleus reaches the last candidate's value
            assert int(ref[i].sum()) >= int(c.kept[i].sum()), (kind, i)
    by_kind = {k: [e for e, kk in zip(exact, kinds) if kk == k] for k in KINDS}
    assert all(by_kind["spiked"]) and all(by_kind["top-k masked"])  # the fast path holds them
    assert not any(by_kind["flat"])  # a nucleus of most of the vocabulary: the fallback
    # rows whose boundary value is tied with a dropped token, on the fast path
    boundary = torch.where(ref, x, float("inf")).amin(-1, keepdim=True)
    split_ties = ((x == boundary) & ~ref).any(-1) & c.exact
    assert int(split_ties.sum()) >= 2


@pytest.mark.parametrize("top_p", [0.5, 0.95, 1.0])
def test_same_uniform_same_token_as_the_sorted_reference(few_candidates, top_p):
    x, _ = logit_rows(7, 10)
    u = torch.rand(x.shape[0], generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert torch.equal(sampling.sample_scaled(x, top_p, u), nucleus_sample_ref(x, top_p, u)[0])


def test_boundary_ties_keep_the_lowest_indices(few_candidates):
    """Five equal logits at the boundary of top_p 0.5: the sorted order keeps the lower indices."""
    x = torch.full((1, V), -30.0)
    tied = torch.tensor([900, 17, 400, 3, 650])
    x[0, tied] = 0.0  # 20% each: the mass before the 3rd reaches 0.4 < 0.5, before the 4th 0.6
    c = sampling.nucleus_candidates(x, 0.5)
    assert bool(c.exact[0])
    assert sorted(c.index[0][c.kept[0]].tolist()) == [3, 17, 400]


@pytest.mark.parametrize("top_p,top_k", [(0.9, 0), (0.8, 5)])
def test_sampled_frequencies_match_the_processed_distribution(few_candidates, top_p, top_k):
    """χ² of 20k draws from `sample` on one row (nucleus of ~10 tokens with ties) against
    processed_probs; and the same test rejects a sampler that forgets to renormalise."""
    g = torch.Generator().manual_seed(11)
    row = torch.randn(1, 300, generator=g) * 3
    row[0, 5] = row[0, 6] = float(row.max())  # a tie at the top
    n = 20000
    params = SamplingParams(temperature=0.7, top_p=top_p, top_k=top_k)
    expected = sampling.processed_probs(row, params)[0]
    support = torch.nonzero(expected).flatten()
    assert 3 <= len(support) <= 64
    u = torch.rand(n, generator=g, dtype=torch.float64)
    tokens = sampling.sample(row.expand(n, -1), params.temperature, top_p, top_k, u)
    counts = torch.bincount(tokens, minlength=300).double()
    assert counts[expected == 0].sum() == 0
    p_value = chisquare(counts[support].numpy(), (expected[support] * n).numpy()).pvalue
    assert p_value > 1e-3, p_value
    # power: the nucleus's probabilities without renormalisation (mass dropped to the top token)
    biased = expected.clone()
    biased[support] = torch.softmax(row[0] / 0.7, -1)[support].double()
    biased[support[expected[support].argmax()]] += 1 - biased.sum()
    assert chisquare(counts[support].numpy(), (biased[support] * n).numpy()).pvalue < 1e-3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("top_p", [0.95, 1.0])
def test_full_vocabulary_rows_on_the_gpu_equal_the_sorted_reference(top_p):
    """152k-token rows on the GPU: the candidates kernel and the fallback kernel together draw
    the reference's token for the same uniform (both compute the same fp32 weights; only float64
    sums run in another order)."""
    g = torch.Generator().manual_seed(13)
    scales = torch.tensor([0.05, 1.0, 4.0, 12.0, 30.0] * 8)[:, None]
    x = (torch.randn(len(scales), 151_936, generator=g) * scales).cuda()
    x[-1] = x[-1].round()  # ties
    u = torch.rand(len(scales), generator=g, dtype=torch.float64).cuda()
    fast = sampling.sample_scaled(x, top_p, u)
    assert torch.equal(fast, nucleus_sample_ref(x, top_p, u)[0])
    if top_p < 1:
        need = sample_candidates_triton(x, top_p, u, sampling.CANDIDATES)[1]
        assert 0 < int(need.sum()) < len(scales)  # both kernels decided rows

"""The nucleus sampling kernels (the bisection fallback, the candidates fast path) against the
sorted definition (nucleus_sample_ref), under the interpreter: the same kept count and the same
token for the same uniform, on flat to peaked rows, ties inside and at the nucleus's boundary
(across a block edge), -inf logits, top_p 1."""
import pytest
import torch

from jetspec_chat.kernels import sampling
from jetspec_chat.kernels.reference import nucleus_sample_ref

V = 1000
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the compiled kernel on a GPU


def rows() -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    out = [torch.randn(V, generator=g) * s for s in (0.05, 1.0, 4.0, 20.0)]
    for scale in (6, 7, 8):  # integer logits: tied groups, often split by the boundary
        out.append((torch.randn(V, generator=g) * scale).round())
    tied = torch.randn(V, generator=g)
    tied[200:300] = 4.0  # one tied group across the block edge at 256
    out.append(tied)
    out.append((torch.randn(V, generator=g) * 2).masked_fill(torch.rand(V, generator=g) > 0.05, float("-inf")))
    out.append(torch.zeros(V))  # all tied
    return torch.stack(out).to(DEVICE)


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(sampling, "BLOCK", 256)  # several blocks a row


# capacity: the bisection over the copied logits (the whole row fits, or the bracket does once
# narrowed to at most 200), or over the row (16: too narrow a bracket for the passes there are)
@pytest.mark.parametrize("top_p,capacity", [(0.3, 8192), (0.9, 8192), (0.97, 8192), (1.0, 8192), (0.9, 16),
                                            (0.97, 200)])
def test_nucleus_sample_kernel_equals_the_sorted_reference(small_blocks, monkeypatch, top_p, capacity):
    monkeypatch.setattr(sampling, "FALLBACK_CAPACITY", capacity)
    x = rows()
    u = torch.rand(x.shape[0], generator=torch.Generator().manual_seed(int(top_p * 100)), dtype=torch.float64).to(DEVICE)
    need = torch.ones(x.shape[0], dtype=torch.bool, device=DEVICE)
    tokens, kept = sampling.nucleus_sample_triton(x, top_p, u, need)
    ref_tokens, ref_kept = nucleus_sample_ref(x, top_p, u)
    assert torch.equal(kept, ref_kept)
    assert torch.equal(tokens, ref_tokens)


@pytest.fixture
def small_chunks(monkeypatch):
    """The candidates passes over many programs a row: chunks of 256 logits (two blocks of 128;
    4 chunks of a 1000-logit row, the last one partial)."""
    monkeypatch.setattr(sampling, "BLOCK", 128)
    monkeypatch.setattr(sampling, "CANDIDATE_CHUNK", 256)


@pytest.fixture(params=["one chunk a row", "four chunks a row"])
def chunking(request, monkeypatch):
    """The 1000-logit rows in one chunk (blocks of 256), or in four (`small_chunks`)."""
    monkeypatch.setattr(sampling, "BLOCK", 256 if request.param == "one chunk a row" else 128)
    if request.param == "four chunks a row":
        monkeypatch.setattr(sampling, "CANDIDATE_CHUNK", 256)


@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.97])
def test_candidates_equal_the_sorted_reference(chunking, top_p):
    """64 candidates of 1000 logits, a row's partial maxima, normalisers and histograms combined
    over its chunks: where the fast path decides a row, the reference's kept count and token;
    where it leaves the row to the fallback, every candidate was kept and the reference keeps at
    least as many. With the fallback, every row's token. The tied group at 200..299 and the
    integer rows' ties straddle chunk borders."""
    x = rows()
    u = torch.rand(x.shape[0], generator=torch.Generator().manual_seed(int(top_p * 100)), dtype=torch.float64).to(DEVICE)
    tokens, need, kept = sampling.sample_candidates_triton(x, top_p, u, 64)
    ref_tokens, ref_kept = nucleus_sample_ref(x, top_p, u)
    decided = need == 0
    assert 0 < int(decided.sum()) < x.shape[0]  # both paths run
    assert torch.equal(kept[decided], ref_kept[decided])
    assert torch.equal(tokens[decided], ref_tokens[decided])
    assert bool((ref_kept[~decided] >= kept[~decided]).all())
    assert torch.equal(sampling.nucleus_sample_triton(x, top_p, u, need, tokens)[0], ref_tokens)


def test_candidates_keep_the_lowest_indices_of_boundary_ties(chunking):
    """Five equal logits (in four chunks, where there are four) at the boundary of top_p 0.5
    (20% each): the sorted order keeps the lowest three indices, and u picks among them in
    index order."""
    x = torch.full((3, V), -30.0)
    x[:, torch.tensor([900, 17, 400, 3, 650])] = 0.0
    u = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    tokens, need, kept = sampling.sample_candidates_triton(x.to(DEVICE), 0.5, u.to(DEVICE), 64)
    assert need.tolist() == [0, 0, 0] and kept.tolist() == [3, 3, 3]
    assert tokens.tolist() == [3, 17, 400]


def test_chunked_candidates_of_a_row_shorter_than_the_capacity(small_chunks):
    """300 logits, 512 candidates: every finite logit within 32 of the maximum is one (a partial
    last chunk's padding is not); rows with -inf or far logits leave those to the fallback."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(4, 300, generator=g) * torch.tensor([[0.5], [3.0], [3.0], [30.0]])
    x[2, ::3] = float("-inf")
    u = torch.rand(4, generator=g, dtype=torch.float64)
    x, u = x.to(DEVICE), u.to(DEVICE)
    tokens, need, kept = sampling.sample_candidates_triton(x, 0.999, u, 512)
    ref_tokens, ref_kept = nucleus_sample_ref(x, 0.999, u)
    assert need.tolist()[:2] == [0, 0]  # every logit a candidate: decided whatever is kept
    decided = need == 0
    assert torch.equal(kept[decided], ref_kept[decided]) and torch.equal(tokens[decided], ref_tokens[decided])
    assert torch.equal(sampling.nucleus_sample_triton(x, 0.999, u, need, tokens)[0], ref_tokens)


def test_the_draw_does_not_depend_on_the_candidates_slots(small_chunks):
    """The copies land in slots in whatever order the chunks take them: reversed slots give the
    same tokens, kept counts and needs, bitwise."""
    x = rows()
    u = torch.rand(x.shape[0], generator=torch.Generator().manual_seed(9), dtype=torch.float64).to(DEVICE)
    scratch = sampling.find_candidates_triton(x, 64)
    want = sampling.draw_candidates_triton(scratch, V, 0.9, u)
    for r, n in enumerate(scratch.n.tolist()):
        assert n <= 64  # none on the flat rows (their fallback's)
        scratch.cand_x[r, :n] = scratch.cand_x[r, :n].flip(0)
        scratch.cand_i[r, :n] = scratch.cand_i[r, :n].flip(0)
    got = sampling.draw_candidates_triton(scratch, V, 0.9, u)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_a_rows_token_does_not_depend_on_the_other_rows(small_chunks):
    """The chunks are a fixed length: a row sampled alone gets the token it gets among others."""
    x = rows()
    u = torch.rand(x.shape[0], generator=torch.Generator().manual_seed(4), dtype=torch.float64).to(DEVICE)
    together = sampling.sample_candidates_triton(x, 0.9, u, 64)
    for r in (1, 5):
        alone = sampling.sample_candidates_triton(x[r:r + 1], 0.9, u[r:r + 1], 64)
        assert [int(t[r]) for t in together] == [int(t[0]) for t in alone]


def test_a_needed_row_among_skipped_rows(small_blocks):
    x = rows()[:3]
    u = torch.full((3,), 0.5, dtype=torch.float64, device=DEVICE)
    tokens, _ = sampling.nucleus_sample_triton(x, 0.9, u, torch.tensor([False, True, False], device=DEVICE))
    assert int(tokens[1]) == int(nucleus_sample_ref(x[1:2], 0.9, u[1:2])[0])


def test_row_mass_kernel_sums_the_reference_weights(monkeypatch):
    """The normaliser of the fast path: the same fp32 weights as the reference, summed in float64
    in chunks (several programs a row, a partial last chunk)."""
    monkeypatch.setattr(sampling, "MASS_CHUNK", 512)
    x = rows()
    m = x.topk(4, dim=-1).values[:, 0]  # a strided column, as the engine passes it
    assert not m.is_contiguous()
    got = sampling.row_mass_triton(x, m)
    want = sampling.row_mass_ref(x, m)
    assert got.shape == want.shape == (x.shape[0], 1)
    # On the GPU both take expf from libdevice; the interpreter's numpy exp may differ from
    # torch's CPU exp by an ulp (relative 1e-7 per weight).
    torch.testing.assert_close(got, want, rtol=1e-12 if x.is_cuda else 1e-6, atol=0)


def test_the_kernels_compile_for_sm90_without_spills():
    from sm90 import run_compile_script

    out = run_compile_script("sm90_sampling_compile.py", [])
    assert len(out) == 16
    assert all(k["local"] == 0 and k["regs"] is not None for k in out), out

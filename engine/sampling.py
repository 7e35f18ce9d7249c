"""The target's sampled token at every node: temperature, top-k, top-p, without a vocabulary sort.

The distribution is the sorted definition's (kernels/reference.py: nucleus_mask_ref, then
inverse CDF in index order, nucleus_sample_ref), and with the same uniform u each row draws the
same token. A row's nucleus of top_p 0.95 is a few to a few hundred tokens in a trained model,
so the sort of the whole vocabulary (152k tokens) per node that the definition implies is not
needed: the top CANDIDATES logits (torch.topk, which selects without sorting the row), ordered
as the stable sort orders them, give the kept prefix exactly when its last kept value is above
the last candidate's (then every token outside the candidates comes later in the sorted order
and is dropped, and every tie of the boundary value is a candidate). The other rows (a nucleus
wider than the candidates: flat distributions, top_p 1) go to an exact fallback that finds the
same kept set without sorting (kernels/sampling.py, a Triton kernel whose rows not needed cost
nothing) or, off the GPU, to the sort-based reference itself.

On the GPU the fast path is five Triton launches (kernels/sampling.py: four passes over the row by
a program per 2048 logits of every row, so a row is read by many SMs: its maximum, normaliser and
a histogram of its logits below the maximum; the candidates, every logit above a value the
histogram picks so that at most CANDIDATES are; then one program a row for their sort, nucleus
and draw), and the fallback one more: six launches after the temperature instead of ~25 torch
kernels. Its candidates are closed under ties by construction, so the test is simpler: the
nucleus is exact unless every candidate is kept. The torch form below (torch.topk) is the CPU's.

Fixed shapes and no host sync: the CUDA verify graph holds it, with the temperature and top_p as
device scalars and the uniforms drawn into a static buffer before the replay.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels import nucleus_mask_ref, nucleus_sample, nucleus_sample_in_candidates_triton, row_mass, triton_samples
from .params import SamplingParams

# Logits per row that the fast path orders (a power of two: the GPU kernel sorts them in one
# block). The nucleus of a trained model's row at top_p 0.95 is almost always inside; a row
# whose nucleus is wider takes the fallback.
CANDIDATES = 256


def scaled_logits(logits: torch.Tensor, temperature: float | torch.Tensor, top_k: int) -> torch.Tensor:
    """fp32 logits [N, V] divided by the temperature; with top_k, every logit below the k-th
    largest set to -inf (ties with the k-th stay)."""
    if not isinstance(temperature, torch.Tensor):  # divide as the graphs do (by a device scalar)
        temperature = torch.full((), temperature, dtype=torch.float32, device=logits.device)
    x = logits.float() / temperature
    if 0 < top_k < x.shape[-1]:
        kth = x.topk(top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    return x


@dataclass
class Candidates:
    """The top logits of each row, by index ([N, K]), and what the fast path learns from them."""

    index: torch.Tensor  # [N, K] token ids, ascending
    probs: torch.Tensor  # [N, K] float64: softmax64_ref(x) at them
    kept: torch.Tensor  # [N, K] bool: in the nucleus
    exact: torch.Tensor  # [N] bool: the row's nucleus is `kept` (else the fallback decides)


def nucleus_candidates(x: torch.Tensor, top_p: float | torch.Tensor) -> Candidates:
    """The nucleus (nucleus_mask_ref) of each row of x [N, V] among its top CANDIDATES logits."""
    v = x.shape[-1]
    k = min(CANDIDATES, v)
    # The candidates in the stable sort's order: by index, then stably by value (descending).
    index = x.topk(k, dim=-1, sorted=False).indices.sort(dim=-1).values
    values, order = x.gather(-1, index).sort(dim=-1, descending=True, stable=True)
    # softmax64_ref(x) at the candidates, element for element the same arithmetic; the row's
    # maximum is its top candidate, and the normaliser one read of the row (row_mass).
    m = values[:, 0]
    probs = (x.gather(-1, index) - m[:, None]).exp().double() / row_mass(x, m)
    p = probs.gather(-1, order)
    keep = p.cumsum(-1) - p < top_p  # a prefix of the sorted candidates: the top one always stays
    last_kept = values.gather(-1, keep.sum(-1, keepdim=True) - 1)[:, 0]
    exact = (last_kept > values[:, -1]) | (k == v)
    return Candidates(index, probs, torch.empty_like(keep).scatter_(-1, order, keep), exact)


def sample_scaled(x: torch.Tensor, top_p: float | torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of scaled logits x [N, V] from the renormalised top-p nucleus, by
    inverse CDF in index order with u [N] (float64, uniform in [0, 1)): nucleus_sample_ref's
    token, without sorting the rows. top_p: a float, or a 0-d float64 device tensor (then < 1)."""
    if not isinstance(top_p, torch.Tensor) and top_p >= 1.0:  # every token is kept: the fallback samples the row
        return nucleus_sample(x, top_p, u, torch.ones(x.shape[0], dtype=torch.bool, device=x.device))[0]
    if triton_samples(x):  # the same, in two kernels (kernels/sampling.py)
        return nucleus_sample_in_candidates_triton(x, top_p, u, CANDIDATES)
    c = nucleus_candidates(x, top_p)
    # Inverse CDF in index order over the kept candidates: the same running sums as over the
    # whole row (nucleus_sample_ref), whose other weights are zeros.
    cdf = torch.where(c.kept, c.probs, 0.0).cumsum(-1)
    j = torch.minimum((cdf <= u[:, None] * cdf[:, -1:]).sum(-1), cdf.argmax(-1))
    fast = c.index.gather(-1, j[:, None])[:, 0]
    return torch.where(c.exact, fast, nucleus_sample(x, top_p, u, ~c.exact)[0])


def sample(
    logits: torch.Tensor, temperature: float | torch.Tensor, top_p: float | torch.Tensor, top_k: int,
    u: torch.Tensor,
) -> torch.Tensor:
    """The target's sample at every node ([N] int64) given uniforms u [N] float64."""
    return sample_scaled(scaled_logits(logits, temperature, top_k), top_p, u)


def uniforms(n: int, generator: torch.Generator | None, device: torch.device, out: torch.Tensor | None = None) -> torch.Tensor:
    """n float64 uniforms in [0, 1), one per node, from the answer's generator."""
    if out is not None:
        return torch.rand(out.shape, generator=generator, dtype=torch.float64, out=out)
    return torch.rand(n, generator=generator, dtype=torch.float64, device=device)


def processed_probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """The distribution `sample` draws from: temperature, top-k, top-p, renormalised ([N, V]
    float64). The oracle of the sampling tests."""
    probs, kept = nucleus_mask_ref(scaled_logits(logits, sampling.temperature, sampling.top_k), sampling.top_p)
    w = torch.where(kept, probs, 0.0)
    return w / w.sum(-1, keepdim=True)

"""The distillation-loss kernel (kernels/distill.py) against its torch reference, and the
reference against the plain formulas. On a CPU the Triton kernel runs in the interpreter
(TRITON_INTERPRET=1, set by conftest.py) on small shapes; the full 152k vocabulary in bf16 runs
only on a GPU."""
from __future__ import annotations

import pytest
import torch

from jetspec_chat.kernels import distill_rows, distill_rows_ref

triton = pytest.importorskip("triton")
from jetspec_chat.kernels import distill_rows_triton  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def case(rows: int, vocab: int, teachers: int, dtype: torch.dtype, seed: int = 0, scale: float = 4.0):
    gen = torch.Generator().manual_seed(seed)
    z = (torch.randn(rows, vocab, generator=gen) * scale).to(dtype)
    t = (torch.randn(teachers, vocab, generator=gen) * scale).to(dtype)
    idx = torch.randint(0, teachers, (rows,), generator=gen)
    w = torch.rand(rows, generator=gen) + 0.1
    return z.to(DEVICE), t.to(DEVICE), idx.to(DEVICE), w.to(DEVICE)


@pytest.mark.parametrize("kind", ["kl", "ce"])
def test_reference_is_the_plain_formula(kind):
    z, t, idx, w = case(6, 40, 3, torch.float32)
    z_ref = z.clone().requires_grad_(True)
    logq = torch.log_softmax(z_ref, -1)
    logp = torch.log_softmax(t[idx], -1)
    if kind == "kl":
        per_row = (logp.exp() * (logp - logq)).sum(-1)
    else:
        per_row = -logq.gather(1, logp.argmax(-1, keepdim=True))[:, 0]
    (per_row * w).sum().backward()
    grad = z.clone()
    loss, agree = distill_rows_ref(grad, t, idx, w, kind)
    assert torch.allclose(loss, (per_row * w).detach(), atol=1e-6)
    assert torch.allclose(grad, z_ref.grad, atol=1e-6)
    assert torch.equal(agree, z.argmax(-1) == t[idx].argmax(-1))


@pytest.mark.parametrize("kind", ["kl", "ce"])
@pytest.mark.parametrize("vocab,block", [(300, 64), (256, 64), (50, 64)])  # ragged, exact, one partial block
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_reference(kind, vocab, block, dtype, poisoned_alloc):
    z, t, idx, w = case(5, vocab, 4, dtype, seed=vocab)  # outputs start as NaN: every one must be written
    g_ref, g_tri = z.clone(), z.clone()
    loss_ref, agree_ref = distill_rows_ref(g_ref, t, idx, w, kind)
    loss_tri, agree_tri = distill_rows_triton(g_tri, t, idx, w, kind, block=block)
    assert torch.allclose(loss_tri, loss_ref, rtol=1e-4, atol=1e-5)
    assert torch.equal(agree_tri, agree_ref)
    tol = 1e-6 if dtype == torch.float32 else 1e-2  # bf16: one rounding of each gradient entry
    assert torch.allclose(g_tri.float(), g_ref.float(), rtol=tol, atol=tol * 1e-2)


def test_ties_go_to_the_lowest_index_as_in_torch():
    z = torch.zeros(3, 130, device=DEVICE)
    t = torch.zeros(2, 130, device=DEVICE)
    z[0, [7, 100]] = 5.0  # tie across lanes and blocks
    t[0, [100, 7]] = 5.0
    z[1, [65, 1]] = 3.0
    z[2, [129, 1]] = 2.0
    t[1, 1] = 3.0
    idx = torch.tensor([0, 1, 1], device=DEVICE)
    w = torch.ones(3, device=DEVICE)
    _, agree = distill_rows_triton(z.clone(), t, idx, w, "ce", block=64)
    _, agree_ref = distill_rows_ref(z.clone(), t, idx, w, "ce")
    assert agree.tolist() == agree_ref.tolist() == [True, True, True]


def test_identical_rows_have_zero_loss_and_gradient():
    z, t, _, w = case(4, 200, 4, torch.float32)
    idx = torch.arange(4, device=DEVICE)
    g = t.clone()
    loss, agree = distill_rows_triton(g, t, idx, w, "kl", block=64)
    assert loss.abs().max() < 1e-5 and g.abs().max() < 1e-6 and bool(agree.all())


def test_no_rows():
    z = torch.zeros(0, 10, device=DEVICE)
    loss, agree = distill_rows(z, torch.zeros(2, 10, device=DEVICE), torch.zeros(0, dtype=torch.long, device=DEVICE),
                               torch.zeros(0, device=DEVICE), "kl")
    assert loss.shape == (0,) and agree.shape == (0,)


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("kind", ["kl", "ce"])
def test_full_vocabulary_bf16_on_the_gpu(kind):
    z, t, idx, w = case(64, 151936, 40, torch.bfloat16, scale=3.0)
    g_ref, g_tri = z.clone(), z.clone()
    loss_ref, agree_ref = distill_rows_ref(g_ref, t, idx, w, kind)
    loss_tri, agree_tri = distill_rows(g_tri, t, idx, w, kind)
    assert torch.allclose(loss_tri, loss_ref, rtol=1e-4, atol=1e-4)
    assert torch.equal(agree_tri, agree_ref)
    assert torch.allclose(g_tri.float(), g_ref.float(), rtol=1e-2, atol=1e-6)

"""Shared test setup."""
import os
from pathlib import Path

import pytest

import torch

# Without a GPU, Triton kernels run in Triton's CPU interpreter. The variable must be set before
# any module decorates a kernel with triton.jit, i.e. before kernels are imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def embedded_cache(tmp_path_factory) -> Path:
    """One converted-model cache for the whole run (converting the 0.5B takes ~40 s).
    Point JETSPEC_TEST_CACHE at a directory that survives between runs to pay it once."""
    configured = os.environ.get("JETSPEC_TEST_CACHE")
    return Path(configured) if configured else tmp_path_factory.mktemp("jetspec-cache")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one intra-op thread is fastest, and far more robust on a busy 2-core runner.
    A module opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def poisoned_alloc(monkeypatch):
    """Every float tensor torch.empty/empty_like hands out starts as NaN (kernel outputs, partials):
    a kernel that leaves any output element unwritten shows NaN."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def poison(x):
        return x.fill_(float("nan")) if x.is_floating_point() else x

    monkeypatch.setattr(torch, "empty", lambda *a, **k: poison(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: poison(real_empty_like(*a, **k)))


@pytest.fixture
def ordered_dot(monkeypatch):
    """Under the interpreter, tl.dot with each output element summed alone in K order (acc, then
    + a[i, 0] * b[0, j], + a[i, 1] * b[1, j], ...): an element's bits then depend on its own row
    and column only, as on the GPU's MMA, which the batch-invariance tests rely on. The
    interpreter's own dot is numpy's matmul of the whole tile, whose BLAS kernel may sum a row
    differently by its place in the tile (seen on some x86 CPUs: a tree row then differs from its
    AR step in the last bit). On a GPU the MMA itself is under test: nothing is patched."""
    if torch.cuda.is_available():
        yield
        return
    import numpy as np
    from triton.runtime import interpreter as interp

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        acc = d.data.astype(np.float32, copy=True)
        a32, b32 = a.data.astype(np.float32), b.data.astype(np.float32)
        for k in range(a32.shape[-1]):
            acc = acc + a32[..., :, k : k + 1] * b32[..., k : k + 1, :]
        return interp.TensorHandle(acc, d.dtype.scalar)

    monkeypatch.setattr(interp.InterpreterBuilder, "create_dot", dot)
    yield

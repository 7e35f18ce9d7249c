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

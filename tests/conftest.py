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

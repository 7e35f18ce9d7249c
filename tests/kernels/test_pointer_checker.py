"""The interpreter's bounds check (`checked_pointers`, tests/conftest.py) catches what it is for:
a load one element past a tensor argument, and a store through a row slice's end."""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.runtime.errors import InterpreterError  # noqa: E402  (the interpreter wraps the check's AssertionError)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the check runs under the CPU interpreter")


@triton.jit
def _copy_kernel(X, Y, n, EXTRA: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    ok = i < n + EXTRA  # EXTRA = 1: one lane past the end
    tl.store(Y + i, tl.load(X + i, mask=ok, other=0.0), mask=i < n)


def test_a_load_past_the_end_fails(checked_pointers):
    x, y = torch.arange(8.0), torch.zeros(8)
    _copy_kernel[(1,)](x, y, 8, EXTRA=0, BLOCK=16)  # in bounds: passes
    assert torch.equal(y, x)
    with pytest.raises(InterpreterError, match="_copy_kernel: load of 1 lanes outside"):
        _copy_kernel[(1,)](x, y, 8, EXTRA=1, BLOCK=16)


def test_a_row_slice_is_checked_as_the_slice(checked_pointers):
    big = torch.zeros(4, 8)
    src = torch.arange(16.0)
    with pytest.raises(InterpreterError, match="store of 8 lanes outside"):
        _copy_kernel[(1,)](src, big[1], 16, EXTRA=0, BLOCK=16)  # row 1 holds 8 elements, 16 are written

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

class PointerChecker:
    """Under TRITON_INTERPRET=1: every load and store a Triton kernel issues must, on its
    unmasked lanes, address an element inside one of that launch's tensor arguments (the
    view's own span: a row slice of a bigger tensor is checked as the slice). An index read
    from an unwritten buffer, a sentinel used as an index, or an unmasked lane past a tensor's
    end fails here; the interpreter itself reads such addresses silently (a GPU faults, or not)."""

    def __init__(self) -> None:
        self.spans: list[tuple[int, int, str]] = []  # (first byte, end byte, argument) of the running launch
        self.kernel = ""
        # Tensors a launch reaches through an address table rather than as arguments (Partials'
        # group_ptrs): set by the test, allowed in every launch.
        self.reachable: list[torch.Tensor] = []

    @staticmethod
    def span(t: torch.Tensor) -> tuple[int, int]:
        if t.numel() == 0:
            return t.data_ptr(), t.data_ptr()
        last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
        return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()

    def launch(self, name: str, named_args: dict) -> None:
        self.kernel = name
        self.spans = [(*self.span(a), arg) for arg, a in named_args.items() if isinstance(a, torch.Tensor)]
        self.spans += [(*self.span(t), "a tensor reached through an address table") for t in self.reachable]

    def check(self, ptrs, mask, what: str) -> None:
        import numpy as np

        size = ptrs.get_element_ty().primitive_bitwidth // 8
        p = np.broadcast_to(ptrs.data, np.broadcast_shapes(ptrs.data.shape, mask.data.shape))
        live = p[np.broadcast_to(mask.data, p.shape)].astype(np.uint64).reshape(-1, 1)
        if live.size == 0:
            return
        starts = np.array([s for s, _, _ in self.spans], dtype=np.uint64)
        ends = np.array([e for _, e, _ in self.spans], dtype=np.uint64)
        inside = ((live >= starts) & (live + np.uint64(size) <= ends)).any(1)
        if not inside.all():
            bad = int(live[~inside][0, 0])
            near = ", ".join(f"{arg} [{s:#x}, {e:#x})" for s, e, arg in self.spans)
            raise AssertionError(f"{self.kernel}: {what} of {int((~inside).sum())} lanes outside every tensor "
                                 f"argument, e.g. {bad:#x}; arguments: {near}")


def install_pointer_checker(setattr) -> PointerChecker:
    """Patches the interpreter (through `setattr`, e.g. monkeypatch.setattr) to run every
    launch's loads and stores past a PointerChecker; returns it."""
    import inspect

    from triton.runtime import interpreter

    checker = PointerChecker()
    real_init, real_load, real_store = (interpreter.GridExecutor._init_args_hst, interpreter.InterpreterBuilder.create_masked_load,
                                        interpreter.InterpreterBuilder.create_masked_store)

    def init_args(self, args_dev, kwargs):
        args_hst, kwargs_hst = real_init(self, args_dev, kwargs)
        named = inspect.getcallargs(self.fn, *args_hst, **{k: v for k, v in kwargs_hst.items() if k in self.arg_names})
        checker.launch(self.fn.__name__, named)
        return args_hst, kwargs_hst

    def load(self, ptrs, mask, other, cache_policy, is_volatile):
        checker.check(ptrs, mask, "load")
        return real_load(self, ptrs, mask, other, cache_policy, is_volatile)

    def store(self, ptrs, value, mask, cache_policy):
        checker.check(ptrs, mask, "store")
        return real_store(self, ptrs, value, mask, cache_policy)

    setattr(interpreter.GridExecutor, "_init_args_hst", init_args)
    setattr(interpreter.InterpreterBuilder, "create_masked_load", load)
    setattr(interpreter.InterpreterBuilder, "create_masked_store", store)
    return checker


@pytest.fixture
def checked_pointers(monkeypatch):
    """Bounds-check every interpreted Triton load and store (PointerChecker). On a GPU nothing is
    patched (None): a stray access there shows as a CUDA error, or not at all."""
    if torch.cuda.is_available():
        return None
    return install_pointer_checker(monkeypatch.setattr)

"""Programmatic dependent launch (kernels/launch.py): when it is on, that every kernel follows its
rule, and that on sm_90 it adds the grid dependency instructions and nothing else."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from jetspec_chat.kernels import launch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from sm90 import run_compile_script  # noqa: E402

KERNELS = Path(launch.__file__).parent


def test_pdl_is_on_only_for_compiled_kernels_on_sm90_and_newer(monkeypatch):
    assert launch.launch_args(torch.device("cpu"), 1) == dict(PDL=False, launch_pdl=False)
    capability = {"value": (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability["value"])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    launch._sm90_or_newer.cache_clear()
    try:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        assert not launch.pdl_enabled(torch.device("cuda", 0)), "the interpreter has no griddepcontrol"
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        on = dict(PDL=launch.HAVE_GDC, launch_pdl=launch.HAVE_GDC)
        assert launch.launch_args(torch.device("cuda"), 1) == on
        assert launch.launch_args(torch.device("cuda"), launch.PDL_MAX_ROWS) == on
        off = dict(PDL=False, launch_pdl=False)
        assert launch.launch_args(torch.device("cuda"), launch.PDL_MAX_ROWS + 1) == off, "wide calls: plain launches"
        launch._sm90_or_newer.cache_clear()
        capability["value"] = (8, 0)
        assert not launch.pdl_enabled(torch.device("cuda", 0)), "an A100 has no PDL"
    finally:
        launch._sm90_or_newer.cache_clear()


def _jit_module(decorator: ast.expr) -> str | None:
    """"triton" for @triton.jit, "gluon" for @gluon.jit (with or without arguments), else None."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(target, ast.Attribute) and target.attr == "jit":
        return ast.unparse(target.value)
    return None


def _is_jit(decorator: ast.expr) -> bool:
    return _jit_module(decorator) == "triton"


def test_every_kernel_waits_first_and_every_launch_passes_launch_args():
    """A kernel launched with PDL that touched memory before gdc_wait could read a result its
    predecessor has not written yet: so every kernel's first statement is the wait, and every
    launch decides PDL the same way."""
    kernels, launches = [], []
    for path in sorted(KERNELS.glob("*.py")):
        tree = ast.parse(path.read_text())
        # Gluon kernels (matmul_ws.py) launch without PDL: each starts once its predecessor has
        # finished, and a PDL kernel after one waits for it to finish like any other.
        gluon = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                 and any(_jit_module(d) == "gluon" for d in node.decorator_list)}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel") and any(map(_is_jit, node.decorator_list)):
                kernels.append(f"{path.name}:{node.name}")
                assert node.args.args[-1].arg == "PDL", f"{node.name}: PDL must be its last parameter"
                body = node.body[1:] if isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) else node.body
                first = body[0]
                # a constexpr alias (DT: tl.constexpr = ...) touches no memory and may come first
                while isinstance(first, ast.AnnAssign):
                    body = body[1:]
                    first = body[0]
                assert ast.unparse(first) == "wait_for_previous(PDL)", f"{node.name} starts with {ast.unparse(first)!r}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
                name = ast.unparse(node.func.value)
                if name.endswith("_kernel") and name not in gluon:
                    launches.append(name)
                    splats = [ast.unparse(k.value) for k in node.keywords if k.arg is None]
                    assert any(s.startswith("launch_args(") for s in splats), (
                        f"{path.name}: {name} launched without launch_args")
    assert len(kernels) >= 17 and len(launches) >= 17, (kernels, launches)
    assert {k.split(":")[1] for k in kernels} == set(launches)


def test_sm90_pdl_only_adds_the_grid_dependency_instructions():
    """Compiled for sm_90 with PDL, each of the forward's kernels is the same Triton GPU program and
    the same PTX instructions plus `griddepcontrol.wait` and `.launch_dependents`, the wait before
    any global memory access. So the arithmetic (the bits) cannot change, only when a grid starts."""
    out = run_compile_script("sm90_pdl_compile.py", [])
    assert len(out) == 16
    # The AR step's attention binary multiplies with the same tensor-core instructions as the
    # verify's (a row's scores and P@V products are then the same numbers in both).
    mma = {kernel["kernel"]: kernel["mma"] for kernel in out}
    assert (mma["tree_attn AR"] == mma["tree_attn tree"] == mma["tree_attn chunk"] == mma["tree_attn tree paged"]
            == mma["tree_attn tail"] != []), mma
    for kernel in out:
        name = kernel["kernel"]
        assert kernel["gdc"] == ["griddepcontrol.wait", "griddepcontrol.launch_dependents"], name
        assert kernel["plain_gdc"] == 0 and kernel["wait_first"], kernel
        assert kernel["ir_diff"] == [], kernel
        assert kernel["added"] == ["griddepcontrol.launch_dependents", "griddepcontrol.wait"], kernel
        assert kernel["removed"] == [], kernel

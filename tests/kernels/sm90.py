"""Shared pieces of the offline sm_90 compile checks (no GPU): the resource usage of a compiled
kernel, the forms of its wgmma instructions, and running one of the `sm90_*_compile.py` scripts
from a test. The scripts run in a subprocess because the compiler needs the real triton.jit, not
the interpreter's."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path


def resource_usage(kernel) -> dict:
    """Registers and local memory (spills) of a compiled kernel's cubin, by cuobjdump, and its
    shared memory: {"regs", "local", "shared"} (None where cuobjdump reports nothing)."""
    import triton

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", usage)
    local = re.search(r"LOCAL:(\d+)", usage)
    return dict(regs=int(regs.group(1)) if regs else None, local=int(local.group(1)) if local else None,
                shared=kernel.metadata.shared)


def wgmma_forms(ptx: str) -> list[str]:
    """The distinct wgmma instructions of the PTX with registers, operand lists and the
    instruction's N blanked: what must match between two tilings of the same arithmetic (operands
    from shared memory, types, scale and transpose flags)."""
    ops = [line.strip() for line in ptx.splitlines() if "wgmma.mma_async" in line]
    return sorted({re.sub(r"n\d+k16", "nNk16", re.sub(r"%\w+", "%r", re.sub(r"\{[^}]*\}", "{}", op))) for op in ops})



def run_compile_script(name: str, args: list[str]) -> list[dict]:
    """Run tests/kernels/NAME with ARGS; its JSON lines, parsed. Skips the test where no ptxas
    for sm_90 is installed."""
    import pytest

    script = Path(__file__).with_name(name)
    run = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=600)
    if run.returncode != 0 and "ptxas" in run.stderr and "not found" in run.stderr:
        pytest.skip("no ptxas for sm_90")
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads(line) for line in run.stdout.splitlines()]

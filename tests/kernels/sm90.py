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
from collections import Counter
from pathlib import Path


def _cuobjdump(kernel, flag: str) -> str:
    """cuobjdump FLAG on the compiled kernel's cubin."""
    import triton

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True).stdout


def resource_usage(kernel) -> dict:
    """Registers and local memory (spills) of a compiled kernel's cubin, by cuobjdump, and its
    shared memory: {"regs", "local", "shared"} (None where cuobjdump reports nothing)."""
    usage = _cuobjdump(kernel, "-res-usage")
    regs = re.search(r"REG:(\d+)", usage)
    local = re.search(r"LOCAL:(\d+)", usage)
    return dict(regs=int(regs.group(1)) if regs else None, local=int(local.group(1)) if local else None,
                shared=kernel.metadata.shared)


def sass(kernel) -> str:
    """The compiled kernel's SASS, by cuobjdump."""
    return _cuobjdump(kernel, "-sass")


_SASS_LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)\S*(.*)")


def innermost_mma_loop(sass_text: str) -> dict:
    """The opcode counts of the shortest loop (a backward branch's span) that issues a wgmma
    (HGMMA): in an attention binary, the work one key tile costs a thread, instruction by
    instruction. {"instructions": n, opcode: count, ...}; {} where no loop has one."""
    code = [(int(m.group(1), 16), m.group(2), m.group(3)) for m in map(_SASS_LINE.match, sass_text.splitlines()) if m]
    best: list[str] | None = None
    for addr, op, rest in code:
        target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if target and int(target.group(1), 16) < addr:
            body = [o for a, o, _ in code if int(target.group(1), 16) <= a <= addr]
            if "HGMMA" in body and (best is None or len(body) < len(best)):
                best = body
    return {} if best is None else {"instructions": len(best), **Counter(best)}


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

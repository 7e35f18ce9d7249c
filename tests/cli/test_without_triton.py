"""A CPU-only install: `pip install torch==2.13.0` brings the CPU build of torch and no triton.
The CLI and the app's load path must work there (the torch references run). The test extras
install triton, so these tests run in a subprocess where `import triton` fails."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# Installed first in the child: every import of triton (or a submodule) fails as if not installed.
BLOCK_TRITON = textwrap.dedent(
    """
    import sys

    class _NoTriton:
        def find_spec(self, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _NoTriton())
    for _name in [n for n in sys.modules if n == "triton" or n.startswith("triton.")]:
        del sys.modules[_name]
    """
)


def run_without_triton(body: str, tmp_path) -> subprocess.CompletedProcess:
    env = dict(os.environ, JETSPEC_CHAT_CACHE=str(tmp_path / "cache"), TRITON_INTERPRET="0")
    code = BLOCK_TRITON + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)


def test_the_child_really_has_no_triton(tmp_path):
    done = run_without_triton(
        """
        try:
            import triton
        except ImportError:
            print("no triton")
        import jetspec_chat.kernels as k
        assert k.launch.triton is None
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "no triton" in done.stdout


def test_generate_works_without_triton(tmp_path):
    done = run_without_triton(
        """
        from jetspec_chat.cli import main
        raise SystemExit(main(["generate", "random:tiny-qwen3", "--prompt", "def f(x):", "--device", "cpu",
                               "--max-new-tokens", "6", "--json"]))
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["new_tokens"] == 6 and result["spec"] is True


@pytest.mark.parametrize("head", ["random", "none"])
def test_the_apps_load_path_works_without_triton(tmp_path, head):
    """The app's engine worker on the real backend: the load (which also warms AR and the budget)."""
    done = run_without_triton(
        f"""
        import queue
        from jetspec_chat.engine.params import GenerationParams
        from jetspec_chat.ui import engine_worker as ew

        outbox = queue.SimpleQueue()
        worker = ew.EngineWorker(ew.real_backend(), outbox)
        worker._load(ew.LoadCommand(ew.EngineSetup("random:tiny-qwen3", "{head}", "cpu")))
        items = []
        while not outbox.empty():
            items.append(outbox.get())
        failed = [i for i in items if isinstance(i, ew.EngineLoadFailed)]
        assert not failed, failed
        assert any(isinstance(i, ew.EngineReady) for i in items), items
        print("loaded")
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "loaded" in done.stdout

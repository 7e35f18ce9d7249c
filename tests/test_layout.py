"""The layout's promises (docs/DESIGN.md §1): the runtime (engine, kernels) imports no training,
bench or app code, and no two modules of jetspec_chat import each other, directly or around a
longer loop."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import jetspec_chat

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"jetspec_chat": ROOT / "jetspec_chat", "jetspec_chat.engine": ROOT / "engine",
            "jetspec_chat.kernels": ROOT / "kernels", "jetspec_chat.themes": ROOT / "themes"}


def test_the_runtime_imports_no_training_bench_or_ui_module():
    code = ("import sys; from jetspec_chat.engine import ChatSession, SpecEngine; "
            "print('\\n'.join(m for m in sys.modules if m.startswith('jetspec_chat')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "jetspec_chat.engine.engine" in loaded  # the check sees the runtime's own modules
    banned = ("jetspec_chat.training", "jetspec_chat.bench", "jetspec_chat.ui")
    assert not [m for m in loaded if m.startswith(banned)]


# The app's start, as `jetspec-chat MODEL` runs it, up to (not including) spawning the engine
# process: the CLI's parser, its model-argument check and the app object with its engine handle.
UI_START = """
import sys
from jetspec_chat import cli
from jetspec_chat.ui import launch
args = cli.app_parser().parse_args(["qwen2.5-coder-0.5b", "--device", "cpu"])
cli.check_model_argument(args.model)
app = launch.build_app(args)
assert app.chat.engine_process and app.chat.worker.pid is None  # the engine process is not started yet
import jetspec_chat.ui.fake_engine  # --demo and the tests run the fake in the UI process
print("\\n".join(sorted(sys.modules)))
"""


def test_the_ui_process_imports_no_torch(tmp_path):
    """The engine runs in its own process: the UI process never pays torch's import (~1 s and
    ~300 MB) nor its threads. Its imports: events, params, errors and the fake's answer rules."""
    env = {**os.environ, "JETSPEC_CHAT_DATA": str(tmp_path / "data"), "JETSPEC_CHAT_CONFIG": str(tmp_path / "config")}
    loaded = subprocess.run([sys.executable, "-c", UI_START], capture_output=True, text=True, check=True,
                            env=env).stdout.split()
    assert "jetspec_chat.ui.app" in loaded and "jetspec_chat.engine.events" in loaded  # it saw the app's imports
    heavy = [m for m in loaded if m.split(".")[0] in ("torch", "transformers", "triton", "numpy")]
    assert not heavy, heavy[:10]


def modules() -> dict[str, Path]:
    """Every module of the distribution by dotted name (packages as their __init__)."""
    out = {}
    for pkg, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("").parts
            if rel[-1] == "__init__":
                rel = rel[:-1]
            name = ".".join((pkg, *rel))
            if not any(name.startswith(other + ".") or name == other
                       for other in PACKAGES if other != pkg and other.startswith(pkg + ".")):
                out[name] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The jetspec_chat modules `name` imports anywhere in its body (lazy imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # `from pkg import module` names a module
                if f"{target}.{alias.name}" in known:
                    found.add(f"{target}.{alias.name}")
                elif target in known:
                    found.add(target)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
    found.discard(name)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_inside_jetspec_chat():
    mods = modules()
    assert "jetspec_chat.training.replay" in mods and "jetspec_chat.ui.app" in mods
    graph = {name: imports_of(name, path, set(mods)) for name, path in mods.items()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_runtime_imports_only_itself():
    """engine/ and kernels/ are the runtime: head training, the benchmarks and the app are its
    clients (jetspec_chat/training, jetspec_chat/bench, jetspec_chat/ui), never the other way round."""
    mods = modules()
    runtime = ("jetspec_chat.engine", "jetspec_chat.kernels")
    assert "jetspec_chat.training.run" in mods and "jetspec_chat.bench.end_to_end" in mods
    assert "jetspec_chat.engine.session" in mods and "jetspec_chat.kernels.reference" in mods
    for name, path in mods.items():
        if name.startswith(runtime):
            allowed = ("jetspec_chat.kernels",) if name.startswith("jetspec_chat.kernels") else runtime
            outside = sorted(m for m in imports_of(name, path, set(mods)) if not m.startswith(allowed))
            assert not outside, (name, outside)


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_version_is_the_distributions():
    assert jetspec_chat.__version__


def test_the_checkouts_kernels_folder_shadows_no_kernels_package():
    """Run from the checkout's root (`python -m jetspec_chat` there puts the root on sys.path), the
    top-level kernels/ folder must not stand in for the `kernels` distribution transformers imports:
    importing jetspec_chat takes the root off sys.path."""
    code = ("import importlib.util, jetspec_chat; spec = importlib.util.find_spec('kernels'); "
            "print(spec.origin if spec else None)")
    origin = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=ROOT).stdout.strip()
    assert origin == "None" or not Path(origin).resolve().is_relative_to(ROOT / "kernels"), origin

"""engine/training's modules import each other without a cycle (issue 15: replay.py and train.py
used to import each other), and the eval sets live outside training (bench reads them too)."""
import ast
from pathlib import Path

import jetspec_chat.engine.training as training

PACKAGE = Path(training.__file__).parent


def local_imports(path: Path) -> set[str]:
    """Modules of engine/training that `path` imports (top level or inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(alias.name for alias in node.names)
    return out


def test_training_modules_form_no_import_cycle():
    graph = {p.stem: local_imports(p) for p in PACKAGE.glob("*.py")}
    assert "replay" in graph and "run" in graph  # the walk sees the package
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import cycle: {' -> '.join(path + (name,))}"
        if name in done or name not in graph:
            return
        for dep in sorted(graph[name]):
            visit(dep, path + (name,))
        done.add(name)

    for name in sorted(graph):
        visit(name, ())


def test_eval_sets_are_their_own_module():
    from jetspec_chat.engine import eval_sets
    from jetspec_chat.engine.training import prompts

    assert not any(p.stem == "eval_sets" for p in PACKAGE.glob("*.py"))
    assert "EVAL_SETS" not in vars(prompts) and eval_sets.eval_prompts("chat") == list(eval_sets.EVAL_SETS["chat"])

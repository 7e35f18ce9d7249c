"""The app's shape (docs/DESIGN.md §7): no class of jetspec_chat is over 400 lines, and the
app class is a composition root, a plain Textual `App` without mixin bases."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_CLASS_LINES = 400


def parsed() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(encoding="utf-8"), str(path))
            for path in sorted((ROOT / "jetspec_chat").rglob("*.py"))}


def test_no_class_is_over_400_lines():
    trees = parsed()
    assert ROOT / "jetspec_chat" / "ui" / "app.py" in trees  # the walk sees the app
    too_long = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                lines = node.end_lineno - start + 1
                if lines > MAX_CLASS_LINES:
                    too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not too_long, too_long


def test_the_app_class_has_textual_app_as_its_only_base():
    tree = ast.parse((ROOT / "jetspec_chat" / "ui" / "app.py").read_text(encoding="utf-8"))
    imported = {alias.asname or alias.name: f"{node.module}.{alias.name}"
                for node in tree.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    [app] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "JetspecApp"]
    bases = [ast.unparse(b) for b in app.bases]
    assert len(bases) == 1 and imported.get(bases[0]) == "textual.app.App", bases

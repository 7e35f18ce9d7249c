"""Themes: the shipped ones (package `jetspec_chat.themes`, *.toml) and the user's own
(`<config dir>/themes/*.toml`), as Textual `Theme` objects.

The speculation colors are theme variables, usable in CSS as `$spec-accepted` etc. and read by
the tree and provenance renderers through `SpecColors.from_app`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from textual.theme import Theme

THEME_VARIABLE_DEFAULTS: dict[str, str] = {
    "spec-accepted": "#4caf50",
    "spec-bonus": "#ffb300",
    "spec-rejected": "#808080",
    "spec-root": "#29b6f6",
    "spec-draft-text": "#4caf50",
    "spec-target-text": "#ffb300",
    "spec-tree-style": "none",
    "spec-projector": "false",
}

ALIASES = {
    "dark": "jetspec-dark",
    "light": "jetspec-light",
    "projector": "jetspec-projector",
    "high-contrast": "jetspec-projector",
}
DEFAULT_THEME = "jetspec-dark"

_COLOR_FIELDS = ("primary", "secondary", "warning", "error", "success", "accent", "foreground", "background", "surface", "panel", "boost")


class ThemeFileError(Exception):
    pass


def _parse_toml(text: str) -> dict[str, Any]:
    try:
        import tomllib  # Python 3.11+
    except ImportError:  # pragma: no cover - Python 3.10
        return _parse_mini_toml(text)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ThemeFileError(str(err)) from None


_LINE = re.compile(r'^\s*([A-Za-z0-9_\-]+)\s*=\s*(".*?"|true|false|-?[0-9.]+)\s*(#.*)?$')


def _parse_mini_toml(text: str) -> dict[str, Any]:
    """The subset theme files use: `key = "string" | true | false | number`, `[table]`."""
    out: dict[str, Any] = {}
    table = out
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            table = out.setdefault(line[1:-1].strip(), {})
            continue
        m = _LINE.match(line)
        if not m:
            raise ThemeFileError(f"line {n}: cannot parse {raw!r}")
        key, value = m.group(1), m.group(2)
        if value.startswith('"'):
            table[key] = value[1:-1]
        elif value in ("true", "false"):
            table[key] = value == "true"
        else:
            table[key] = float(value) if "." in value else int(value)
    return out


def theme_from_mapping(data: dict[str, Any], default_name: str) -> Theme:
    if not isinstance(data, dict):
        raise ThemeFileError("not a table")
    name = str(data.get("name") or default_name)
    if "primary" not in data:
        raise ThemeFileError("missing 'primary' color")
    kwargs: dict[str, Any] = {}
    for key in _COLOR_FIELDS:
        if key in data:
            if not isinstance(data[key], str):
                raise ThemeFileError(f"{key!r} must be a color string")
            kwargs[key] = data[key]
    variables = data.get("variables", {})
    if not isinstance(variables, dict):
        raise ThemeFileError("[variables] must be a table")
    theme = Theme(
        name=name,
        dark=bool(data.get("dark", True)),
        variables={str(k): str(v) for k, v in variables.items()},
        **kwargs,
    )
    # Fail now, with a message, rather than when the theme is applied.
    try:
        theme.to_color_system().generate()
    except Exception as err:  # noqa: BLE001 - textual raises various parse errors
        raise ThemeFileError(f"invalid color: {err}") from None
    return theme


def load_theme_file(path: Path) -> Theme:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ThemeFileError(str(err)) from None
    return theme_from_mapping(_parse_toml(text), path.stem)


def builtin_themes() -> list[Theme]:
    out = []
    for entry in sorted(resources.files("jetspec_chat.themes").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            out.append(theme_from_mapping(_parse_toml(entry.read_text(encoding="utf-8")), entry.name[:-5]))
    return out


def user_themes(directory: Path) -> tuple[list[Theme], list[str]]:
    """Themes from a directory of *.toml files, and a warning per file that was skipped."""
    themes: list[Theme] = []
    warnings: list[str] = []
    if not directory.is_dir():
        return themes, warnings
    for path in sorted(directory.glob("*.toml")):
        try:
            themes.append(load_theme_file(path))
        except ThemeFileError as err:
            warnings.append(f"theme file {path} ignored: {err}")
    return themes, warnings


def resolve_theme_name(name: str | None, available: dict[str, Theme] | list[str]) -> str | None:
    if not name:
        return None
    names = list(available)
    name = name.strip()
    for candidate in (name, ALIASES.get(name.lower(), ""), f"jetspec-{name.lower()}"):
        if candidate in names:
            return candidate
    return None


@dataclass(frozen=True)
class SpecColors:
    accepted: str
    bonus: str
    rejected: str
    root: str
    draft_text: str
    target_text: str
    tree_bold: bool
    projector: bool
    background: str
    foreground: str
    muted: str

    @classmethod
    def from_variables(cls, v: dict[str, str]) -> "SpecColors":
        d = {**THEME_VARIABLE_DEFAULTS, **v}
        return cls(
            accepted=_hex(d["spec-accepted"]),
            bonus=_hex(d["spec-bonus"]),
            rejected=_hex(d["spec-rejected"]),
            root=_hex(d["spec-root"]),
            draft_text=_hex(d["spec-draft-text"]),
            target_text=_hex(d["spec-target-text"]),
            tree_bold=d["spec-tree-style"].strip().lower() == "bold",
            projector=d["spec-projector"].strip().lower() == "true",
            background=_hex(d.get("background", "#000000")),
            foreground=_hex(d.get("foreground", "#ffffff")),
            muted=blend(_hex(d.get("background", "#000000")), _hex(d.get("foreground", "#ffffff")), 0.62),
        )

    @classmethod
    def from_app(cls, app: Any) -> "SpecColors":
        try:
            variables = app.theme_variables
        except Exception:  # noqa: BLE001
            variables = {}
        return cls.from_variables(variables or {})

    def shade(self, color: str, strength: float) -> str:
        """`color` blended toward the background: strength 1 = full color, 0 = background."""
        return blend(self.background, color, 0.35 + 0.65 * max(0.0, min(1.0, strength)))


def _hex(value: str) -> str:
    from textual.color import Color

    try:
        return Color.parse(value.split()[0]).hex6
    except Exception:  # noqa: BLE001
        return "#808080"


def blend(a: str, b: str, t: float) -> str:
    from textual.color import Color

    try:
        return Color.parse(a).blend(Color.parse(b), t).hex6
    except Exception:  # noqa: BLE001
        return b

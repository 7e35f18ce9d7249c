"""Settings and the saved-session store.

Everything on disk goes through `atomic_write_text`: the new content is written to a temporary
file in the same directory, flushed and fsynced, then moved over the old file with
`os.replace`, so a crash leaves either the old file or the new one, never a torn one.

Locations (platformdirs), overridable for tests and portable setups:
- config dir (`JETSPEC_CHAT_CONFIG`): settings.json, themes/*.toml (user themes)
- data dir (`JETSPEC_CHAT_DATA`): sessions/*.json, exports/ (SVG screenshots, round traces),
  history.json (input history), error.log
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import platformdirs

from .engine.params import GPU_BUDGET, GPU_COMPARE_BUDGETS
from .options import OPTIONS


def compare_labels(budgets: tuple[int, ...]) -> list[str]:
    """(0, 16, 32) -> ['AR', '16', '32']: the compare screen's labels (0 is plain AR)."""
    return ["AR" if b == 0 else str(b) for b in budgets]

APP_NAME = "jetspec-chat"
SESSION_FORMAT = "jetspec-chat-session"
SESSION_VERSION = 1
HISTORY_LIMIT = 500


# ----------------------------------------------------------------------------- paths


def config_dir() -> Path:
    env = os.environ.get("JETSPEC_CHAT_CONFIG")
    return Path(env) if env else Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))


def data_dir() -> Path:
    env = os.environ.get("JETSPEC_CHAT_DATA")
    return Path(env) if env else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def settings_path() -> Path:
    return config_dir() / "settings.json"


def user_themes_dir() -> Path:
    return config_dir() / "themes"


def sessions_dir() -> Path:
    return data_dir() / "sessions"


def exports_dir() -> Path:
    return data_dir() / "exports"


def history_path() -> Path:
    return data_dir() / "history.json"


def error_log_path() -> Path:
    return data_dir() / "error.log"


# ----------------------------------------------------------------------------- atomic IO


def atomic_write_text(path: Path, text: str) -> None:
    """Replace `path` with `text` so that readers (and crashes) never see a partial file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if hasattr(os, "O_DIRECTORY"):  # make the rename itself durable (POSIX)
        try:
            dfd = os.open(path.parent, os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


# ----------------------------------------------------------------------------- settings


@dataclass
class Settings:
    """What the app remembers between runs. Unknown or malformed keys on disk are ignored."""

    theme: str = "jetspec-dark"
    # the budget follows the device (auto_budget, set once the engine reports its device) until the
    # user picks one; GPU_BUDGET stands in before that
    budget: int = GPU_BUDGET
    budget_auto: bool = True
    depth: int | None = None  # None: the head's full block
    # the defaults of the options the command line shares: declared once in options.py
    width: int = OPTIONS["width"].default
    tree_algo: str = OPTIONS["tree_algo"].default
    speculation: bool = True
    temperature: float = OPTIONS["temperature"].default
    top_p: float = OPTIONS["top_p"].default
    seed: int | None = None
    max_new_tokens: int = OPTIONS["max_new_tokens"].default
    thinking: bool = False
    system_prompt: str | None = None
    compare_budgets: list[str] | None = None  # None: the list follows the device (auto_compare_budgets)
    provenance: bool = False  # color the answer by provenance (accepted draft vs target token)
    replay_speed: float = 4.0  # rounds per second when replaying an answer
    show_scores: bool = True

    @classmethod
    def from_dict(cls, data: Any) -> "Settings":
        s = cls()
        if not isinstance(data, dict):
            return s
        for f in dataclasses.fields(cls):
            if f.name not in data:
                continue
            value = data[f.name]
            default = getattr(s, f.name)
            if _type_ok(f.name, value, default):
                setattr(s, f.name, list(value) if isinstance(value, list) else value)
        if s.compare_budgets == compare_labels(GPU_COMPARE_BUDGETS):  # the old fixed default: follow the device
            s.compare_budgets = None
        return s

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_OPTIONAL_INT = {"depth", "seed"}
_OPTIONAL_STR = {"system_prompt"}
_OPTIONAL_LABELS = {"compare_budgets"}


def _type_ok(name: str, value: Any, default: Any) -> bool:
    if name in _OPTIONAL_INT:
        return value is None or (isinstance(value, int) and not isinstance(value, bool))
    if name in _OPTIONAL_STR:
        return value is None or isinstance(value, str)
    if name in _OPTIONAL_LABELS:
        return value is None or (isinstance(value, list) and all(isinstance(v, str) for v in value))
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, list):
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return False


def load_settings(path: Path | None = None) -> Settings:
    path = path or settings_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return Settings()
    return Settings.from_dict(data)


def save_settings(settings: Settings, path: Path | None = None) -> None:
    atomic_write_json(path or settings_path(), settings.to_dict())


# ----------------------------------------------------------------------------- input history


def load_history(path: Path | None = None) -> list[str]:
    path = path or history_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(data, list):
        return []
    return [h for h in data if isinstance(h, str)][-HISTORY_LIMIT:]


def save_history(history: list[str], path: Path | None = None) -> None:
    atomic_write_json(path or history_path(), history[-HISTORY_LIMIT:])


# ----------------------------------------------------------------------------- sessions


class SessionStoreError(Exception):
    """str(error) is a user-facing message."""


@dataclass(frozen=True)
class SessionInfo:
    name: str
    path: Path
    saved_at: str  # ISO 8601, UTC
    title: str
    messages: int
    model: str | None


_NAME_RE = re.compile(r"[^A-Za-z0-9._-]+")


def sanitize_session_name(name: str) -> str:
    """A safe file stem: letters, digits, '.', '_' and '-' (others become '-')."""
    cleaned = _NAME_RE.sub("-", name.strip()).strip(".-")[:64]
    return cleaned


def title_from_messages(messages: list[dict]) -> str:
    for m in messages:
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            line = " ".join(m["content"].split())
            return line[:60] + ("…" if len(line) > 60 else "")
    return "(empty chat)"


def suggest_session_name(messages: list[dict]) -> str:
    title = title_from_messages(messages)
    words = re.findall(r"[A-Za-z0-9]+", title.lower())[:5]
    return "-".join(words) or "chat"


class SessionStore:
    """Saved chats, one JSON file each, in `<data dir>/sessions`."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = Path(directory) if directory else sessions_dir()

    def path_for(self, name: str) -> Path:
        safe = sanitize_session_name(name)
        if not safe:
            raise SessionStoreError(f"{name!r} is not a usable session name")
        return self.directory / f"{safe}.json"

    def exists(self, name: str) -> bool:
        try:
            return self.path_for(name).exists()
        except SessionStoreError:
            return False

    def save(
        self,
        name: str,
        session: dict,
        *,
        model: str | None = None,
        draft_head: str | None = None,
        extra: dict | None = None,
    ) -> Path:
        path = self.path_for(name)
        messages = session.get("messages", []) if isinstance(session, dict) else []
        payload = {
            "format": SESSION_FORMAT,
            "version": SESSION_VERSION,
            "name": path.stem,
            "saved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "title": title_from_messages(messages),
            "model": model,
            "draft_head": draft_head,
            "session": session,
            "ui": extra or {},
        }
        try:
            atomic_write_json(path, payload)
        except OSError as err:
            raise SessionStoreError(f"could not save session to {path}: {err.strerror or err}") from err
        return path

    def load(self, name: str) -> dict:
        path = self.path_for(name)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SessionStoreError(f"no saved session named {path.stem!r}") from None
        except (OSError, ValueError) as err:
            raise SessionStoreError(f"session file {path} is unreadable: {err}") from None
        if not isinstance(data, dict) or data.get("format") != SESSION_FORMAT or not isinstance(
            data.get("session"), dict
        ):
            raise SessionStoreError(f"{path} is not a jetspec-chat session file")
        if int(data.get("version", 0)) > SESSION_VERSION:
            raise SessionStoreError(f"{path} was saved by a newer jetspec-chat")
        return data

    def list(self) -> list[SessionInfo]:
        out: list[SessionInfo] = []
        if not self.directory.is_dir():
            return out
        for path in self.directory.glob("*.json"):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                session = data["session"]
                messages = session.get("messages", [])
                out.append(
                    SessionInfo(
                        name=path.stem,
                        path=path,
                        saved_at=str(data.get("saved_at", "")),
                        title=str(data.get("title") or title_from_messages(messages)),
                        messages=len(messages),
                        model=data.get("model"),
                    )
                )
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # a foreign or damaged file: not listed
        out.sort(key=lambda s: (s.saved_at, s.name), reverse=True)
        return out

    def delete(self, name: str) -> None:
        try:
            self.path_for(name).unlink()
        except FileNotFoundError:
            pass

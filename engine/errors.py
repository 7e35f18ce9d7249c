"""Errors with messages meant for the user: one clear sentence, no traceback needed."""
from __future__ import annotations


class EngineError(Exception):
    """Base class: str(error) is shown to the user as is."""


class ConfigError(EngineError, ValueError):
    """A parameter is out of range or inconsistent (budget, depth, width, ...)."""


class ModelNotFoundError(EngineError):
    """The MODEL argument names nothing we can load (unknown alias, missing files, offline hub)."""


class DraftHeadError(EngineError):
    """The draft head is missing, malformed, or does not match the target model."""


class ContextOverflowError(EngineError):
    """The prompt does not fit in the context window."""


class DeviceMemoryError(EngineError):
    """Out of device memory; the message names the setting to lower."""


class MissingPackageError(EngineError):
    """A Python package the run needs is not installed. Retrying does not help; installing does."""

    @classmethod
    def from_import_error(cls, err: ImportError) -> "MissingPackageError":
        top = (err.name or "").split(".")[0]
        if not top:  # an ImportError without a module name: a broken install, not a missing one
            return cls(f"a package failed to import ({err}); reinstall jetspec-chat, then start it again")
        return cls(f"the Python package '{top}' is missing: install it (pip install {top}), then start again")


# The exit code of an engine process whose tensor-parallel worker died (it reports that in one
# sentence on stderr; the app's engine process watcher names it too).
WORKER_DIED_EXIT_CODE = 3

"""The speculative decoding engine. The UI needs only what is exported here.

The parameter, event and error types import no torch, so the app's UI process can use them;
`SpecEngine`, `ChatSession` and `load_engine` import torch and are loaded on first use (the
engine runs in its own process, which is the one that pays for torch)."""
from .errors import (
    ConfigError,
    ContextOverflowError,
    DeviceMemoryError,
    DraftHeadError,
    EngineError,
    ModelNotFoundError,
)
from .events import Event, FinishEvent, GenerationResult, PhaseTimings, PrefillEvent, RoundEvent
from .params import TREE_ALGOS, GenerationParams, SamplingParams, SpecParams


def load_engine(*args, tp: int | None = None, **kwargs):
    """See loader.load_engine. Imported on first use: it pulls in torch and transformers.
    tp > 1: the model split over tp ranks (tp_launcher.launch), each a process with its own
    device; the engine returned is rank 0's, driving the others (`engine.tp` says how many).
    tp None: 1, or on a GPU the fewest GPUs that hold the target's weights (loader.auto_tp)."""
    if tp is None:
        from .models.loader import auto_tp

        tp = auto_tp(*args, **kwargs)
    if tp != 1:
        from .tp_launcher import launch

        return launch(tp, *args, **kwargs)
    from .models.loader import load_engine as _load_engine

    return _load_engine(*args, **kwargs)


def __getattr__(name: str):
    """`SpecEngine` and `ChatSession`, imported on first use (they pull in torch)."""
    if name == "SpecEngine":
        from .engine import SpecEngine

        return SpecEngine
    if name == "ChatSession":
        from .session import ChatSession

        return ChatSession
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ChatSession", "ConfigError", "ContextOverflowError", "DeviceMemoryError", "DraftHeadError", "EngineError",
    "Event", "FinishEvent", "GenerationParams", "GenerationResult", "ModelNotFoundError", "PhaseTimings",
    "PrefillEvent", "RoundEvent", "SamplingParams", "SpecEngine", "SpecParams", "TREE_ALGOS", "load_engine",
]

"""The speculative decoding engine. The UI needs only what is exported here."""
from .engine import SpecEngine
from .errors import (
    ConfigError,
    ContextOverflowError,
    DeviceMemoryError,
    DraftHeadError,
    EngineError,
    ModelNotFoundError,
)
from .events import Event, FinishEvent, GenerationResult, PhaseTimings, PrefillEvent, RoundEvent
from .params import GenerationParams, SamplingParams, SpecParams
from .session import ChatSession
from .tree import TREE_ALGOS


def load_engine(*args, **kwargs) -> SpecEngine:
    """See loader.load_engine. Imported on first use: model resolution pulls in transformers."""
    from .models.loader import load_engine as _load_engine

    return _load_engine(*args, **kwargs)


__all__ = [
    "ChatSession", "ConfigError", "ContextOverflowError", "DeviceMemoryError", "DraftHeadError", "EngineError",
    "Event", "FinishEvent", "GenerationParams", "GenerationResult", "ModelNotFoundError", "PhaseTimings",
    "PrefillEvent", "RoundEvent", "SamplingParams", "SpecEngine", "SpecParams", "TREE_ALGOS", "load_engine",
]

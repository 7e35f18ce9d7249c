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


def load_engine(model: str | None = None, draft_head: str | None = None, device: str = "auto", dtype: str = "auto",
                max_context: int | None = None, progress=None, depth: int | None = None, *, tp: int | None = None):
    """See loader.load_engine. Imported on first use: it pulls in torch and transformers.
    tp > 1: the model split over tp ranks (tp_launcher.launch), each a process with its own
    device; the engine returned is rank 0's, driving the others (`engine.tp` says how many).
    tp None: 1, or on a GPU the fewest GPUs that hold the target's weights (loader.auto_tp).
    The model is resolved once, after the device is checked (a hub model's requests, a converted
    copy's check), and that source goes to the GPU count, the launcher and every rank."""
    from .models.loader import auto_tp, resolve_device
    from .models.loader import load_engine as _load_engine
    from .models.model_sources import resolve_model

    resolve_device(device)  # a device this machine lacks: said before any download
    source = resolve_model(model, progress)
    if tp is None:
        tp = auto_tp(source, device, dtype, progress)
    if tp != 1:
        from .tp_launcher import launch

        return launch(tp, source, draft_head, device=device, dtype=dtype, max_context=max_context, progress=progress,
                      depth=depth)
    return _load_engine(source, draft_head, device=device, dtype=dtype, max_context=max_context, progress=progress,
                        depth=depth)


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

"""Jobs the app asked of the engine, and the table that routes what the engine reports.

Nothing here imports Textual: the router and the job records can be driven and tested alone.
The app registers one handler per outbox item type (`OutboxRouter`); an item of a type
nobody registered is reported back to the caller instead of vanishing in an isinstance chain.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Union, get_args

from jetspec_chat.engine.params import SpecParams

from . import engine_worker as ew
from .trace import AnswerTrace

Handler = Callable[[Any], Union[Awaitable[None], None]]


@dataclass
class Job:
    kind: str  # "chat" | "rerun" | "compare" | "session"
    trace: AnswerTrace | None = None
    message: Any = None  # the chat's AssistantMessage widget (chat jobs)
    turn: int = 0
    pre_session: dict | None = None  # reruns: the session before, to put back if the answer changed
    live_spec: SpecParams | None = None  # chat: the tree shape last asked of the engine


def outbox_item_types() -> tuple[type, ...]:
    """Every type the engine worker may put in the outbox."""
    return tuple(get_args(ew.OutboxItem))


class OutboxRouter:
    """A table of handlers keyed by outbox item type."""

    def __init__(self, handlers: Mapping[type, Handler]) -> None:
        self.handlers = dict(handlers)

    def missing(self) -> list[type]:
        """Outbox item types without a handler (a test keeps this empty)."""
        return [t for t in outbox_item_types() if t not in self.handlers]

    async def dispatch(self, item: Any) -> bool:
        """Run the handler for `item`'s type; False when there is none."""
        handler = self.handlers.get(type(item))
        if handler is None:
            return False
        result = handler(item)
        if inspect.isawaitable(result):
            await result
        return True

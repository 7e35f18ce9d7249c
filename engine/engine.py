"""The single-stream speculative engine: prefill, rounds (draft -> tree -> verify -> accept ->
commit), prefix reuse across calls, stop conditions, events.

Invariant between rounds: the target's KV cache holds every committed token except the last,
the anchor (whose hidden state does not exist yet). The anchor also lives on the device
(`SpecEngine.anchor`, a 0-d scalar): the prefill's choice seeds it and each round's verify step
writes its bonus token there, so the next round's draft reads it without a host->device copy.
The draft context mirrors the KV cache: draft_kv.length + draft_kv.held == kv.length between
rounds (the prefill appends its chunks' features eagerly; a drafting round's verify step appends
the accepted rows and advances both lengths on the device, and the host follows from the round's
one copy). A graphed AR round holds its row instead (DraftKVCache.hold): the held rows are
appended in one step before the next draft forward or prefill append, and every held_rows AR
rounds, so every draft forward sees draft_kv.length == kv.length.
During a round's event the next round may already be running on the device (the round ahead,
`_generate`): then the device's lengths and anchor are that round's, and the host catches up at
its copy.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Iterator

import torch

from .accept import PackedRound, target_choices, unpack_round
from .answer import Answer, LiveSpec
from .detokenize import TokenTexts
from .draft_head import DraftHead, DraftKVCache
from .errors import ConfigError, ContextOverflowError, DeviceMemoryError
from .events import Event, FinishEvent, GenerationResult, PhaseTimings, PrefillEvent, RoundEvent
from .kv_cache import PagedKVCache
from .model import ForwardBatch, TargetModel
from .params import GenerationParams, SpecParams
from .tree import root_only
from .graphs import SCRATCH_ROWS, DraftRunner, VerifyRunner

PREFILL_CHUNK = 512


@dataclass
class RoundOutput:
    tree_tokens: list[int]
    tree_parents: list[int]
    tree_depths: list[int]
    tree_scores: list[float]
    path: list[int]  # accepted nodes from the root
    new_tokens: list[int]  # accepted draft tokens then the bonus
    timings: dict[str, float]


CONTEXT_FULL = "the context is full ({} tokens); raise --max-context"


@dataclass
class _Launched:
    """A round enqueued by Engine._launch and not yet collected. `ints` receives the packed
    output (PackedRound.ints) by a copy enqueued right after the round: the next round's graphs
    rewrite the device buffer, and may be launched before this one is collected."""

    ints: torch.Tensor  # on the host (pinned on CUDA, filled once the clock's last event is done)
    path_len: int
    size: int  # tree nodes
    clock: "_PhaseClock"
    held: bool  # an AR round that held its draft-context row: the draft length stays
    appended: int  # held rows appended to the draft context just before this round


class _PhaseClock:
    """Per-phase times without host syncs: CUDA events on the GPU (read after the round's one
    sync), the wall clock elsewhere."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = [("start", self._stamp())]

    def _stamp(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def mark(self, phase: str) -> None:
        self.marks.append((phase, self._stamp()))

    def elapsed(self) -> dict[str, float]:
        if self.cuda:  # the last event is recorded after the round's copy: wait the few µs until it completes
            self.marks[-1][1].synchronize()
        out = {}
        for (_, a), (phase, b) in zip(self.marks, self.marks[1:]):
            out[phase] = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
        return out


class SpecEngine:
    tp = 1  # the tensor-parallel ranks it drives (tp_launcher.TPEngine: the group's)

    def __init__(
        self,
        target: TargetModel,
        tokenizer,
        head: DraftHead | None,
        *,
        model_name: str,
        head_name: str | None,
        max_context: int,
        stop_token_ids: tuple[int, ...],
        source=None,
    ):
        self.target = target
        self.tokenizer = tokenizer
        self.head = head
        self.model_name = model_name
        self.source = source  # the ModelSource the weights came from (for the transformers oracle)
        self.head_name = head_name
        p = next(target.parameters())
        self.torch_device, self.torch_dtype = p.device, p.dtype
        self.device = str(p.device)
        self.dtype = str(p.dtype).removeprefix("torch.")
        self.max_context = min(max_context, target.cfg.max_position_embeddings)
        self.stop_token_ids = frozenset(stop_token_ids)
        self.tap_layers = head.cfg.target_layer_ids if head is not None else ()
        self.token_text = TokenTexts(tokenizer)
        self.kv: PagedKVCache | None = None
        self.verify: VerifyRunner | None = None
        self.drafter: DraftRunner | None = None
        self.draft_kv: DraftKVCache | None = None
        self.tokens: list[int] = []  # committed; tokens[:kv.length] are cached, the last is the anchor
        # tokens[-1] on the device during an answer (graph input of the draft, set by the verify step).
        self.anchor = torch.zeros((), dtype=torch.long, device=self.torch_device)
        self._root = root_only(self.anchor)  # the AR round's tree; its token is a view of the anchor
        self._live_spec = LiveSpec()  # set by update_spec, taken at a round boundary
        # Tensor parallel (tp_launcher): (params, cancelled) -> rank 0's, at every round boundary.
        self.round_sync = None
        # While a RoundEvent is out: whether the next round is already launched (a live tree
        # change made now applies one round later; the app's worker says which round).
        self.round_ahead = False
        # Whether a round may be queued before the previous one is collected (`_generate`); off
        # only for drafts that read the host's committed tokens (the tests' oracle drafts).
        self.queue_rounds = True

    # -- state -----------------------------------------------------------------------------
    @property
    def max_depth(self) -> int | None:
        return self.head.cfg.max_depth if self.head is not None else None

    @property
    def context_tokens(self) -> int:
        return self.kv.length if self.kv is not None else 0

    def memory_bytes(self) -> int:
        n = self.kv.nbytes if self.kv is not None else 0
        return n + (self.draft_kv.nbytes if self.draft_kv is not None else 0)

    def set_max_context(self, tokens: int) -> None:
        """Resize the (lazily allocated) caches; drops any cached conversation."""
        tokens = min(tokens, self.target.cfg.max_position_embeddings)
        if tokens != self.max_context:
            self.max_context = tokens
            self.kv = self.draft_kv = self.verify = self.drafter = None
            self.tokens = []

    def update_spec(self, spec: SpecParams) -> None:
        """Change the tree shape (budget, depth, width, algorithm, on/off) from the next round of
        the answer in progress. Safe from another thread (a locked one-slot mailbox)."""
        spec.validate(self.max_depth)
        self._live_spec.put(spec)

    def reset(self) -> None:
        if self.kv is not None:
            self.rollback(0)
        self.tokens = []

    def release(self) -> None:
        """Drop the caches and the graph runners with their CUDA graphs (allocate() makes them
        again). Tensor parallelism calls it before leaving the process group: NCCL does not
        destroy a communicator while a CUDA graph that captured its collectives is alive."""
        self.kv = self.draft_kv = self.verify = self.drafter = None
        self.tokens = []

    def allocate(self) -> None:
        """Allocate the KV caches and the graph runners for `max_context` (once; `generate` calls
        it, the bench calls it before timing rounds directly)."""
        if self.kv is not None:
            return
        cfg = self.target.cfg
        try:
            # One padded tree of scratch rows past the context limit.
            # Qwen3.5: full-attention KV plus the recurrent layers' state slots; Gemma 4: KV rows of
            # two shapes (MixedKVCache).
            if cfg.hybrid is not None or cfg.gemma4 is not None:
                self.kv = self.target.make_cache(self.max_context + SCRATCH_ROWS, self.torch_device, self.torch_dtype)
            else:
                self.kv = PagedKVCache(
                    cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, self.max_context + SCRATCH_ROWS,
                    self.torch_device, self.torch_dtype,
                )
            append = None
            if self.head is not None:
                # kv.capacity leaves SCRATCH_ROWS (>= block_size) past the context limit: room for
                # the draft block's rows and a fixed-size append's surplus rows (DraftKVCache).
                assert self.head.cfg.block_size <= SCRATCH_ROWS
                self.draft_kv = DraftKVCache(self.head.cfg, self.kv.capacity, self.torch_device, self.torch_dtype)
                append = partial(self.head.append_accepted, self.draft_kv)
            self.verify = VerifyRunner(
                self.target, self.kv, self.tap_layers, self.anchor, self.max_depth or 0, self.draft_kv, append
            )
            if self.head is not None:
                self.drafter = DraftRunner(self.head, self.draft_kv, self.target, self.anchor, self.verify)
        except torch.OutOfMemoryError:
            self.kv = self.draft_kv = self.verify = self.drafter = None
            raise DeviceMemoryError(
                f"out of device memory allocating the KV cache for {self.max_context} tokens; lower --max-context"
            ) from None

    def rollback(self, length: int) -> None:
        """Roll the caches back to `length` committed tokens (no round in flight)."""
        self.kv.truncate(length)  # a recurrent cache may land earlier (HybridCache.truncate)
        d = self.draft_kv
        if d is not None:
            d.length = min(d.length, self.kv.length)
            d.held = self.kv.length - d.length  # held rows below the new length stay valid
        self.tokens = self.tokens[: length + 1]

    @property
    def _holds(self) -> bool:
        """Whether AR rounds hold their draft-context row (DraftKVCache.hold): on the graph path,
        but for recurrent caches (they roll back inside a round; the eager path appends)."""
        return self.draft_kv is not None and self.verify.use_graphs and not self.verify.recurrent

    def _append_held(self) -> int:
        """Append the rows AR rounds held to the draft context (VerifyRunner.append_held), after
        the rounds already launched; returns how many, which the host's draft length takes when
        the caller says (the device's has them once the append has run)."""
        d = self.draft_kv
        n = d.held
        if n:
            self.verify.append_held()
            d.held = 0
        return n

    # -- timing ----------------------------------------------------------------------------
    def _now(self) -> float:
        if self.torch_device.type == "cuda":
            torch.cuda.synchronize(self.torch_device)
        return time.perf_counter()

    # -- prefill ---------------------------------------------------------------------------
    def _prefill(self, prompt_ids: list[int]) -> tuple[torch.Tensor, int]:
        """Reuse the longest cached prefix, compute the rest; returns (last-position logits, reused)."""
        cached = self.tokens[: self.kv.length]
        lcp = 0
        for a, b in zip(cached, prompt_ids):
            if a != b:
                break
            lcp += 1
        lcp = min(lcp, len(prompt_ids) - 1)  # at least one token must run to get the next logits
        self.rollback(lcp)
        lcp = self.kv.length  # a recurrent cache may restore only an earlier length (HybridCache.truncate)
        if self.draft_kv is not None:  # the context below lcp is complete before the chunks append
            self.draft_kv.note_advance(self._append_held())
        self.tokens = list(prompt_ids)
        start = lcp
        logits = None
        while start < len(prompt_ids):
            chunk = prompt_ids[start : start + PREFILL_CHUNK]
            t = len(chunk)
            batch = ForwardBatch(
                input_ids=torch.tensor(chunk, device=self.torch_device),
                positions=torch.arange(start, start + t, device=self.torch_device),
                tree_mask=torch.ones(t, t, dtype=torch.bool, device=self.torch_device).tril(),
                prefix_len=start,
                causal=True,
            )
            hidden, taps = self.target(batch, self.kv, self.tap_layers)
            self.kv.commit_chunk(start + t)
            if self.head is not None:  # variable size, once per chunk: eagerly
                self.head.append_context(self.draft_kv, taps)
            start += t
            logits = self.target.logits(hidden[-1:])
        return logits, lcp

    # -- one round -------------------------------------------------------------------------
    def round(self, params: GenerationParams, generator: torch.Generator | None) -> RoundOutput:
        """draft -> tree -> verify -> accept -> commit, enqueued without host syncs and started
        from the device anchor; then the round's one device->host copy (the packed integers
        with the tree's scores). Greedy with a fixed-shape tree on CUDA: the draft graph (which
        writes the tree into the verify bucket), the verify graph (which commits, appends the
        draft context and advances the lengths on the device), the copy; nothing in between
        (sampling: the draw of the round's uniforms before the verify replay)."""
        return self._collect(self._launch(params, generator))

    def _next_round(
        self, params: GenerationParams, generator: torch.Generator | None, cancel: threading.Event | None
    ) -> tuple[GenerationParams, "_Launched | None", float, str | None]:
        """A round boundary: the latest live tree change, then cancel and the context's room;
        returns the params, the launched round and when it was launched, or no round and why
        the answer ends ("cancelled" | "context_full")."""
        params = self._live_spec.apply(params)
        cancelled = cancel is not None and cancel.is_set()
        if self.round_sync is not None:  # every rank runs rank 0's round
            params, cancelled = self.round_sync(params, cancelled)
        if cancelled:
            return params, None, 0.0, "cancelled"
        if self.kv.length + 1 > self.max_context:
            return params, None, 0.0, "context_full"
        t = time.perf_counter()
        with torch.inference_mode():
            return params, self._launch(params, generator), t, None

    def _room_for_two(self, launched: "_Launched", answer: Answer) -> bool:
        """Whether another round may be launched before `launched` is collected: that round
        cannot end the answer by its length (a round adds at most its tree's node count); the
        context has room for the next round even if `launched` adds its most (the check
        `_next_round` makes with the host's length, which lags by `launched`'s tokens); and the
        next round's tree, as deep as the stale length allows, stays inside the positions."""
        most = self.kv.length + launched.size
        return (len(answer.ids) + launched.size < answer.max_new and most + 1 <= self.max_context
                and most + SCRATCH_ROWS < self.target.cfg.max_position_embeddings)

    def _launch(self, params: GenerationParams, generator: torch.Generator | None) -> "_Launched":
        """A round's work, enqueued (on CUDA nothing waits for it; elsewhere it has run)."""
        spec, sampling = params.spec, params.sampling
        base = self.kv.length
        clock = _PhaseClock(self.torch_device)
        positions_left = self.target.cfg.max_position_embeddings - 1 - base
        drafting = spec.enabled and spec.budget > 1 and self.head is not None and positions_left > 0
        # An AR round on the graph path holds its draft-context row; the held rows are appended
        # before any other round (a draft forward reads the whole context) or when they fill
        # the buffer.
        hold = not drafting and self._holds
        d = self.draft_kv
        appended = 0
        if d is not None and d.held and (not hold or d.held == d.held_rows):
            appended = self._append_held()
        if hold:
            d.held += 1
        if drafting:
            # A tree of `budget` nodes is at most budget - 1 deep: draft no further than that.
            depth = min(spec.depth or self.head.cfg.max_depth, positions_left, max(spec.budget - 1, 1))
            tree, staged = self.drafter.tree(self.anchor, depth, spec.tree_algo, spec.budget, spec.width, clock.mark)
        else:
            tree, staged = self._root, True  # bucket 1 holds the root-only tree; its token is the anchor
        # On CUDA one graph runs the forward, the target's choices (greedy or sampled) and
        # finish_round (accept, KV commit, draft-context append, lengths, packing, next anchor): verify_ms is that graph
        # and accept_ms only the copy of its packed output to the host. Elsewhere verify_ms ends
        # at the target's choices and accept_ms holds finish_round.
        packed = self.verify.round(tree, staged, sampling, generator, clock.mark, hold)
        # The round's one device->host copy, into a buffer of its own (the graph path's output
        # buffer is the next round's too); from pinned memory on CUDA, so it runs in the stream.
        ints = torch.empty(packed.ints.shape, dtype=packed.ints.dtype, pin_memory=packed.ints.is_cuda)
        ints.copy_(packed.ints, non_blocking=True)
        clock.mark("accept_ms")  # after the copy: _collect waits for this event
        return _Launched(ints, packed.path_len, tree.size, clock, hold, appended)

    def _collect(self, launched: "_Launched") -> RoundOutput:
        """Wait for a launched round (its one device->host copy, enqueued at its launch); the
        host's lengths follow the device's."""
        timings = launched.clock.elapsed()  # waits for the round and its one device->host copy
        r = unpack_round(launched.ints, launched.path_len, launched.size)
        # finish_round advanced the device lengths by the count (the draft's, but for a round
        # that held its row), after the append of held rows before it: the host copies follow.
        self.kv.note_advance(r.count)
        if self.draft_kv is not None:
            self.draft_kv.note_advance((0 if launched.held else r.count) + launched.appended)
        return RoundOutput(
            tree_tokens=r.tokens,
            tree_parents=r.parents,
            tree_depths=r.depths,
            tree_scores=r.scores,
            path=r.path,
            new_tokens=[r.tokens[i] for i in r.path[1:]] + [r.bonus],
            timings=timings,
        )

    # -- generation ------------------------------------------------------------------------
    def generate(
        self, prompt_ids: list[int], params: GenerationParams, cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        """Answer after `prompt_ids`, reusing the cached prefix. Yields Prefill, Round..., Finish."""
        params.validate(self.max_depth)
        if not prompt_ids:
            raise ConfigError("the prompt is empty")
        if len(prompt_ids) + 1 > self.max_context:
            raise ContextOverflowError(
                f"the prompt has {len(prompt_ids)} tokens but the context holds {self.max_context}; "
                "shorten it or raise --max-context"
            )
        try:
            yield from self._generate(prompt_ids, params, cancel)
        except torch.OutOfMemoryError:
            self.reset()
            raise DeviceMemoryError(
                "out of device memory during generation; lower --budget or --max-context"
            ) from None

    def _generate(self, prompt_ids, params: GenerationParams, cancel) -> Iterator[Event]:
        self.allocate()
        self._live_spec.clear()  # a change made from now on (even during the prefill) applies from round 0
        generator = None
        if not params.sampling.greedy:
            generator = torch.Generator(device=self.torch_device)
            if params.sampling.seed is not None:
                generator.manual_seed(params.sampling.seed)
            else:
                generator.seed()
        t_start = self._now()
        with torch.inference_mode():
            logits, reused = self._prefill(prompt_ids)
            choice = target_choices(logits, params.sampling, generator)[0]
            self.anchor.copy_(choice)  # round 0 drafts from the device anchor
            first = int(choice)
        answer = Answer(self.tokenizer, self.stop_token_ids, params)
        self.tokens.append(first)
        first_text = answer.add([first][: answer.room_for([first])])
        t_prefill = self._now()
        yield PrefillEvent(
            new_tokens=len(prompt_ids) - reused, reused_tokens=reused, first_token=first, first_text=first_text,
            ms=(t_prefill - t_start) * 1e3,
        )
        accept_lengths: list[int] = []
        # Ahead: the next round is launched as soon as this one's tokens show that the answer goes
        # on (no stop token, room left), so the device runs it while the host detokenizes and
        # yields this one. Not with stop strings (only the text shows whether they end the
        # answer), across ranks (every rank runs rank 0's rounds in step), or through a
        # recurrent cache (it rolls back only inside its last round).
        ahead = not answer.stops and self.round_sync is None and not self.verify.recurrent
        # Queued: on the graph path the round after it is launched too before a round is
        # collected, so the device does not wait for the host's copy, unpacking and launch
        # between rounds. Every input of a graphed round is on the device (the anchor, the
        # lengths, the tree the draft graph stages), so it may be enqueued before the host has
        # seen the round before. Not where that round could end the answer by its length or two
        # rounds might not fit the context (`_room_for_two`); dropped, rolled back, where the
        # answer ends at a stop token.
        queue = ahead and self.verify.use_graphs and self.queue_rounds
        launched: _Launched | None = None
        queued: _Launched | None = None
        t_round = t_next = t_queued = 0.0
        while True:
            if launched is None:
                params, launched, t_round, end = self._next_round(params, generator, cancel)
                if launched is None:
                    answer.finish = end
                    break
            if queue and queued is None and self._room_for_two(launched, answer):
                params, queued, t_queued, _ = self._next_round(params, generator, cancel)
            with torch.inference_mode():
                out = self._collect(launched)
            launched = None
            base = self.kv.length - len(out.new_tokens)  # committed length before this round
            keep = answer.room_for(out.new_tokens)
            if queued is not None and answer.finish is not None:
                with torch.inference_mode():  # the answer ended in this round: drop the queued one
                    self._collect(queued)
                queued = None
                self.rollback(base + keep)
            elif keep < len(out.new_tokens):
                self.rollback(base + keep)  # the answer ended mid-round: drop the surplus rows
            kept = out.new_tokens[:keep]
            self.tokens.extend(kept)
            t_done = time.perf_counter()
            end = None  # why the answer ends before the next round, found ahead
            if queued is not None:  # it becomes the round ahead; its time runs from this one's end
                launched, t_next, queued = queued, max(t_queued, t_done), None
            elif ahead and answer.finish is None:
                params, launched, t_next, end = self._next_round(params, generator, cancel)
            new_text = answer.add(kept)
            accept_lengths.append(keep)
            event = dict(
                index=len(accept_lengths) - 1,
                tree_tokens=tuple(out.tree_tokens),
                tree_texts=tuple(self.token_text(t) for t in out.tree_tokens),
                tree_parents=tuple(out.tree_parents),
                tree_depths=tuple(out.tree_depths),
                tree_scores=tuple(out.tree_scores),
                accepted_nodes=tuple(out.path),
                bonus_token=out.new_tokens[-1],
                new_tokens=tuple(kept),
                new_text=new_text,
                answer_tokens=len(answer.ids),
                context_tokens=len(self.tokens),
            )
            # A round's wall time runs to the next launch: with a round ahead, until this one's
            # copy arrived (its host work overlaps the next round); else until its event.
            total_ms = ((t_done if launched is not None else time.perf_counter()) - t_round) * 1e3
            timings = PhaseTimings(host_ms=max(0.0, total_ms - sum(out.timings.values())), total_ms=total_ms, **out.timings)
            self.round_ahead = launched is not None
            yield RoundEvent(timings=timings, elapsed_s=time.perf_counter() - t_start, **event)
            self.round_ahead = False
            if launched is not None:
                t_round = t_next
                # Cancelled while this round was out, or ended by its text: the round ahead is
                # dropped, as if never launched.
                if answer.finish is not None or answer.cancelled(cancel):
                    with torch.inference_mode():
                        self._collect(launched)
                    self.rollback(base + keep)
                    launched = None
            answer.finish = answer.finish or end
            if answer.finish is not None:
                break
        message = CONTEXT_FULL.format(self.max_context) if answer.finish == "context_full" else ""
        answer.flush()  # after a cancel or a full context, the tail reaches the user via result.text
        t_end = self._now()
        yield FinishEvent(
            GenerationResult(
                text=answer.text,
                token_ids=tuple(answer.ids),
                finish_reason=answer.finish,
                rounds=len(accept_lengths),
                accept_lengths=tuple(accept_lengths),
                prefill_tokens=len(prompt_ids) - reused,
                reused_tokens=reused,
                prefill_seconds=t_prefill - t_start,
                decode_seconds=t_end - t_prefill,
                seconds=t_end - t_start,
                message=message,
                stop_token=answer.stop_token,
            )
        )

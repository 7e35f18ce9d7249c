"""The engine thread: one long-lived thread owns the engine and the chat session.

Commands go in through a queue (`EngineWorker.submit`), everything the engine reports comes
out through another (`EngineWorker.outbox`), which the UI drains on a timer. The thread never
waits on the UI: the outbox is unbounded and `put` never blocks. Cancelling is a
`threading.Event` per job that the engine checks at round boundaries.

Live tree-shape changes (`EngineWorker.update_spec`) go through a one-slot mailbox per chat job
that the engine thread empties between rounds: it calls `engine.update_spec` while the engine's
generator is suspended at a round boundary, so the change applies from the next round.

Nothing here imports Textual: it can be driven and tested on its own.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from jetspec_chat.engine.errors import EngineError, MissingPackageError
from jetspec_chat.engine.events import Event, FinishEvent, GenerationResult, RoundEvent
from jetspec_chat.engine.params import TREE_ALGOS, GenerationParams, SpecParams, auto_budget, auto_compare_budgets


class Backend(Protocol):
    """What the app needs from an engine module: `jetspec_chat.engine` or the fake."""

    def load_engine(self, model, draft_head=None, device="auto", dtype="auto", max_context=None, progress=None): ...

    ChatSession: Any


def real_backend() -> Backend:
    """The real engine module (its engine and session import torch on first use)."""
    import jetspec_chat.engine as engine

    return engine


def tree_algos(backend: Backend | None) -> tuple[str, ...]:
    """The backend's tree algorithms, accum_logp (the default) first."""
    algos = getattr(backend, "TREE_ALGOS", None) or TREE_ALGOS
    return tuple(sorted(algos, key=lambda a: (a != "accum_logp", a)))


# ----------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class EngineSetup:
    """Which engine to load: the target model, its draft head and where it runs."""

    model: str | None = None
    draft_head: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    max_context: int | None = None
    tp: int | None = None  # tensor-parallel ranks: this process is rank 0 and starts the others (None: load_engine's choice)


@dataclass(frozen=True)
class LoadCommand:
    setup: EngineSetup
    system_prompt: str | None = None
    thinking: bool = False
    budget: int | None = None  # the app's budget, warmed during the load; None: auto_budget(device)
    # warmed during the load on a GPU, before their first run otherwise; None: the device's default list
    compare_budgets: tuple[int, ...] | None = ()


@dataclass(frozen=True)
class NewSessionCommand:
    system_prompt: str | None = None
    thinking: bool = False


@dataclass(frozen=True)
class RestoreSessionCommand:
    data: dict
    name: str = ""


@dataclass(frozen=True)
class SendCommand:
    text: str
    params: GenerationParams


@dataclass(frozen=True)
class RerunCommand:
    """Answer the last user message again (replacing the answer); used to measure plain AR."""

    params: GenerationParams
    purpose: str = "ar"


@dataclass(frozen=True)
class CompareEntry:
    label: str  # "AR" or the budget as text
    params: GenerationParams


@dataclass(frozen=True)
class CompareCommand:
    entries: tuple[CompareEntry, ...]


@dataclass(frozen=True)
class ShutdownCommand:
    pass


Command = (
    LoadCommand | NewSessionCommand | RestoreSessionCommand | SendCommand | RerunCommand | CompareCommand | ShutdownCommand
)


# ----------------------------------------------------------------------------- outbox items


@dataclass(frozen=True)
class EngineInfo:
    model_name: str
    head_name: str | None
    device: str
    dtype: str
    max_depth: int | None
    max_context: int
    tree_algos: tuple[str, ...]
    warmed: tuple[int, ...] = ()  # budgets (0 = AR) run once before the first answer
    warm_seconds: float = 0.0


@dataclass(frozen=True)
class LoadProgress:
    message: str
    fraction: float | None


@dataclass(frozen=True)
class EngineReady:
    info: EngineInfo


@dataclass(frozen=True)
class EngineLoadFailed:
    message: str
    details: str = ""  # traceback for unexpected errors
    retryable: bool = True  # False where loading again cannot help (a missing package)


@dataclass(frozen=True)
class JobStarted:
    job_id: int
    kind: str  # "chat" | "rerun" | "compare" | "session"


@dataclass(frozen=True)
class GenerationEvent:
    job_id: int
    kind: str
    event: Event
    run_index: int = 0  # compare: which entry


@dataclass(frozen=True)
class CompareRunStarted:
    job_id: int
    index: int
    label: str


@dataclass(frozen=True)
class CompareRunFinished:
    job_id: int
    index: int
    label: str
    result: GenerationResult | None
    error: str = ""


@dataclass(frozen=True)
class JobFinished:
    job_id: int
    kind: str
    cancelled: bool = False


@dataclass(frozen=True)
class JobFailed:
    job_id: int
    kind: str
    message: str
    unexpected: bool = False
    details: str = ""


@dataclass(frozen=True)
class SpecApplied:
    """A live tree-shape change reached the engine: rounds `from_round` on use `spec`."""

    job_id: int
    spec: SpecParams
    from_round: int


@dataclass(frozen=True)
class SpecRejected:
    job_id: int
    spec: SpecParams
    message: str


@dataclass(frozen=True)
class EngineDied:
    """The engine process ended without being asked to (killed, out of memory, a crash)."""

    message: str


@dataclass(frozen=True)
class SessionSnapshot:
    """The session's state after a job, copied on the engine thread (the UI never touches it)."""

    job_id: int
    messages: tuple[dict, ...]
    context_tokens: int
    data: dict = field(default_factory=dict)  # session.to_dict()


OutboxItem = (
    LoadProgress
    | EngineReady
    | EngineLoadFailed
    | JobStarted
    | GenerationEvent
    | CompareRunStarted
    | CompareRunFinished
    | JobFinished
    | JobFailed
    | SpecApplied
    | SpecRejected
    | SessionSnapshot
    | EngineDied
)


WARM_PROMPT = "Hello"


def describe_error(err: BaseException) -> tuple[str, bool]:
    """(user-facing message, unexpected?)"""
    if isinstance(err, ImportError):
        err = MissingPackageError.from_import_error(err)
    if isinstance(err, EngineError):
        return str(err) or type(err).__name__, False
    text = str(err)
    return f"unexpected engine error ({type(err).__name__}{': ' + text if text else ''})", True


# ----------------------------------------------------------------------------- the worker


class EngineWorker:
    def __init__(self, backend: Backend | None, outbox: "queue.SimpleQueue[OutboxItem] | None" = None) -> None:
        self.backend = backend
        self.outbox: queue.SimpleQueue = outbox if outbox is not None else queue.SimpleQueue()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._ids = itertools.count(1)
        self._cancels: dict[int, threading.Event] = {}
        self._spec_requests: dict[int, SpecParams] = {}  # job id -> the latest live change asked for
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="jetspec-engine", daemon=True)
        self._started = False
        # owned by the engine thread only:
        self._engine: Any = None
        self._session: Any = None
        self._load_error: str | None = None
        self._warmed: set[int] = set()  # budgets (0 = AR) whose kernels and graphs exist

    # -- UI-thread API: none of these block

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def submit(self, command: Command, job_id: int | None = None) -> int:
        """Queue `command`; returns its job id (`job_id` when given: the engine process passes
        the id its parent chose)."""
        if job_id is None:
            job_id = next(self._ids)
        with self._lock:
            self._cancels[job_id] = threading.Event()
        self._commands.put((job_id, command))
        return job_id

    def cancel(self, job_id: int) -> None:
        with self._lock:
            ev = self._cancels.get(job_id)
        if ev is not None:
            ev.set()

    def update_spec(self, job_id: int, spec: SpecParams) -> None:
        """Change the tree shape of chat job `job_id` from its next round (the latest request
        wins). Answered by `SpecApplied` / `SpecRejected` in the outbox; nothing happens when
        the job has already ended (the next answer uses the UI's new settings anyway)."""
        with self._lock:
            if job_id in self._cancels:
                self._spec_requests[job_id] = spec

    def cancel_all(self) -> None:
        with self._lock:
            events = list(self._cancels.values())
        for ev in events:
            ev.set()

    def shutdown(self, timeout: float = 0.5) -> None:
        self.cancel_all()
        self._commands.put((0, ShutdownCommand()))
        if self._started and self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- engine thread

    def _post(self, item: OutboxItem) -> None:
        self.outbox.put(item)

    def _run(self) -> None:
        while True:
            job_id, cmd = self._commands.get()
            if isinstance(cmd, ShutdownCommand):
                return
            with self._lock:
                cancel = self._cancels.get(job_id) or threading.Event()
            try:
                self._dispatch(job_id, cmd, cancel)
            except BaseException as err:  # noqa: BLE001 - the thread must survive anything
                message, unexpected = describe_error(err)
                self._post(JobFailed(job_id, _kind(cmd), message, unexpected, traceback.format_exc()))
                self._snapshot(job_id)
            finally:
                with self._lock:
                    self._cancels.pop(job_id, None)
                    self._spec_requests.pop(job_id, None)

    def _dispatch(self, job_id: int, cmd: Command, cancel: threading.Event) -> None:
        if isinstance(cmd, LoadCommand):
            self._load(cmd)
            return
        if self._session is None:
            why = self._load_error or "the model is not loaded"
            self._post(JobFailed(job_id, _kind(cmd), f"cannot do that: {why}"))
            return
        if isinstance(cmd, NewSessionCommand):
            self._session = self.backend.ChatSession(self._engine, system_prompt=cmd.system_prompt, thinking=cmd.thinking)
            self._post(JobFinished(job_id, "session"))
            self._snapshot(job_id)
        elif isinstance(cmd, RestoreSessionCommand):
            self._session = self.backend.ChatSession.from_dict(self._engine, cmd.data)
            self._post(JobFinished(job_id, "session"))
            self._snapshot(job_id)
        elif isinstance(cmd, SendCommand):
            self._generate(job_id, "chat", lambda: self._session.send(cmd.text, cmd.params, cancel=cancel), cancel)
        elif isinstance(cmd, RerunCommand):
            self._generate(job_id, "rerun", lambda: self._session.rerun_last(cmd.params, cancel=cancel), cancel)
        elif isinstance(cmd, CompareCommand):
            self._compare(job_id, cmd, cancel)

    def _load(self, cmd: LoadCommand) -> None:
        setup = cmd.setup

        def progress(message: str, fraction: float | None = None) -> None:
            self._post(LoadProgress(str(message), fraction))

        try:
            if self.backend is None:
                progress("Importing the engine", None)
                self.backend = real_backend()
            engine = self.backend.load_engine(
                setup.model,
                draft_head=setup.draft_head,
                device=setup.device,
                dtype=setup.dtype,
                max_context=setup.max_context,
                progress=progress,
                **({"tp": setup.tp} if setup.tp is not None else {}),  # the fake backend has no tp
            )
            session = self.backend.ChatSession(engine, system_prompt=cmd.system_prompt, thinking=cmd.thinking)
        except BaseException as err:  # noqa: BLE001
            message, unexpected = describe_error(err)
            self._load_error = message
            self._post(EngineLoadFailed(message, traceback.format_exc() if unexpected else "",
                                        retryable=not isinstance(err, ImportError)))
            return
        self._engine, self._session, self._load_error = engine, session, None
        device = str(getattr(engine, "device", setup.device))
        budgets = [0, cmd.budget or auto_budget(device)]
        if device.startswith("cuda"):  # graphs and kernels per tree size: all of them now
            compare = auto_compare_budgets(device) if cmd.compare_budgets is None else cmd.compare_budgets
            budgets += [b for b in compare if b not in budgets]
        t0 = time.perf_counter()
        try:
            self._warm(budgets, progress)
        except BaseException as err:  # noqa: BLE001 - a failed warm-up leaves a usable engine
            message, _ = describe_error(err)
            progress(f"warming up failed ({message}); the first answers compile as they go", None)
        warm_s = time.perf_counter() - t0
        self._post(
            EngineReady(
                EngineInfo(
                    model_name=str(getattr(engine, "model_name", setup.model or "?")),
                    head_name=getattr(engine, "head_name", None),
                    device=str(getattr(engine, "device", setup.device)),
                    dtype=str(getattr(engine, "dtype", setup.dtype)),
                    max_depth=getattr(engine, "max_depth", None),
                    max_context=int(getattr(engine, "max_context", 0) or 0),
                    tree_algos=tree_algos(self.backend),
                    warmed=tuple(sorted(self._warmed)),
                    warm_seconds=warm_s,
                )
            )
        )
        self._snapshot(0)

    def _warm(self, budgets: list[int], progress: Callable[[str, float | None], None] | None = None,
              prompt_ids: list[int] | None = None) -> None:
        """Run a two-token answer at each budget not warmed yet (0 = AR), untimed: Triton
        compiles its kernels and the engine captures its graphs for that tree size here, not
        inside an answer whose speed is shown. Engines without `generate` (the fake) need none.
        With `prompt_ids` (the prompt a run is about to answer) the warm-up answers that prompt,
        so the KV cache keeps it and the run reuses all of it; otherwise a short prompt is
        answered and the cache emptied."""
        engine = self._engine
        if not hasattr(engine, "generate") or not hasattr(engine, "tokenizer"):
            return
        todo = [b for b in dict.fromkeys(budgets) if b not in self._warmed]
        ids = prompt_ids or list(engine.tokenizer.encode(WARM_PROMPT)) or [0]
        for i, budget in enumerate(todo):
            if budget and getattr(engine, "max_depth", None) is None:
                continue  # no draft head: only AR exists
            if progress is not None:
                progress(f"Warming up: {'AR' if budget == 0 else f'budget {budget}'}", i / max(1, len(todo)))
            spec = SpecParams(budget=budget or 1, enabled=budget > 0)
            for _ in engine.generate(ids, GenerationParams(max_new_tokens=2, spec=spec)):
                pass
            self._warmed.add(budget)
        if todo and prompt_ids is None:
            engine.reset()  # the warm-up prompt is not part of any conversation

    def _generate(self, job_id: int, kind: str, start: Callable[[], Any], cancel: threading.Event) -> None:
        self._post(JobStarted(job_id, kind))
        if cancel.is_set():  # cancelled while still queued
            self._post(JobFinished(job_id, kind, cancelled=True))
            return
        try:
            for event in start():
                self._post(GenerationEvent(job_id, kind, event))
                if kind == "chat" and isinstance(event, RoundEvent):
                    # With the next round already launched, a change takes effect one round later.
                    ahead = bool(getattr(self._engine, "round_ahead", False))
                    self._apply_spec_request(job_id, event.index + 1 + ahead)
        except BaseException as err:  # noqa: BLE001
            message, unexpected = describe_error(err)
            self._post(JobFailed(job_id, kind, message, unexpected, traceback.format_exc() if unexpected else ""))
            self._snapshot(job_id)
            return
        self._post(JobFinished(job_id, kind, cancelled=cancel.is_set()))
        self._snapshot(job_id)

    def _apply_spec_request(self, job_id: int, next_round: int) -> None:
        """At a round boundary (the engine's generator is suspended after yielding a round):
        hand the latest live change to the engine, which takes it at the top of the next round.
        Only after a RoundEvent: the engine clears pending changes once its prefill is done."""
        with self._lock:
            spec = self._spec_requests.pop(job_id, None)
        if spec is None:
            return
        update = getattr(self._engine, "update_spec", None)
        if update is None:
            self._post(SpecRejected(job_id, spec, "this engine cannot change the tree during an answer"))
            return
        try:
            update(spec)
        except BaseException as err:  # noqa: BLE001 - a bad value must not end the answer
            message, _ = describe_error(err)
            self._post(SpecRejected(job_id, spec, message))
            return
        self._post(SpecApplied(job_id, spec, next_round))

    def _compare(self, job_id: int, cmd: CompareCommand, cancel: threading.Event) -> None:
        self._post(JobStarted(job_id, "compare"))
        for index, entry in enumerate(cmd.entries):
            if cancel.is_set():
                break
            spec = entry.params.spec
            budget = spec.budget if spec.enabled else 0
            try:  # compile before the clock runs: the compare screen never times a compilation
                if budget not in self._warmed and hasattr(self._engine, "generate"):
                    self._warm([budget], prompt_ids=self._session.rerun_prompt_ids())
            except BaseException:  # noqa: BLE001 - the timed run reports any real problem
                pass
            self._post(CompareRunStarted(job_id, index, entry.label))
            result: GenerationResult | None = None
            try:
                for event in self._session.rerun_last(entry.params, cancel=cancel):
                    self._post(GenerationEvent(job_id, "compare", event, run_index=index))
                    if isinstance(event, FinishEvent):
                        result = event.result
            except BaseException as err:  # noqa: BLE001
                message, _ = describe_error(err)
                self._post(CompareRunFinished(job_id, index, entry.label, None, message))
                continue
            self._post(CompareRunFinished(job_id, index, entry.label, result))
        self._post(JobFinished(job_id, "compare", cancelled=cancel.is_set()))
        self._snapshot(job_id)

    def _snapshot(self, job_id: int) -> None:
        s = self._session
        if s is None:
            return
        try:
            messages = tuple(dict(m) for m in s.messages)
            context = int(s.context_tokens)
            data = s.to_dict()
        except BaseException:  # noqa: BLE001 - a broken session must not kill the thread
            return
        self._post(SessionSnapshot(job_id, messages, context, data))


def _kind(cmd: Any) -> str:
    return {
        SendCommand: "chat",
        RerunCommand: "rerun",
        CompareCommand: "compare",
        LoadCommand: "load",
    }.get(type(cmd), "session")


def params_with(params: GenerationParams, **spec_changes: Any) -> GenerationParams:
    from dataclasses import replace

    return replace(params, spec=replace(params.spec, **spec_changes))

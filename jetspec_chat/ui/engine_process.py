"""The engine in its own process, behind `EngineWorker`'s interface.

The UI process never runs engine Python: `EngineProcess` starts a child with multiprocessing's
`spawn` (so CUDA is initialised only there), and the child runs an ordinary `EngineWorker`.
Two pipes connect them:

- parent -> child: ("submit", job_id, command), ("cancel", job_id), ("spec", job_id, spec),
  ("shutdown",). A thread in the child hands each to the worker at once, so cancel and live
  tree changes still reach the engine at its next round boundary.
- child -> parent: lists of outbox items (the worker's dataclasses, pickled), one list per
  wake-up of the child's forwarding thread: a busy engine sends many rounds in one message.
  A reader thread in the parent puts them in the app's outbox, which the UI drains on a timer.

When the child dies (killed, out of memory, a crash in native code), the reader sees the pipe
close and posts `EngineDied`; the app keeps the conversation and can start a new process.
"""
from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import queue
import sys
import threading
import traceback
from typing import Any

from jetspec_chat.engine.errors import WORKER_DIED_EXIT_CODE
from jetspec_chat.engine.params import SpecParams

from . import engine_worker as ew

MAX_ITEMS_PER_MESSAGE = 256  # outbox items pickled together into one pipe message


def describe_exit(exitcode: int | None) -> str:
    """One sentence on how the engine process ended."""
    import signal

    if exitcode is None:
        return "The engine process stopped answering."
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        why = " (out of memory, or killed)" if name == "SIGKILL" else ""
        return f"The engine process was killed by {name}{why}."
    if exitcode == WORKER_DIED_EXIT_CODE:
        return "A tensor-parallel worker of the engine died, and the engine stopped with it."
    return f"The engine process exited unexpectedly (exit code {exitcode})."


class EngineProcess:
    """`EngineWorker`'s UI-side API (start, submit, cancel, update_spec, shutdown, alive,
    outbox, backend) with the worker in a spawned child process."""

    def __init__(self, backend: ew.Backend | None = None, outbox: "queue.SimpleQueue | None" = None) -> None:
        self.backend = backend  # None: the real engine, imported in the child
        self.outbox: queue.SimpleQueue = outbox if outbox is not None else queue.SimpleQueue()
        self._ids = itertools.count(1)
        self._ctx = multiprocessing.get_context("spawn")
        self._process: Any = None
        self._commands: Any = None  # parent end of the command pipe
        self._events: Any = None  # parent end of the event pipe
        self._reader: threading.Thread | None = None
        self._send_lock = threading.Lock()
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        if self._process is not None:
            return
        cmd_child, cmd_parent = self._ctx.Pipe(duplex=False)  # (receiving end, sending end)
        ev_parent, ev_child = self._ctx.Pipe(duplex=False)
        self._process = self._ctx.Process(
            target=child_main, args=(cmd_child, ev_child, self.backend), name="jetspec-engine", daemon=True
        )
        # Textual swaps sys.stdout/stderr for objects without a real file descriptor, and
        # spawn hands stderr's descriptor to its resource tracker: start with the real ones.
        try:
            with contextlib.redirect_stdout(sys.__stdout__), contextlib.redirect_stderr(sys.__stderr__):
                self._process.start()
        except Exception as err:  # noqa: BLE001 - said in the app, which stays up
            self._stopping = True
            self.outbox.put(ew.EngineLoadFailed(f"could not start the engine process ({err})", traceback.format_exc()))
            return
        cmd_child.close()  # the child holds its own copies; ours would keep the pipes open
        ev_child.close()
        self._commands, self._events = cmd_parent, ev_parent
        self._reader = threading.Thread(target=self._read, name="jetspec-engine-reader", daemon=True)
        self._reader.start()

    def _send(self, message: tuple) -> bool:
        with self._send_lock:
            if self._commands is None:
                return False
            try:
                self._commands.send(message)
                return True
            except (OSError, EOFError, BrokenPipeError):
                return False  # the child is gone: the reader reports it

    def submit(self, command: ew.Command) -> int:
        job_id = next(self._ids)
        self._send(("submit", job_id, command))
        return job_id

    def cancel(self, job_id: int) -> None:
        self._send(("cancel", job_id))

    def update_spec(self, job_id: int, spec: SpecParams) -> None:
        self._send(("spec", job_id, spec))

    def cancel_all(self) -> None:
        self._send(("cancel_all",))

    def shutdown(self, timeout: float = 0.5) -> None:
        self._stopping = True
        self._send(("shutdown",))
        if self._process is not None and self._process.pid is not None:
            self._process.join(timeout)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(1.0)
        with self._send_lock:
            if self._commands is not None:
                self._commands.close()
                self._commands = None

    def kill(self) -> None:
        """Kill the child (tests: what an OOM kill looks like to the app)."""
        if self._process is not None and self._process.pid is not None:
            self._process.kill()

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.pid is not None and self._process.is_alive()

    def _read(self) -> None:
        while True:
            try:
                items = self._events.recv()
            except (EOFError, OSError):
                break
            except Exception as err:  # noqa: BLE001 - an item that does not unpickle
                self.outbox.put(ew.JobFailed(0, "session", f"could not read the engine's report ({err})"))
                continue
            for item in items:
                self.outbox.put(item)
        if self._stopping:
            return
        process = self._process
        if process is not None:
            process.join(2.0)
        self.outbox.put(ew.EngineDied(describe_exit(process.exitcode if process is not None else None)))


# ----------------------------------------------------------------------------- the child


def child_main(commands: Any, events: Any, backend: ew.Backend | None) -> None:
    """The engine process: an EngineWorker fed from the command pipe, its outbox forwarded
    over the event pipe in batches."""
    _quiet_output()
    worker = ew.EngineWorker(backend)
    worker.start()
    forward = threading.Thread(target=_forward, args=(worker.outbox, events), name="jetspec-forward", daemon=True)
    forward.start()
    while True:
        try:
            message = commands.recv()
        except (EOFError, OSError):  # the parent is gone
            break
        kind = message[0]
        if kind == "submit":
            worker.submit(message[2], job_id=message[1])
        elif kind == "cancel":
            worker.cancel(message[1])
        elif kind == "spec":
            worker.update_spec(message[1], message[2])
        elif kind == "cancel_all":
            worker.cancel_all()
        elif kind == "shutdown":
            break
    worker.shutdown(timeout=2.0)
    worker.outbox.put(None)  # ends the forwarding thread once it has sent what is left
    forward.join(2.0)


def _quiet_output() -> None:
    """The child inherits the terminal the app draws on: send its own prints and library
    warnings (descriptors 1 and 2) to a log file in the data directory instead."""
    try:
        from jetspec_chat.settings import data_dir

        path = data_dir() / "engine-process.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        log = open(path, "a", encoding="utf-8")
    except OSError:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)


def _forward(outbox: queue.SimpleQueue, events: Any) -> None:
    while True:
        item = outbox.get()
        batch = [item]
        while len(batch) < MAX_ITEMS_PER_MESSAGE:
            try:
                batch.append(outbox.get_nowait())
            except queue.Empty:
                break
        done = any(i is None for i in batch)
        batch = [i for i in batch if i is not None]
        try:
            if batch:
                events.send(batch)
        except (OSError, BrokenPipeError):
            return
        if done:
            return

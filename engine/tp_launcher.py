"""Tensor-parallel launch: rank 0 is the caller's process, ranks 1..N-1 are worker processes.

Every rank loads only its share of the same model and draft head (`load_engine(...,
shard=Shard(rank, N))`: shard-on-load; random weights draw the same numbers) and holds a full SpecEngine. Rank 0 drives:
`TPEngine` stands in for its SpecEngine and sends each call that runs the model (generate,
reset, set_max_context, allocate) to the workers before running it itself; a worker runs the
same call on its own engine (`_follow`). Inside an answer the ranks meet at every row-parallel
product (the exchange of partial sums), at every gather of logits (the lm_head is split by
vocabulary) and once per round boundary, where rank 0 hands over the round's
generation parameters (a live spec change) and whether the answer was cancelled
(`SpecEngine.round_sync`). Everything else (tree, acceptance, stops) is computed identically on
every rank from identical hidden states.

A worker that dies is reported in one sentence and ends rank 0's process (exit code
WORKER_DIED_EXIT_CODE): the collectives of the others could wait for it forever. A worker whose
rank 0 is gone ends itself. `close()` ends them all in order (docs/DESIGN.md §3b, "Closing").
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

import torch
import torch.distributed as dist

from .errors import WORKER_DIED_EXIT_CODE, ConfigError, EngineError
from .events import FinishEvent
from .parallel import RANK_ENV, Ranks, Shard, check_splits, init_ranks, open_exchange, rank_device

if TYPE_CHECKING:
    from .models.model_sources import ModelSource

LOAD_FAILED_EXIT_CODE = 4  # a worker whose load raised an EngineError (rank 0 reports its own)
CLOSE_WAIT_S = 30.0  # how long close() waits for the workers to exit before it stops them
STACKS_ENV = "JETSPEC_TP_STACKS"  # set: every rank prints its stacks on SIGUSR1 (hang diagnosis)


@dataclass(frozen=True)
class LoadArgs:
    """load_engine's arguments, the same on every rank."""

    source: dict  # the target as the launcher resolved it (ModelSource.to_dict): no rank resolves it again
    draft_head: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    max_context: int | None = None
    depth: int | None = None  # checked against the draft head before the target loads


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load_rank(load: LoadArgs, ranks: Ranks, progress=None):
    from .models.loader import load_engine, resolve_device
    from .models.model_sources import ModelSource

    device = rank_device(resolve_device(load.device), ranks.rank)
    engine = load_engine(ModelSource.from_dict(load.source), load.draft_head, device=str(device), dtype=load.dtype,
                         max_context=load.max_context, progress=progress, depth=load.depth,
                         shard=Shard(ranks.rank, ranks.world))
    from .engine import PREFILL_CHUNK

    # Up to a prefill chunk's rows (every verify tree and AR step): larger batches use NCCL.
    open_exchange(engine.target, ranks, PREFILL_CHUNK, engine.torch_dtype, engine.head)
    engine.round_sync = RoundSync(ranks)
    return engine


def _broadcast(ranks: Ranks, obj=None):
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=ranks.control)
    return box[0]


class RoundSync:
    """Rank 0's (params, cancelled) on every rank, at a round boundary: one 8-byte broadcast
    (continue / cancelled / new parameters follow), the pickled parameters only when they
    changed (a live spec change, a new answer)."""

    CONTINUE, CANCELLED, NEW_PARAMS = 0, 1, 2

    def __init__(self, ranks: Ranks):
        self.ranks = ranks
        self.flag = torch.zeros(1, dtype=torch.long)  # gloo: a CPU tensor
        self.params = None

    def __call__(self, params, cancelled: bool):
        if self.ranks.rank == 0:
            code = self.CANCELLED if cancelled else self.NEW_PARAMS if params != self.params else self.CONTINUE
            self.flag.fill_(code)
        dist.broadcast(self.flag, src=0, group=self.ranks.control)
        code = int(self.flag)
        if code == self.NEW_PARAMS:
            params = _broadcast(self.ranks, params if self.ranks.rank == 0 else None)
        elif self.ranks.rank != 0:
            params = self.params if self.params is not None else params
        self.params = params
        return params, code == self.CANCELLED


def _worker_main(rank: int, world: int, port: int, load: LoadArgs, threads: int, parent: int) -> None:
    os.environ.update(RANK_ENV)
    torch.set_num_threads(threads)
    dump_stacks_when_stuck(rank)
    from .models.loader import resolve_device

    # Rank 0 gone (killed, crashed): end too, even from inside a collective that would wait forever.
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="tp-parent-watch").start()
    ranks = init_ranks(rank, world, port, rank_device(resolve_device(load.device), rank))
    try:
        engine = _load_rank(load, ranks)
    except EngineError:  # rank 0 loads the same model the same way and reports the same error
        os._exit(LOAD_FAILED_EXIT_CODE)
    _follow(engine, ranks)
    device = engine.torch_device
    engine.release()
    del engine
    leave_group(device)
    # No interpreter teardown: CUDA and NCCL destructors at exit have hung a finished worker.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def dump_stacks_when_stuck(rank: int) -> None:
    """With JETSPEC_TP_STACKS set (any value), SIGUSR1 makes this rank print every thread's Python
    stack to stderr (faulthandler: works while the process waits inside a collective). Every rank
    does it, so `timeout -s USR1` on a tensor-parallel run (it signals the whole process group)
    shows where each rank was waiting."""
    if not os.environ.get(STACKS_ENV):
        return
    import faulthandler
    import signal

    print(f"[tensor-parallel rank {rank}: pid {os.getpid()}; SIGUSR1 prints its stacks]", file=sys.stderr, flush=True)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


def leave_group(device: torch.device) -> None:
    """Leave the process group, once the engine's CUDA graphs are gone (`SpecEngine.release`:
    NCCL's destroy waits for every graph that captured its collectives) and the GPU work has
    finished. Every rank calls it at the same time (after "close")."""
    gc.collect()  # the graphs of released runners still in a reference cycle
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.destroy_process_group()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _follow(engine, ranks: Ranks) -> None:
    """A worker's loop: run each of rank 0's calls on this rank's engine until "close"."""
    while True:
        name, args = _broadcast(ranks)
        if name == "close":
            return
        try:
            if name == "run_on_ranks":
                fn, args = args[0], args[1:]
                fn(engine, *args)
            else:
                result = getattr(engine, name)(*args)
                if name == "generate":
                    for _ in result:
                        pass
        except EngineError:
            pass  # rank 0 meets the same error (the same call on the same state) and reports it


class TPEngine:
    """Rank 0's SpecEngine, driving the workers (module docstring). Reads of its attributes go
    to the local engine (its `target` is rank 0's shard)."""

    def __init__(self, engine, ranks: Ranks, workers: list, on_dead: Callable[[str], None], watch: Watch):
        self.engine, self.ranks, self.workers, self.on_dead, self.watch = engine, ranks, workers, on_dead, watch
        self.tp = ranks.world
        self._closing = False

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def _command(self, name: str, *args) -> None:
        with self._worker_check():
            _broadcast(self.ranks, (name, args))

    @contextlib.contextmanager
    def _worker_check(self):
        """A collective that fails because a worker died reports the worker (not gloo's error)."""
        try:
            yield
        except RuntimeError:
            for p in self.workers:
                try:
                    p.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
            message = dead_worker_message(self.workers)
            if message is not None:
                self.on_dead(message)
            raise

    def generate(self, prompt_ids: list[int], params, cancel: threading.Event | None = None) -> Iterator:
        if not params.sampling.greedy and params.sampling.seed is None:
            # Every rank draws the same samples: rank 0 picks the seed.
            params = dataclasses.replace(params, sampling=dataclasses.replace(params.sampling, seed=random.getrandbits(62)))
        params.validate(self.engine.max_depth)  # a bad request fails here, before any rank starts
        self._command("generate", prompt_ids, params)
        finished = False
        with self._worker_check():
            try:
                for event in self.engine.generate(prompt_ids, params, cancel):
                    finished = finished or isinstance(event, FinishEvent)
                    yield event
            finally:
                if not finished:  # abandoned between rounds: the workers wait at the next round boundary
                    self.engine.round_sync(params, True)

    def reset(self) -> None:
        self._command("reset")
        self.engine.reset()

    def set_max_context(self, tokens: int) -> None:
        self._command("set_max_context", tokens)
        self.engine.set_max_context(tokens)

    def allocate(self) -> None:
        self._command("allocate")
        self.engine.allocate()

    def run_on_ranks(self, fn: Callable, *args, **local_kwargs):
        """fn(engine, *args) on every rank's engine (a module-level function: it travels by
        name); returns rank 0's result. `local_kwargs` go to rank 0's call only (a progress
        callback). For measurements that drive the engine's internals (the engine-only bench)."""
        self._command("run_on_ranks", fn, *args)
        with self._worker_check():
            return fn(self.engine, *args, **local_kwargs)

    def full_target(self):
        """The unsharded target (for the transformers oracle): loaded again on rank 0's device."""
        from .models.loader import load_target

        return load_target(self.engine.source, self.engine.torch_device, self.engine.torch_dtype)

    def close(self) -> None:
        """Tell the workers to stop, leave the group with them, wait for them to exit (up to
        CLOSE_WAIT_S) and end any that did not (one sentence on stderr, no traceback)."""
        if self._closing:
            return
        self._closing = True
        self.watch.stopped.set()  # the workers now exit on purpose
        try:
            self._command("close")
        except RuntimeError:
            pass  # a worker already gone: _worker_check has reported it
        self.engine.release()
        # Leaving may wait for a stuck rank: give it the same deadline, from a daemon thread.
        leaving = threading.Thread(target=leave_group, args=(self.engine.torch_device,), daemon=True, name="tp-leave")
        leaving.start()
        deadline = time.monotonic() + CLOSE_WAIT_S
        leaving.join(CLOSE_WAIT_S)
        for rank, p in enumerate(self.workers, start=1):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                print(f"note: the tensor-parallel worker of rank {rank} (pid {p.pid}) did not exit within "
                      f"{CLOSE_WAIT_S:g} s of closing and was stopped.", file=sys.stderr, flush=True)
        if leaving.is_alive():  # this process cannot finish normally with a thread stuck in NCCL
            print(f"error: this process could not leave the tensor-parallel group within {CLOSE_WAIT_S:g} s; "
                  f"it exits now.", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(WORKER_DIED_EXIT_CODE)


def dead_worker_message(workers: list, ignore: tuple[int, ...] = ()) -> str | None:
    """One sentence for the first worker (a Popen) that has exited with a code not in `ignore`, or None."""
    for rank, p in enumerate(workers, start=1):
        if p.poll() is not None and p.returncode not in ignore:
            return (f"the tensor-parallel worker of rank {rank} (pid {p.pid}) died with exit code {p.returncode}; "
                    f"the engine stopped")
    return None


@dataclass
class Watch:
    """The watchdog's state: `loaded` once rank 0 holds its engine (until then a worker that
    failed its load is left to rank 0's own error), `stopped` once the workers are ended on purpose."""

    loaded: threading.Event = dataclasses.field(default_factory=threading.Event)
    stopped: threading.Event = dataclasses.field(default_factory=threading.Event)


def _watch(workers: list, watch: Watch, on_dead: Callable[[str], None]) -> None:
    """Rank 0's watchdog: a worker that exits while the engine is open is reported (NCCL's
    collectives would wait for it forever)."""
    while not watch.stopped.wait(0.2):
        ignore = () if watch.loaded.is_set() else (LOAD_FAILED_EXIT_CODE,)
        message = dead_worker_message(workers, ignore)
        if message is not None and not watch.stopped.is_set():
            on_dead(message)
            return


def _report_and_exit(message: str) -> None:
    print(f"error: {message}.", file=sys.stderr, flush=True)
    os._exit(WORKER_DIED_EXIT_CODE)


def launch(tp: int, model: str | ModelSource | None, draft_head: str | None = None, device: str = "auto", dtype: str = "auto",
           max_context: int | None = None, progress=None, depth: int | None = None, on_dead: Callable[[str], None] = _report_and_exit) -> TPEngine:
    """load_engine's arguments (`model` a MODEL argument or a resolved `ModelSource`), split over
    `tp` ranks: start ranks 1..tp-1 as worker processes, join them as rank 0 and load this rank's
    share. The model is resolved here once and handed to every rank as it is."""
    from .model_config import ModelConfig
    from .models.loader import resolve_device
    from .models.model_sources import as_model_source

    load_device, device = device, resolve_device(device)
    if tp < 1:
        raise ConfigError(f"--tp must be at least 1, not {tp}")
    if device.type == "cuda" and tp > torch.cuda.device_count():
        raise ConfigError(f"--tp {tp} needs {tp} GPUs but torch sees {torch.cuda.device_count()}")
    source = as_model_source(model, progress)
    load = LoadArgs(source.to_dict(), draft_head, load_device, dtype, max_context, depth)
    try:
        check_splits(ModelConfig.from_hf(source.hf_config), tp)
    except ValueError as err:
        raise ConfigError(f"--tp {tp} does not fit this model: {err}") from None
    os.environ.update(RANK_ENV)
    dump_stacks_when_stuck(0)
    threads = max(1, torch.get_num_threads() // tp) if device.type == "cpu" else 1
    port = _free_port()
    # Plain child processes (not multiprocessing's): the app's engine process is itself a
    # daemonic multiprocessing child, which may not start multiprocessing children.
    workers = [
        subprocess.Popen([sys.executable, "-m", __name__, str(r), str(tp), str(port), str(threads), str(os.getpid()),
                          json.dumps(dataclasses.asdict(load))])
        for r in range(1, tp)
    ]
    watch = Watch()
    threading.Thread(target=_watch, args=(workers, watch, on_dead), daemon=True, name="tp-watchdog").start()
    if device.type == "cpu":
        torch.set_num_threads(threads)
    try:
        ranks = init_ranks(0, tp, port, rank_device(device, 0))
        engine = TPEngine(_load_rank(load, ranks, progress), ranks, workers, on_dead, watch)
    except BaseException:  # a load error (rank 0 reports it): end the workers and the group, so a retry can start
        watch.stopped.set()
        for p in workers:
            p.kill()
            p.wait()
        if dist.is_initialized():
            leaving = threading.Thread(target=dist.destroy_process_group, daemon=True, name="tp-leave")
            leaving.start()
            leaving.join(CLOSE_WAIT_S)
        raise
    watch.loaded.set()
    return engine


if __name__ == "__main__":  # a worker rank: RANK WORLD PORT THREADS PARENT_PID LOAD_JSON
    _rank, _world, _port, _threads, _parent = (int(a) for a in sys.argv[1:6])
    _worker_main(_rank, _world, _port, LoadArgs(**json.loads(sys.argv[6])), _threads, _parent)

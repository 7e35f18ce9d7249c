"""Check the race against the clock: run a comparison headless (AR, then each budget, one after
another, through the app's own engine worker), replay it on the wall clock as the race screen
does, and print each lane's recorded and replayed finish time and tokens/s.

    python tools/race_check.py                                  # the embedded 1.5B, AR vs 64
    python tools/race_check.py random:Qwen/Qwen2.5-Coder-1.5B-Instruct --budgets AR,64
    python tools/race_check.py --demo                           # the scripted fake engine

A lane's replayed finish is the wall time from the replay's start to the first frame that shows
it finished, so it may trail the recorded time by up to one frame (1/30 s); its replayed tokens/s
is the run's decode tokens over the replayed time from its first token to its finish.
"""
from __future__ import annotations

import argparse
import queue
import sys
import time

from jetspec_chat.engine.params import GenerationParams, SpecParams
from jetspec_chat.ui import engine_worker as ew
from jetspec_chat.ui.compare import AR_LABEL, parse_budget_list
from jetspec_chat.ui.race import LaneView, RaceRecording, ReplayClock
from jetspec_chat.ui.race_screen import FRAME_S
from jetspec_chat.ui.trace import AnswerTrace

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a short docstring."


def wait_for(outbox: queue.SimpleQueue, kinds: tuple[type, ...], timeout_s: float = 1800.0, on_item=None):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            item = outbox.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            sys.exit("race_check: timed out waiting for the engine")
        if isinstance(item, (ew.EngineLoadFailed, ew.JobFailed)):
            sys.exit(f"race_check: {item.message}")
        if on_item is not None:
            on_item(item)
        if isinstance(item, kinds):
            return item


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=None, help="model spec (default: the embedded qwen2.5-coder-1.5b)")
    p.add_argument("--draft-head", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--budgets", default="AR, 64", help="the runs, as on the compare screen (default: AR, 64)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--demo", action="store_true", help="the scripted fake engine (no model)")
    args = p.parse_args()
    labels = parse_budget_list(args.budgets)

    backend = None
    if args.demo:
        from jetspec_chat.ui.fake_engine import FakeBackend

        backend = FakeBackend()
    worker = ew.EngineWorker(backend)
    worker.start()
    setup = ew.EngineSetup(args.model, args.draft_head, args.device, args.dtype)
    budgets = tuple(int(b) for b in labels if b != AR_LABEL)
    worker.submit(ew.LoadCommand(setup, budget=budgets[0] if budgets else None, compare_budgets=budgets))
    ready = wait_for(worker.outbox, (ew.EngineReady,))
    print(f"engine: {ready.info}", flush=True)

    base = GenerationParams(max_new_tokens=args.max_new_tokens, spec=SpecParams(budget=budgets[0] if budgets else 64))
    worker.submit(ew.SendCommand(args.prompt, base))  # the answer the comparison reruns
    wait_for(worker.outbox, (ew.JobFinished,))

    entries = []
    for label in labels:
        enabled = label != AR_LABEL
        params = GenerationParams(max_new_tokens=args.max_new_tokens,
                                  spec=SpecParams(budget=int(label) if enabled else base.spec.budget, enabled=enabled))
        entries.append(ew.CompareEntry(label, params))
    traces: dict[int, AnswerTrace] = {}

    def record(item) -> None:
        if isinstance(item, ew.CompareRunStarted):
            traces[item.index] = AnswerTrace(job_id=item.job_id, kind="compare", params=entries[item.index].params,
                                             user_text=args.prompt)
        elif isinstance(item, ew.GenerationEvent) and item.kind == "compare":
            traces[item.run_index].add(item.event)
        elif isinstance(item, ew.CompareRunFinished) and item.error:
            sys.exit(f"race_check: run {item.label} failed: {item.error}")

    worker.submit(ew.CompareCommand(tuple(entries)))
    wait_for(worker.outbox, (ew.JobFinished,), on_item=record)
    worker.submit(ew.ShutdownCommand())
    recording = RaceRecording.from_runs(((e.label, traces.get(i)) for i, e in enumerate(entries)), args.prompt)

    # the replay, on the wall clock, one frame at a time as the race screen draws it
    clock = ReplayClock(now=time.monotonic)
    finished: dict[int, float] = {}
    start = time.monotonic()
    while len(finished) < len(recording.runs):
        t = clock.position()
        for i, run in enumerate(recording.runs):
            if i not in finished and LaneView(run, t).finished:
                finished[i] = time.monotonic() - start
        time.sleep(FRAME_S)

    print(f"{'lane':<10} {'tokens':>6} {'τ':>5} {'recorded s':>10} {'replayed s':>10} "
          f"{'recorded tok/s':>14} {'replayed tok/s':>14}")
    for i, run in enumerate(recording.runs):
        produced = sum(r.tokens for r in run.rounds)
        replayed_tps = produced / (finished[i] - run.prefill_s) if finished[i] > run.prefill_s else float("nan")
        print(f"{run.label:<10} {run.new_tokens:>6} {run.tau:>5.2f} {run.total_s:>10.3f} {finished[i]:>10.3f} "
              f"{run.tokens_per_second:>14.1f} {replayed_tps:>14.1f}")


if __name__ == "__main__":
    main()

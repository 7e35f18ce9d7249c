"""Where an AR step's time goes: the kernels of one AR step,
and of one verify(N), under the torch profiler, grouped by kernel name, with the per-step
launch count, the union of kernel time (busy) and the unprofiled step time (CUDA events). The
`critical` column is the time each kernel moved the step's device timeline forward (launches
under programmatic dependent launch overlap the previous grid, so their own durations overstate
them); torch's own small kernels are totalled apart.
With --draft, also one draft forward over the head's block (head + lm_head + log-softmax, the
engine's draft graph) and one whole round at budget N (draft, tree, verify, acceptance, copy).

    python3 benchmarks/step_profile.py MODEL [MODEL ...] [--context 512] [--nodes 64] [--draft N] [--json OUT]

MODEL is anything `jetspec-chat` loads (`random:Qwen/Qwen3-8B`, a GGUF path, ...); bf16 on CUDA.
The steps run the way the engine runs them (the verify runner's CUDA graphs), from a state with
`context` committed tokens of random KV, as `bench --engine-only` measures them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from jetspec_chat.bench.engine_only import _prepare_engine, _random_tree, _State, _verify_forward
from jetspec_chat.bench.gpu_idle import GPU_TRACE_CATS, idle_from_trace, kernel_table
from jetspec_chat.bench.timing import time_fn
from jetspec_chat.engine.models.loader import load_engine
from jetspec_chat.engine.params import GenerationParams, SpecParams
from jetspec_chat.engine.tree import root_only

LABEL = "jetspec_ar_profile_step"


def profile_steps(fn, steps: int) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile, record_function

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                torch.cuda.synchronize()
                with record_function(LABEL):
                    fn()
                    torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        return json.loads(Path(path).read_text()).get("traceEvents", [])
    finally:
        os.unlink(path)


def busy_us(events: list[dict]) -> tuple[float, float]:
    """Median per step: (union of device activity, gpu_idle's busy time; sum of their durations)."""
    busy = statistics.median(s["busy_us"] for s in idle_from_trace(events, label=LABEL))
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("ph") == "X" and e.get("name") == LABEL and e.get("cat") == "user_annotation"]
    sums = [sum(e["dur"] for e in events if e.get("ph") == "X" and e.get("cat") in GPU_TRACE_CATS and w0 <= e["ts"] < w1)
            for w0, w1 in steps]
    return busy, statistics.median(sums)


def report(name: str, fn, steps: int, device) -> dict:
    ms = statistics.median(time_fn(fn, 5, 30, device))
    events = profile_steps(fn, steps)
    table = kernel_table(events, label=LABEL, top=60)
    union, total = busy_us(events)
    launches = sum(r["count_per_round"] for r in table)
    print(f"\n== {name}: {ms:.3f} ms a step (CUDA events), device busy {union / 1e3:.3f} ms, "
          f"kernel sum {total / 1e3:.3f} ms, {launches:.0f} launches in the top {len(table)} names")
    # torch's own kernels (index math, casts, masks, copies) beside ours: what they cost the step.
    torch_rows = [r for r in table if not r["name"].startswith("_")]
    print(f"   torch's kernels, copies and sets: {sum(r['count_per_round'] for r in torch_rows):.0f} launches, "
          f"{sum(r['critical_us_per_round'] for r in torch_rows):.1f} us on the critical path")
    print(f"{'us/step':>9} {'critical':>9} {'count':>6} {'us/launch':>9}  kernel")
    for r in sorted(table, key=lambda r: -r["critical_us_per_round"]):
        per = r["us_per_round"] / max(r["count_per_round"], 1e-9)
        print(f"{r['us_per_round']:9.1f} {r['critical_us_per_round']:9.1f} {r['count_per_round']:6.1f} {per:9.2f}"
              f"  {r['name'][:100]}")
    return {"name": name, "step_ms": ms, "busy_ms": union / 1e3, "kernel_sum_ms": total / 1e3, "kernels": table}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--nodes", type=int, default=64, help="verify(N) profiled beside the AR step (0: none)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--draft", type=int, default=0,
                    help="also a draft forward and a whole round at this budget (0: neither)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out = []
    for spec in args.models:
        engine = load_engine(spec, None, device="cuda", dtype="bfloat16")
        device = engine.torch_device
        # Rounds commit what they accept: room for ~50 profiled and timed rounds of a whole tree.
        _prepare_engine(engine, args.context + max(args.nodes, args.draft, 1) + 16 + 64 * args.draft, 0)
        gen = torch.Generator().manual_seed(0)
        state = _State(engine, args.context, gen)
        state.restore()
        one = root_only(torch.tensor(state.tokens[-1], device=device))
        with torch.inference_mode():
            def ar_step():
                hidden, _ = _verify_forward(engine, one, args.context)
                return engine.target.greedy(hidden)

            out.append(report(f"{spec} AR step (context {args.context})", ar_step, args.steps, device))
            if args.nodes:
                tree = _random_tree(engine, args.nodes, 8, gen)

                def verify():
                    hidden, _ = _verify_forward(engine, tree, args.context)
                    return engine.target.greedy(hidden)

                out.append(report(f"{spec} verify({args.nodes})", verify, args.steps, device))
            if args.draft and engine.head is not None:
                anchor = torch.tensor(state.tokens[-1], device=device)
                depth = engine.head.cfg.max_depth
                out.append(report(f"{spec} draft forward (depth {depth})",
                                  lambda: engine.drafter.logp(anchor, depth), args.steps, device))
                params = GenerationParams(spec=SpecParams(budget=args.draft))
                # Each round commits its accepted tokens: the context grows by a few tokens a round.
                out.append(report(f"{spec} round at budget {args.draft}", lambda: engine.round(params, None),
                                  args.steps, device))
                state.restore()
        del engine
        torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a round leaves the GPU idle: a few rounds under the torch profiler, the kernel timeline
split into busy time and gaps, and the per-kernel device time of a round (jetspec_chat/bench/BENCH.md)."""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.params import GenerationParams
from .timing import Stat, sync

ROUND_LABEL = "jetspec_bench_round"  # profiler range around one round (GPU idle analysis)


GPU_TRACE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")  # device activity in kineto chrome traces


GAP_US = 5.0  # kernel gaps shorter than this are launch jitter, not listed individually


@dataclass
class GpuIdle:
    """Where a round leaves the GPU idle (torch profiler kernel timeline; see BENCH.md)."""

    method: str
    rounds: int
    round_ms: float  # median unprofiled round (CUDA events)
    busy_ms: float  # median union of kernel/memcpy/memset intervals inside one profiled round
    idle_ms: float  # round_ms - busy_ms: the headline (profiler overhead excluded)
    idle_fraction: float
    profiled_round_ms: float  # median round under the profiler (its host overhead inflates gaps)
    profiled_idle_ms: float
    leading_ms: float  # profiled: round start -> first kernel (host work before the draft)
    between_ms: float  # profiled: gaps between kernels (launch gaps, phase boundaries)
    trailing_ms: float  # profiled: last kernel -> round end (host work after the last copy)
    gaps_over_threshold: int  # profiled gaps >= GAP_US per round (median)
    largest_gaps: list[dict]  # the median round's largest gaps: {"us", "before": the activity after the gap}
    top_kernels: list[dict] = field(default_factory=list)  # where a round's device time goes (kernel_table)


def idle_from_trace(events: list[dict], label: str = ROUND_LABEL, min_gap_us: float = GAP_US) -> list[dict]:
    """Per profiled round (a `label` range in a chrome trace): GPU busy time (union of device
    activity clipped to the range), idle split into leading / between / trailing, and the gaps
    >= min_gap_us, largest first, each with the device activity that ends it (to locate it)."""
    rounds = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                    if e.get("ph") == "X" and e.get("name") == label and e.get("cat") == "user_annotation")
    device = sorted((e["ts"], e["ts"] + e["dur"], str(e.get("name", ""))[:80]) for e in events
                    if e.get("ph") == "X" and e.get("cat") in GPU_TRACE_CATS)
    out = []
    for w0, w1 in rounds:
        merged: list[list] = []  # [start, end, name of the first activity]
        for s, e, name in device:
            s, e = max(s, w0), min(e, w1)
            if e <= s:
                continue
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e, name])
        span = w1 - w0
        if not merged:
            out.append({"span_us": span, "busy_us": 0.0, "leading_us": span, "between_us": 0.0, "trailing_us": 0.0,
                        "gaps": []})
            continue
        gaps = [(b[0] - a[1], b[2]) for a, b in zip(merged, merged[1:])]
        out.append({
            "span_us": span, "busy_us": sum(e - s for s, e, _ in merged), "leading_us": merged[0][0] - w0,
            "between_us": sum(g for g, _ in gaps), "trailing_us": w1 - merged[-1][1],
            "gaps": [{"us": g, "before": name} for g, name in sorted(gaps, key=lambda x: -x[0]) if g >= min_gap_us],
        })
    return out


def kernel_table(events: list[dict], label: str = ROUND_LABEL, top: int = 25) -> list[dict]:
    """Device activity inside the profiled rounds grouped by name, largest total first: per round
    the time (us) and the count of each kernel, so a phase's cost can be traced to its kernels.

    `us_per_round` sums each launch's duration, which overstates a kernel launched early under
    programmatic dependent launch: its programs sit on the SMs waiting for the previous grid.
    `critical_us_per_round` counts only the time a launch moved the round's device timeline
    forward (its end minus the later of its start and every earlier activity's end), so the
    column adds up to the round's busy time and says what removing a kernel could save at most."""
    rounds = [(e["ts"], e["ts"] + e["dur"]) for e in events
              if e.get("ph") == "X" and e.get("name") == label and e.get("cat") == "user_annotation"]
    if not rounds:
        return []
    device = sorted((e["ts"], e["ts"] + e["dur"], str(e.get("name", ""))[:120]) for e in events
                    if e.get("ph") == "X" and e.get("cat") in GPU_TRACE_CATS)
    total: dict[str, list[float]] = {}
    for w0, w1 in rounds:
        frontier = w0
        for s, e, name in device:
            if not w0 <= s < w1:
                continue
            t = total.setdefault(name, [0.0, 0, 0.0])
            t[0] += e - s
            t[1] += 1
            t[2] += max(0.0, e - max(s, frontier))
            frontier = max(frontier, e)
    n = len(rounds)
    rows = sorted(total.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"name": name, "us_per_round": round(us / n, 2), "count_per_round": round(c / n, 2),
             "critical_us_per_round": round(crit / n, 2)}
            for name, (us, c, crit) in rows]


def measure_gpu_idle(engine, restore: Callable[[], None], params: GenerationParams, rounds: int,
                     round_ms: Stat) -> GpuIdle | None:
    """Profile `rounds` rounds (each from the state `restore` puts back) and compare kernel busy
    time with the unprofiled round time. CUDA only (on the CPU there is no separate device to idle)."""
    if engine.torch_device.type != "cuda" or engine.head is None or rounds < 1:
        return None
    from torch.profiler import ProfilerActivity, profile, record_function

    for _ in range(2):  # warm, outside the profiler
        restore()
        engine.round(params, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note about profiler cycles is noise here
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(rounds):
                restore()
                sync(engine.torch_device)
                with record_function(ROUND_LABEL):
                    engine.round(params, None)
                    sync(engine.torch_device)  # the range ends when the round's GPU work has ended
    restore()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        events = json.loads(Path(path).read_text()).get("traceEvents", [])
    finally:
        os.unlink(path)
    samples = [s for s in idle_from_trace(events) if s["busy_us"] > 0]
    if not samples:
        return None  # the profiler saw no device activity (e.g. CUPTI unavailable)
    mid = sorted(samples, key=lambda s: s["span_us"])[len(samples) // 2]
    busy = statistics.median(s["busy_us"] for s in samples) / 1e3
    profiled = statistics.median(s["span_us"] for s in samples) / 1e3
    idle = max(0.0, round_ms.median - busy)
    return GpuIdle(
        method="torch.profiler CUDA timeline: busy = union of kernel/memcpy/memset intervals in a round; "
               "idle = unprofiled round time (CUDA events) - busy",
        rounds=len(samples), round_ms=round_ms.median, busy_ms=busy, idle_ms=idle,
        idle_fraction=idle / round_ms.median, profiled_round_ms=profiled, profiled_idle_ms=profiled - busy,
        leading_ms=statistics.median(s["leading_us"] for s in samples) / 1e3,
        between_ms=statistics.median(s["between_us"] for s in samples) / 1e3,
        trailing_ms=statistics.median(s["trailing_us"] for s in samples) / 1e3,
        gaps_over_threshold=int(statistics.median(len(s["gaps"]) for s in samples)),
        largest_gaps=[{"us": round(g["us"], 1), "before": g["before"]} for g in mid["gaps"][:8]],
        top_kernels=kernel_table(events),
    )

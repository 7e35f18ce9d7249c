"""Timing and device facts shared by the benchmarks: CUDA-event timing, medians, peak memory,
the environment a run was measured on."""
from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

ProgressFn = Callable[[str], None]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(
    fn: Callable[[], object],
    warmup: int,
    reps: int,
    device: torch.device,
    setup: Callable[[], object] | None = None,
) -> list[float]:
    """Milliseconds of `reps` calls of fn (after `warmup` untimed ones). `setup` runs before each
    call, untimed (e.g. to restore state). On CUDA: a sync, then CUDA events around the call, so a
    sample includes host launch time and any GPU idle inside the call."""
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    sync(device)
    samples: list[float] = []
    for _ in range(reps):
        if setup is not None:
            setup()
        sync(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return samples


@dataclass
class Stat:
    """Summary of repeated measurements (milliseconds unless the field name says otherwise)."""

    median: float
    min: float
    max: float
    raw: list[float]

    @classmethod
    def of(cls, samples: list[float]) -> Stat:
        return cls(statistics.median(samples), min(samples), max(samples), [round(s, 6) for s in samples])


def measure_copy_bandwidth(device: torch.device, nbytes: int, warmup: int, reps: int) -> tuple[Stat, float]:
    """Large device-to-device copy; bandwidth counts bytes read plus bytes written (GB/s)."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    stat = Stat.of(time_fn(lambda: dst.copy_(src), warmup, reps, device))
    return stat, 2 * nbytes / (stat.median * 1e-3) / 1e9


def graphed_ms(fn: Callable[[], object], reps: int, warmup: int = 2) -> list[float]:
    """Milliseconds of `reps` replays of one CUDA graph of fn (kernel benchmarks: no launch
    overhead). fn runs `warmup` times on a side stream first (compiles, allocator pools), then it
    is captured and replayed 3 times untimed; CUDA events time each replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return samples


def graphed_us_per_call(fn: Callable[[], object], reps: int, repeat: int = 20) -> float:
    """µs per call of a µs-scale kernel: one CUDA graph of `repeat` calls back to back (as inside
    the engine's graphs, launch gaps included; a lone call is below the events' noise), the
    median of `reps` replays (graphed_ms) divided by `repeat`."""
    return statistics.median(graphed_ms(lambda: [fn() for _ in range(repeat)], reps)) * 1e3 / repeat


def median_or_none(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def peak_memory_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def environment(device: torch.device) -> dict:
    """What the numbers were measured on."""
    import transformers

    env = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return env


def free_device_memory(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def weight_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())

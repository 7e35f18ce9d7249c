"""`jetspec-chat bench --app MODEL ...`: the real app, headless, against the engine.

One run does both: first the end-to-end engine bench (jetspec_chat/bench/end_to_end.py, modes ar and
spec, the same prompts, budgets and generation options; its report goes to `--json-out`), then
the Textual app driven by its pilot (`App.run_test`) through the same prompts and configs, each
answer in a new chat (a fresh prefill, as the bench resets the engine).

The app column is compared with an engine measured *beside it*: the engine that ran the engine
bench (in this process, loaded with the same options) answers each prompt right before or right
after the app does (the order alternates), so a drift of the GPU's clocks or of the machine's load touches both sides of
a pair alike. Both are sized for the same context (the app's default when `--max-context` is not
given), because the attention kernels' grids and split lengths follow the cache's size. Reported:
app tok/s and engine tok/s (medians), their ratio, and the median of the per-pair ratios.
"""
from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

APP_TIMEOUT_S = 1800.0  # one answer; a hung app fails the run instead of blocking it


@dataclass
class AppConfigResult:
    name: str  # "ar" or "spec@N", as the engine bench names them
    set_name: str
    tokens_per_s: list[float] = field(default_factory=list)  # the app's answers
    engine_tokens_per_s: list[float] = field(default_factory=list)  # the engine's, paired one to one

    @property
    def median(self) -> float:
        return statistics.median(self.tokens_per_s) if self.tokens_per_s else 0.0

    @property
    def engine_median(self) -> float:
        return statistics.median(self.engine_tokens_per_s) if self.engine_tokens_per_s else 0.0

    @property
    def ratio(self) -> float | None:
        return self.median / self.engine_median if self.engine_median else None

    @property
    def paired_ratio(self) -> float | None:
        """Median of app/engine over the pairs (each pair: the same prompt, back to back)."""
        pairs = [a / e for a, e in zip(self.tokens_per_s, self.engine_tokens_per_s) if e > 0]
        return statistics.median(pairs) if pairs else None


@dataclass
class AppReport:
    configs: list[AppConfigResult]
    first_answer_tps: float
    second_answer_tps: float
    load_seconds: float

    @property
    def first_over_second(self) -> float:
        return self.first_answer_tps / self.second_answer_tps if self.second_answer_tps else 0.0


def app_json(report: AppReport) -> dict:
    """The "app" section of `--json-out`: per config the app's samples and the paired engine's,
    their medians and ratios, the first answer against the second, the load time."""
    configs = []
    for r in report.configs:
        configs.append({
            "set": r.set_name, "config": r.name, "app_tokens_per_s": r.tokens_per_s,
            "engine_tokens_per_s": r.engine_tokens_per_s,
            "app_median_tokens_per_s": r.median, "engine_median_tokens_per_s": r.engine_median,
            "app_over_engine": r.ratio, "paired_app_over_engine": r.paired_ratio,
        })
    return {
        "configs": configs, "first_answer_tokens_per_s": report.first_answer_tps,
        "second_answer_tokens_per_s": report.second_answer_tps, "first_over_second": report.first_over_second,
        "load_seconds": report.load_seconds,
    }


def app_settings(opts, budget: int | None):
    from .settings import Settings

    return Settings(
        budget=budget if budget is not None else Settings.budget, budget_auto=False, depth=opts.depth, width=opts.width, tree_algo=opts.tree_algo,
        speculation=budget is not None, temperature=opts.temperature, top_p=opts.top_p, seed=opts.seed,
        max_new_tokens=opts.max_new_tokens, thinking=opts.thinking,
    )


async def _answer(app, pilot, prompt: str) -> float:
    """One answer in a new chat; its decode tokens/s as the engine measured it inside the app."""
    app.action_new_chat()
    await _until(lambda: not app.chat.busy and app.chat.outbox.empty())
    await app.drain_now()
    if not await app.send_message(prompt):
        raise RuntimeError("the app did not take the prompt")
    trace = app.chat.current_trace
    await _until(lambda: trace.result is not None or bool(trace.error))
    if trace.error or trace.result is None:
        raise RuntimeError(f"the app's answer failed: {trace.error}")
    return trace.result.tokens_per_second


async def _until(cond, timeout: float = APP_TIMEOUT_S) -> None:
    """Poll with plain sleeps: `pilot.pause` makes every widget process a message and refreshes
    the screen each time, ~100 forced screen updates a second that the app alone never does
    (on a 2-core CPU they took ~60% of a core from the engine)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out waiting for the app")
        await asyncio.sleep(0.02)


EngineAnswer = Callable[[str, "int | None"], float]  # (prompt, budget or None for AR) -> decode tok/s


def engine_beside(engine, opts) -> tuple[EngineAnswer, Callable[[], None]]:
    """`engine` (loaded as the app's is, in this process) answering one prompt at a time as the
    engine bench does (fresh prefill); and a function that frees it."""
    from .bench.end_to_end import _engine_run, _prompt_ids

    def answer(prompt: str, budget: int | None) -> float:
        record, _ = _engine_run(engine, _prompt_ids(engine, prompt, opts.thinking), opts.params(budget))
        return record.decode_tokens_per_s

    def close() -> None:
        nonlocal engine
        engine = None

    return answer, close


async def run_app(model: str | None, opts, configs: list[tuple[str, int | None]], say,
                  engine_answer: EngineAnswer) -> AppReport:
    from .ui.app import JetspecApp

    app = JetspecApp(
        model=model, draft_head=opts.draft_head, device=opts.device, dtype=opts.dtype, max_context=opts.max_context,
        settings=app_settings(opts, configs[0][1]), persist_settings=False,
    )
    results: list[AppConfigResult] = []
    async with app.run_test(size=(160, 48), headless=True) as pilot:
        t0 = time.perf_counter()
        await _until(lambda: app.chat.load_state != "loading")
        if app.chat.load_state != "ready":
            raise RuntimeError(f"the app could not load the model: {app.chat.load_error}")
        load_s = time.perf_counter() - t0
        first_prompt = next(iter(opts.prompt_sets.values()))[0]
        say("app: first and second answer after start")
        first = await _answer(app, pilot, first_prompt)
        second = await _answer(app, pilot, first_prompt)
        for set_name, prompts in opts.prompt_sets.items():
            for name, budget in configs:
                app.chat.settings = app_settings(opts, budget)
                for _ in range(opts.warmup):
                    await _answer(app, pilot, prompts[0])
                    engine_answer(prompts[0], budget)
                result = AppConfigResult(name, set_name)
                for i, prompt in enumerate(prompts):
                    for rep in range(opts.reps):
                        say(f"app and engine {set_name} {name}: prompt {i + 1}/{len(prompts)} rep {rep + 1}")
                        if (i + rep) % 2 == 0:  # alternate who goes first, so a drift hits both alike
                            e = engine_answer(prompt, budget)
                            a = await _answer(app, pilot, prompt)
                        else:
                            a = await _answer(app, pilot, prompt)
                            e = engine_answer(prompt, budget)
                        result.tokens_per_s.append(a)
                        result.engine_tokens_per_s.append(e)
                results.append(result)
    return AppReport(results, first, second, load_s)


def run(args, end_to_end_options, say, console) -> int:
    """The engine bench, then the app on the same options; one table (and `--json-out`)."""
    from rich.table import Table

    from .bench.end_to_end import load_bench_engine, run_end_to_end
    from .bench.report import write_json
    from .engine.models.loader import default_max_context, resolve_device

    opts = end_to_end_options(args)
    opts.modes = tuple(m for m in opts.modes if m in ("ar", "spec")) or ("ar", "spec")
    opts.validate()
    if len(opts.models) != 1:
        say("--app takes one model")
        return 2
    if opts.max_context is None:  # both sides sized as the app sizes its engine
        opts.max_context = default_max_context(resolve_device(opts.device))
    # One engine serves the engine bench (the JSON's engine section) and then runs beside the app.
    loaded = load_bench_engine(opts.models[0], opts, say)
    engine_report = run_end_to_end(opts, say, loaded=loaded)
    configs = [(name, budget) for name, mode, budget in opts.configs() if mode in ("ar", "spec")]
    engine_answer, close_engine = engine_beside(loaded[0], opts)
    del loaded
    try:
        with tempfile.TemporaryDirectory(prefix="jetspec-app-bench-") as tmp:
            # the app's history and settings go to a scratch directory, not the user's
            os.environ["JETSPEC_CHAT_DATA"] = os.path.join(tmp, "data")
            os.environ["JETSPEC_CHAT_CONFIG"] = os.path.join(tmp, "config")
            app_report = asyncio.run(run_app(opts.models[0], opts, configs, say, engine_answer))
    finally:
        close_engine()
    m = engine_report.models[0]
    t = Table(title=f"app vs engine · {m.model} · head {m.draft_head or '-'} · {m.device} {m.dtype} · "
                    f"context {opts.max_context}", title_justify="left")
    for col in ("set", "config", "engine tok/s", "app tok/s", "app/engine", "paired"):
        t.add_column(col, justify="left" if col in ("set", "config") else "right")
    for r in app_report.configs:
        ratio, paired = r.ratio, r.paired_ratio
        t.add_row(r.set_name, r.name, f"{r.engine_median:.1f}", f"{r.median:.1f}",
                  f"{ratio:.2f}×" if ratio else "-", f"{paired:.2f}×" if paired else "-")
    console.print(t)
    console.print(
        f"first answer after start {app_report.first_answer_tps:.1f} tok/s, second {app_report.second_answer_tps:.1f} "
        f"tok/s (first/second {app_report.first_over_second:.2f}); app load {app_report.load_seconds:.1f} s. tok/s: "
        "median decode tokens/s per config (prefill excluded), each measured by the engine that ran it: the app's "
        "engine process for the app column, an engine in this process answering the same prompt back to back with "
        "the app for the engine column; paired: the median of the per-pair ratios."
    )
    if args.json_out:
        write_json(engine_report, args.json_out, app=app_json(app_report))
        say(f"wrote {args.json_out}")
    return 0

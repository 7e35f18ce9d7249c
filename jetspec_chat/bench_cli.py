"""`jetspec-chat bench`: options, tables and JSON around jetspec_chat/bench/ (see jetspec_chat/bench/BENCH.md).

    jetspec-chat bench random:tiny-qwen3 --budgets 1,4,16 --modes ar,spec,hf --prompts-n 2
    jetspec-chat bench --engine-only                  # random:Qwen/Qwen3-8B, the performance bars
"""
from __future__ import annotations

import argparse
import sys

from .cli import add_load_arguments
from .options import ANSWER_OPTIONS, OptionParser, add_options, tree_depth


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _token_count(text: str) -> tuple[int, ...]:
    """Integers with an optional k suffix (8k = 8192)."""
    parts = []
    for x in text.split(","):
        x = x.strip().lower()
        if x:
            parts.append(str(int(x[:-1]) * 1024) if x.endswith("k") and x[:-1].isdigit() else x)
    return _int_list(",".join(parts))


def _str_list(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("models", nargs="*", default=[],
                   help="models to benchmark (same forms as the app: hub id, directory, embedded alias, random:NAME); "
                        "default: the embedded model, or random:Qwen/Qwen3-8B with --engine-only")
    add_load_arguments(p)
    p.add_argument("--json-out", default=None, metavar="FILE",
                   help="write every number (raw samples too) as JSON; with --app, an \"app\" section beside the engine's")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed runs before timing (default: 1 generation per config; 5 calls with --engine-only)")
    p.add_argument("--reps", type=int, default=None,
                   help="timed repetitions (default: each prompt once per config; 20 calls with --engine-only)")
    g = p.add_argument_group("end to end (default mode)")
    g.add_argument("--modes", type=_str_list, default=("ar", "spec", "hf"),
                   help="comma list of ar (plain decoding on the engine), spec (speculative, one run per budget), "
                        "hf (transformers generate on the same weights); default: ar,spec,hf")
    g.add_argument("--budgets", type=_int_list, default=(16, 32, 64, 128, 256),
                   help="draft tree budgets for spec mode (default: 16,32,64,128,256)")
    add_options(g, ("width", "depth", "tree_algo"))
    g.add_argument("--prompt-sets", type=_str_list, default=None,
                   help="built-in prompt sets: coding, chat, math (default: all three, unless --prompts is given)")
    g.add_argument("--prompts", default=None, metavar="FILE.jsonl", help='prompts file: one {"prompt": ...} per line')
    g.add_argument("--prompts-n", type=int, default=None, help="use only the first N prompts of each set")
    add_options(g, ANSWER_OPTIONS)
    g.add_argument("--thinking", action="store_true", help="let Qwen3 models think (off by default)")
    g.add_argument("--app", action="store_true",
                   help="also drive the real app headless through the same prompts and configs (ar, spec): "
                        "app tok/s next to engine tok/s, and the first answer against the second")
    e = p.add_argument_group("engine only")
    e.add_argument("--engine-only", action="store_true",
                   help="time one AR step, one verify per tree size, one draft forward and one round per context")
    e.add_argument("--contexts", type=_token_count, default=(512, 2048, 8192),
                   help="context lengths in tokens, k suffix allowed (default: 512,2k,8k)")
    e.add_argument("--tree-sizes", type=_int_list, default=(1, 16, 32, 64, 128, 256),
                   help="verify tree sizes in nodes (default: 1,16,32,64,128,256)")
    e.add_argument("--round-budget", type=int, default=128, help="budget of the timed whole round (default: 128)")
    e.add_argument("--bar-context", type=_token_count, default=None,
                   help="context of the headline numbers (default: the smallest of --contexts)")
    e.add_argument("--copy-mib", type=int, default=None,
                   help="copy-bandwidth buffer in MiB (default: 1024 on CUDA, 256 on CPU)")
    e.add_argument("--profile-rounds", type=int, default=5, help="rounds profiled for GPU idle time (CUDA only)")


def _prompt_sets(args) -> dict[str, list[str]]:
    from .bench.end_to_end import PROMPT_SETS, load_prompts_jsonl, prompt_set
    from .engine.errors import ConfigError

    names = args.prompt_sets if args.prompt_sets is not None else (() if args.prompts else PROMPT_SETS)
    sets = {name: prompt_set(name) for name in names}
    if args.prompts:
        from pathlib import Path

        sets[Path(args.prompts).stem] = load_prompts_jsonl(args.prompts)
    if args.prompts_n is not None:
        if args.prompts_n < 1:
            raise ConfigError(f"--prompts-n must be at least 1, got {args.prompts_n}")
        sets = {k: v[: args.prompts_n] for k, v in sets.items()}
    return sets


def end_to_end_options(args):
    from .bench.end_to_end import EndToEndOptions

    return EndToEndOptions(
        models=list(args.models) or [None], prompt_sets=_prompt_sets(args), modes=tuple(args.modes),
        budgets=tuple(args.budgets), draft_head=args.draft_head, device=args.device, dtype=args.dtype,
        max_context=args.max_context, tp=args.tp, width=args.width, depth=tree_depth(args.depth), tree_algo=args.tree_algo,
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
        max_new_tokens=args.max_new_tokens, warmup=1 if args.warmup is None else args.warmup,
        reps=1 if args.reps is None else args.reps, thinking=args.thinking,
    )


def engine_only_options(args):
    from .bench.engine_only import EngineOnlyOptions
    from .engine.errors import ConfigError

    if args.bar_context is not None and len(args.bar_context) != 1:
        raise ConfigError("--bar-context takes one context length")
    return EngineOnlyOptions(
        models=list(args.models) or ["random:Qwen/Qwen3-8B"], draft_head=args.draft_head, device=args.device,
        dtype=args.dtype, contexts=tuple(args.contexts), tree_sizes=tuple(args.tree_sizes),
        round_budget=args.round_budget, width=args.width, warmup=5 if args.warmup is None else args.warmup,
        reps=20 if args.reps is None else args.reps, copy_mib=args.copy_mib, profile_rounds=args.profile_rounds,
        bar_context=args.bar_context[0] if args.bar_context else None, seed=args.seed or 0, tp=args.tp,
    )


# -- tables ----------------------------------------------------------------------------------
def _f(x: float | None, fmt: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{fmt}}{suffix}"


def _bytes(n: int) -> str:
    return f"{n / 1e9:.3f} GB" if n >= 1e8 else f"{n / 1e6:.3f} MB"


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def print_end_to_end(report, console) -> None:
    from rich.table import Table

    env = report.env
    tp = report.options.get("tp") or 1  # None: an engine loaded by the caller
    console.print(f"[bold]jetspec-chat bench[/bold] end to end on {env.get('device_name')} ({env.get('device')}), "
                  f"torch {env.get('torch')}, transformers {env.get('transformers')}"
                  + (f", tensor parallel over {tp} ranks" if tp > 1 else ""))
    for m in report.models:
        for s in m.sets:
            t = Table(title=f"{m.model} · {s.name} ({s.prompts} prompts) · head {m.draft_head or '-'} · {m.dtype}",
                      title_justify="left")
            for col in ("config", "tok/s", "×AR", "e2e tok/s", "τ", "round ms", "draft", "tree", "verify",
                        "accept", "host", "=AR", "peak GiB"):
                t.add_column(col, justify="left" if col == "config" else "right")
            for c in s.configs:
                r = c.round_ms
                t.add_row(
                    c.name, _f(c.decode_tokens_per_s, ".1f"), _f(c.speedup_vs_ar, ".2f", "×"),
                    _f(c.e2e_tokens_per_s, ".1f"), _f(c.tau), _f(r.total if r else None),
                    _f(r.draft if r else None), _f(r.tree if r else None), _f(r.verify if r else None),
                    _f(r.accept if r else None), _f(r.host if r else None), c.same_as_ar or "-",
                    _gib(c.peak_memory_bytes),
                )
            console.print(t)
    console.print("tok/s: median decode tokens/s (prefill excluded); ×AR: vs ar in this run; τ: tokens per round; "
                  "round ms: median of per-answer means; =AR: answers token-identical to ar (greedy)")


def print_engine_only(report, console) -> None:
    from rich.table import Table

    env = report.env
    tp = report.options.get("tp") or 1  # None: an engine loaded by the caller
    console.print(f"[bold]jetspec-chat bench --engine-only[/bold] on {env.get('device_name')} ({env.get('device')}), "
                  f"torch {env.get('torch')}" + (f", tensor parallel over {tp} ranks (rank 0's times and "
                                                 f"weight bytes, per rank)" if tp > 1 else ""))
    for m in report.models:
        console.print(f"[bold]{m.model}[/bold] · head {m.draft_head or '-'} · {m.dtype} · "
                      f"copy bandwidth {m.copy_bandwidth_gb_s:.1f} GB/s (read+write, {m.copy_bytes >> 20} MiB) · "
                      f"weights per AR step {_bytes(m.weight_bytes_per_ar_step)} · "
                      f"head + lm_head {_bytes(m.head_weight_bytes)}")
        t = Table(title="per context (medians, ms)", title_justify="left")
        for col in ("context", "AR step", "bound", "+KV bound", "AR/bound", "AR/+KV", "AR round", "draft",
                    "draft bound", "draft/bound", "round (nodes)", "phases d·t·v·a"):
            t.add_column(col, justify="right")
        for c in m.contexts:
            ph = c.round_phases_ms
            split = "·".join(f"{ph.get(k, 0):.2f}" for k in ("draft_ms", "tree_ms", "verify_ms", "accept_ms")) if ph else "-"
            t.add_row(
                str(c.context), _f(c.ar_step_ms.median, ".3f"), _f(c.ar_bound_ms, ".3f"), _f(c.ar_bound_kv_ms, ".3f"),
                _f(c.ar_step_over_bound, ".2f", "×"), _f(c.ar_step_over_bound_kv, ".2f", "×"),
                _f(c.ar_round_ms.median, ".3f"),
                _f(c.draft_ms.median if c.draft_ms else None, ".3f"), _f(c.draft_bound_ms, ".3f"),
                _f(c.draft_over_bound, ".2f", "×"),
                _f(c.round_ms.median if c.round_ms else None, ".3f") + (f" ({c.round_tree_nodes})" if c.round_ms else ""),
                split,
            )
        console.print(t)
        moe = m.contexts[0].verify[0].experts_per_layer is not None
        state = m.contexts[0].state_bytes
        v = Table(title="verify: target forward over N tree nodes + logits (median ms, ×AR step, ×bound); "
                        + ("bound: expected distinct experts' bytes (uniform routing) + the other weights"
                           if moe else "bound: weights")
                        + (" + the recurrent state read and written" if state else "")
                        + ("" if moe else ", / copy bandwidth"), title_justify="left")
        v.add_column("nodes", justify="right")
        if moe:
            v.add_column("experts/layer", justify="right")
        v.add_column("weights read", justify="right")
        v.add_column("bound ms", justify="right")
        if state:
            v.add_column("tree stash", justify="right")
        for c in m.contexts:
            v.add_column(f"ctx {c.context}", justify="right")
        for i, r in enumerate(m.contexts[0].verify):
            cells = [str(r.nodes)] + ([f"{r.experts_per_layer:.1f}"] if moe else []) + [_bytes(r.weight_bytes), f"{r.bound_ms:.3f}"]
            cells += [_bytes(r.tree_state_bytes)] if state else []
            v.add_row(*cells, *(f"{c.verify[i].ms.median:.3f} ({c.verify[i].over_ar_step:.2f}×, {c.verify[i].over_bound:.2f}× bound)"
                                for c in m.contexts))
        console.print(v)
        b = m.bars
        lines = [(f"context {b.context}: AR step {b.ar_step_ms:.3f} ms vs weights"
                  + (" + recurrent state read and written" if state else "") + "/copy-bandwidth "
                  f"{b.ar_bound_ms:.3f} ms = {b.ar_step_over_bound:.2f}×; with the K/V at that context "
                  f"{b.ar_bound_kv_ms:.3f} ms = {b.ar_step_over_bound_kv:.2f}×")]
        if state:
            lines.append(f"recurrent state {_bytes(state)} (conv windows + fp32 states, one copy; the cache keeps "
                         f"two); per tree no per-node state, a stash of the nodes' operands: "
                         + ", ".join(f"{r.nodes} nodes {_bytes(r.tree_state_bytes)}" for r in m.contexts[0].verify))
        lines += [f"verify {n} nodes {b.verify_ms[n]:.3f} ms = {b.verify_over_ar_step[n]:.2f}× AR step, "
                  f"{b.verify_over_bound[n]:.2f}× its weight-bytes bound" for n in b.verify_ms]
        if b.draft_ms is not None:
            lines.append(f"draft forward {b.draft_ms:.3f} ms vs (head + lm_head)/copy-bandwidth {b.draft_bound_ms:.3f} ms "
                         f"= {b.draft_over_bound:.2f}×")
            lines.append(f"draft at {b.draft_long_context} vs {min(c.context for c in m.contexts)}: "
                         f"{b.draft_long_ms:.3f} ms / {m.contexts[0].draft_ms.median:.3f} ms "
                         f"= {b.draft_long_over_short:.2f}×")
        if b.round_ms is not None:
            ph = b.round_phases_ms or {}
            lines.append(f"whole round at budget {b.round_budget}: {b.round_ms:.3f} ms "
                         f"(engine phases: " + ", ".join(f"{k.removesuffix('_ms')} {v:.3f}" for k, v in ph.items()) + ")")
        if m.gpu_idle is not None:
            g = m.gpu_idle
            lines.append(f"GPU idle per round {g.idle_ms:.3f} ms = {100 * g.idle_fraction:.1f}% of {g.round_ms:.3f} ms "
                         f"(busy {g.busy_ms:.3f} ms; profiled: leading {g.leading_ms:.3f}, between kernels "
                         f"{g.between_ms:.3f}, trailing {g.trailing_ms:.3f} ms, {g.gaps_over_threshold} gaps ≥5 µs)")
            lines += [f"  gap {gap['us']:.0f} µs before {gap['before']}" for gap in g.largest_gaps[:3]]
            lines += [f"  kernel {k['us_per_round']:8.1f} µs ×{k['count_per_round']:g}  {k['name'][:90]}"
                      for k in g.top_kernels[:12]]
        else:
            lines.append("GPU idle: n/a (CPU run, no draft head, or no kernel events)")
        lines.append(f"peak memory {_gib(m.peak_memory_bytes)} GiB")
        console.print("[bold]bars[/bold]\n  " + "\n  ".join(lines))


def run(args: argparse.Namespace) -> int:
    """Run the benchmark the options describe; tables to stdout, progress to stderr."""
    from rich.console import Console

    from .bench.end_to_end import run_end_to_end
    from .bench.engine_only import run_engine_only
    from .bench.report import write_json
    from .engine.errors import EngineError

    err = Console(stderr=True)
    progress = lambda msg: err.print(f"[dim]\\[bench] {msg}[/dim]")
    try:
        if args.app:
            if args.tp not in (None, 1):
                raise EngineError("bench --app runs the app, which takes no --tp yet; drop --tp or --app")
            from .app_bench import run as run_app_bench

            return run_app_bench(args, end_to_end_options, progress, Console(width=max(Console().width, 140)))
        if args.engine_only:
            opts = engine_only_options(args)
            opts.validate()  # fail fast, before loading a model
            report = run_engine_only(opts, progress)
        else:
            opts = end_to_end_options(args)
            opts.validate()
            report = run_end_to_end(opts, progress)
    except EngineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    console = Console(width=max(Console().width, 140))
    if args.engine_only:
        print_engine_only(report, console)
    else:
        print_end_to_end(report, console)
    if args.json_out:
        write_json(report, args.json_out)
        err.print(f"[dim]wrote {args.json_out}[/dim]")
    return 0


def parser() -> argparse.ArgumentParser:
    p = OptionParser(prog="jetspec-chat bench",
                                description="Measure tokens/s, tau and per-phase times (see jetspec_chat/bench/BENCH.md).")
    add_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    from .cli import run_guarded  # a bad option or an engine error: one line, exit code 2

    return run_guarded(lambda args: run(parser().parse_args(args)), sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())

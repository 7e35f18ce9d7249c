"""Command line: `jetspec-chat [MODEL]` opens the app; subcommands do the rest."""
from __future__ import annotations

import argparse
import difflib
import json
import sys
import threading
import time

from .options import ANSWER_OPTIONS, LOAD_OPTIONS, TREE_OPTIONS, OptionParser, add_options, tree_depth

# name -> one line for `jetspec-chat help`; the app itself is the default command.
COMMANDS = {
    "generate": "answer one prompt, non-interactively (stdin or --prompt)",
    "bench": "measure tokens/s, tau and per-phase times",
    "train-head": "train a draft head for a target model",
    "cache": "list or remove the converted models in the cache directory",
    "help": "this help, or `help COMMAND` for a command's options",
}
SUBCOMMANDS = tuple(c for c in COMMANDS if c != "help")


class LoadProgressPrinter:
    """Load progress on stderr. On a terminal each phase is one line rewritten in place with its
    fraction and elapsed time (a ticker thread keeps the time moving through phases that report
    no fraction, like reading a tokenizer); otherwise (a log, a pipe) one plain line per phase."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.what: str | None = None
        self.frac: float | None = None
        self.started = time.monotonic()
        self.phase_start = self.last_draw = 0.0
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._ticker: threading.Thread | None = None

    def __call__(self, what: str, frac: float | None) -> None:
        if what == "ready":  # load_engine's last report: say how long the whole load took
            what, frac = f"ready in {time.monotonic() - self.started:.0f} s", None
        with self._lock:
            now = time.monotonic()
            if what != self.what:
                self._end_line()
                self.what, self.frac, self.phase_start, self.last_draw = what, frac, now, 0.0
                if not self.tty:
                    print(f"[{what}]", file=self.stream, flush=True)
            self.frac = frac
            if self.tty and (now - self.last_draw >= 0.1 or frac == 1.0):
                self._draw(now)
        if self.tty and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="load-progress", daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        while not self._done.wait(0.25):
            with self._lock:
                if self.what is not None:
                    self._draw(time.monotonic())

    SPINNER = "|/-\\"  # a phase without a fraction turns this, so it never looks stalled

    def _draw(self, now: float, final: bool = False) -> None:
        self.last_draw = now
        pct = f" {self.frac * 100:3.0f}%" if self.frac is not None else ""
        took = "" if self.what.startswith("ready") else f" {now - self.phase_start:.0f} s"
        spin = "" if final or self.frac is not None or self.what.startswith("ready") else \
            f" {self.SPINNER[int(now * 4) % len(self.SPINNER)]}"
        print(f"\r\033[K[{self.what}]{pct}{took}{spin}", end="", file=self.stream, flush=True)

    def _end_line(self) -> None:
        """End the current phase's line (its final fraction and time stay on screen)."""
        if self.tty and self.what is not None:
            self._draw(time.monotonic(), final=True)
            print(file=self.stream, flush=True)
        self.what = None

    def close(self) -> None:
        self._done.set()
        with self._lock:
            self._end_line()


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """MODEL and the options that load it."""
    p.add_argument("model", nargs="?", default=None,
                   help="hub id (Qwen/Qwen3-8B), local dir or .gguf, embedded alias (qwen2.5-coder-1.5b, "
                        "qwen2.5-coder-0.5b) or random:NAME; default: the embedded qwen2.5-coder-1.5b")
    add_load_arguments(p)


def add_load_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by every command that loads a model (generate, bench): declared in options.py."""
    add_options(p, LOAD_OPTIONS)


def add_generation_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, TREE_OPTIONS + ANSWER_OPTIONS)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--no-spec", action="store_true",
                   help="plain autoregressive decoding on the same engine (no draft head is loaded)")


def generation_params(args: argparse.Namespace):
    from .engine import GenerationParams, SamplingParams, SpecParams

    return GenerationParams(
        max_new_tokens=args.max_new_tokens,
        stop=tuple(args.stop),
        spec=SpecParams(budget=args.budget, depth=tree_depth(args.depth), width=args.width, tree_algo=args.tree_algo,
                        enabled=not args.no_spec),
        sampling=SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed),
    )


def generate_parser() -> argparse.ArgumentParser:
    p = OptionParser(prog="jetspec-chat generate", description="Answer one prompt, non-interactively.")
    add_engine_arguments(p)
    add_generation_arguments(p)
    p.add_argument("--prompt", default=None, help="the user message (default: read stdin)")
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--thinking", action="store_true", help="let Qwen3 models think (off by default)")
    p.add_argument("--raw", action="store_true", help="feed the prompt as is, without the chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    p.add_argument("--check-lossless", nargs="?", const="transformers", choices=("transformers", "ar"), default=None,
                   help="also decode greedily without speculation and compare token for token: with transformers "
                        "generate on the same weights (default; exact in fp32) or with this engine's own AR "
                        "(=ar; exact in bf16 too)")
    return p


def run_generate(argv: list[str]) -> int:
    args = generate_parser().parse_args(argv)
    from .engine import ChatSession, ConfigError, FinishEvent, PrefillEvent, RoundEvent, load_engine

    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    if not prompt.strip():
        raise ConfigError("the prompt is empty; pass --prompt TEXT or pipe it on stdin")
    if args.check_lossless and args.temperature > 0:
        raise ConfigError("--check-lossless compares greedy decoding; drop --temperature")
    if args.budget is None:  # as in the app: the budget follows the device
        from .engine.models.loader import resolve_device
        from .engine.params import auto_budget

        args.budget = auto_budget(str(resolve_device(args.device)))
    params = generation_params(args)
    params.validate(max_depth=None)  # fail fast, before loading anything; depth is checked once the head is known
    progress = None if args.json else LoadProgressPrinter()
    try:
        head = "none" if args.no_spec else args.draft_head  # plain AR drafts nothing: load no head
        engine = load_engine(args.model, head, device=args.device, dtype=args.dtype,
                             max_context=args.max_context, progress=progress, depth=args.depth, tp=args.tp)
    finally:
        if progress is not None:
            progress.close()
    if args.raw:
        prompt_ids = engine.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    else:
        session = ChatSession(engine, system_prompt=args.system, thinking=args.thinking)
        session.messages.append({"role": "user", "content": prompt})
        prompt_ids = session.prompt_ids()
    if args.max_context is None:  # size the cache to exactly this job
        engine.set_max_context(len(prompt_ids) + args.max_new_tokens + args.budget + 1)
    result = None
    try:
        for event in engine.generate(prompt_ids, params):
            if isinstance(event, PrefillEvent) and not args.json:
                print(event.first_text, end="", flush=True)
            elif isinstance(event, RoundEvent) and not args.json:
                print(event.new_text, end="", flush=True)
            elif isinstance(event, FinishEvent):
                result = event.result
    except KeyboardInterrupt:
        print("\n[interrupted]", file=sys.stderr)
        return 130
    out = {
        "text": result.text,
        "token_ids": list(result.token_ids),
        "new_tokens": result.new_tokens,
        "finish_reason": result.finish_reason,
        "rounds": result.rounds,
        "accept_lengths": list(result.accept_lengths),
        "mean_accept_length": round(result.mean_accept_length, 4),
        "prompt_tokens": len(prompt_ids),
        "prefill_seconds": round(result.prefill_seconds, 4),
        "seconds": round(result.seconds, 4),
        "tokens_per_second": round(result.tokens_per_second, 3),
        "model": engine.model_name,
        "draft_head": engine.head_name if params.spec.enabled else None,
        "spec": params.spec.enabled and engine.head is not None,
        "budget": params.spec.budget,
        "depth": params.spec.depth or engine.max_depth,
        "width": params.spec.width,
        "tree_algo": params.spec.tree_algo,
        "temperature": params.sampling.temperature,
        "device": engine.device,
        "dtype": engine.dtype,
        "kv_cache_bytes": engine.memory_bytes(),  # target paged KV + draft KV, sized to this job (per rank)
        "tp": engine.tp,
    }
    if result.message:
        out["message"] = result.message
    if args.check_lossless:
        from .engine.models.oracle import check_lossless

        out.update(check_lossless(engine, prompt_ids, result, args.max_new_tokens, args.check_lossless, params))
    if args.json:
        print(json.dumps(out))
    else:
        print(file=sys.stderr)
        line = (f"[{out['new_tokens']} tokens, {out['rounds']} rounds, tau {out['mean_accept_length']:.2f}, "
                f"{out['tokens_per_second']:.1f} tok/s, {result.finish_reason}]")
        if args.check_lossless:
            line += f" [lossless vs {args.check_lossless}: {str(out['lossless']).lower()}]"
        print(line, file=sys.stderr)
        if result.message:
            print(result.message, file=sys.stderr)
    if engine.tp > 1:
        engine.close()  # the worker ranks exit with it
    return 0


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version("jetspec-chat")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from . import __version__

        return __version__


def app_parser() -> argparse.ArgumentParser:
    from .ui.launch import add_arguments

    commands = "\n".join(f"  {name:<11} {line}" for name, line in COMMANDS.items())
    p = OptionParser(
        prog="jetspec-chat", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Chat with a model and watch tree speculation live (the default command).",
        epilog=f"commands (`jetspec-chat COMMAND -h` for their options):\n{commands}",
    )
    p.add_argument("--version", action="version", version=f"jetspec-chat {version()}")
    add_arguments(p)
    return p


def run_app(argv: list[str]) -> int:
    from .ui.launch import run

    args = app_parser().parse_args(argv)
    if args.model and not args.demo:
        check_model_argument(args.model)
    return run(args)


def check_model_argument(word: str) -> None:
    """Refuse a bare-word MODEL that names nothing loadable before the app opens: a mistyped
    command (`genrate`) is far likelier than a model of that name, so it is named as such. Paths
    and hub ids go through: the app shows their problems itself (and can retry the load)."""
    from .engine.errors import EngineError
    from .engine.models.model_sources import source_kind

    if "/" in word or word.startswith((".", "~")) or word.lower().endswith(".gguf"):
        return
    close = difflib.get_close_matches(word, list(COMMANDS), n=1, cutoff=0.6)
    try:
        source_kind(word)
    except EngineError:
        if close:
            raise UsageError(f"unknown command {word!r}; did you mean `jetspec-chat {close[0]}`? "
                             f"(`jetspec-chat help` lists the commands)") from None
        raise


class UsageError(Exception):
    """A mistyped command line: str(error) is the one line to show."""


def run_help(argv: list[str]) -> int:
    if not argv:
        app_parser().print_help()
        return 0
    if argv[0] in SUBCOMMANDS:
        return dispatch([argv[0], "--help"])
    close = difflib.get_close_matches(argv[0], list(COMMANDS), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else f"; the commands are {', '.join(SUBCOMMANDS)}"
    raise UsageError(f"no command named {argv[0]!r}{hint}")


def run_module_command(name: str, module: str, argv: list[str]) -> int:
    """Subcommands that live in their own module, each exposing add_arguments(parser) and run(args)."""
    import importlib

    mod = importlib.import_module(module, __package__)
    p = OptionParser(prog=f"jetspec-chat {name}")
    mod.add_arguments(p)
    return mod.run(p.parse_args(argv))


def dispatch(argv: list[str]) -> int:
    command = argv[0] if argv else None
    if command in ("help", "-h", "--help"):
        return run_help(argv[1:])
    if command == "--version":
        print(f"jetspec-chat {version()}")
        return 0
    if command == "generate":
        return run_generate(argv[1:])
    if command == "bench":
        return run_module_command("bench", ".bench_cli", argv[1:])
    if command == "train-head":
        return run_module_command("train-head", ".train_cli", argv[1:])
    if command == "cache":
        return run_module_command("cache", ".cache_cli", argv[1:])
    return run_app(argv)


def main(argv: list[str] | None = None) -> int:
    return run_guarded(dispatch, sys.argv[1:] if argv is None else argv)


def run_guarded(command, argv: list[str]) -> int:
    """Every entry point (`jetspec-chat`, `python -m jetspec_chat.ui`) runs its command through
    here: a user's mistake or an engine error is one line and exit code 2, Ctrl-C is
    "[interrupted]" and 130, never a traceback."""
    try:
        from .engine.errors import EngineError  # inside the try, so Ctrl-C here is clean too

        from .engine.errors import MissingPackageError

        try:
            return command(argv)
        except EngineError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except ImportError as e:  # a missing package is one sentence too, never a traceback
            print(f"error: {MissingPackageError.from_import_error(e)}", file=sys.stderr)
            return 2
    except UsageError as e:
        print(f"jetspec-chat: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Nothing is left half-written: conversions build in a staging directory that is
        # renamed into place only when complete (engine/models/embedded.py, staging()).
        print("[interrupted]", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

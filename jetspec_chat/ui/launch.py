"""Command-line entry for the chat app: `jetspec-chat [MODEL] [options]`.

`jetspec_chat.cli` calls `add_arguments` to build its parser and `run` for the default command.
"""
from __future__ import annotations

import argparse
import shlex
import sys

from jetspec_chat.options import TREE_OPTIONS, add_options, int_in, tree_depth


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="target model: hub id, local path or alias (default: the embedded model)",
    )
    # Unset options stay None: the saved settings apply unless an option is given.
    add_options(parser, ("draft_head",), keep_unset=True)
    spec = parser.add_argument_group("speculation (changeable live in the app)")
    add_options(spec, TREE_OPTIONS, keep_unset=True)
    spec.add_argument("--no-spec", action="store_true", help="start with speculation off (plain AR)")
    add_options(spec, ("temperature", "top_p", "seed", "max_new_tokens"), keep_unset=True)
    eng = parser.add_argument_group("engine")
    add_options(eng, ("device", "dtype", "max_context", "tp"), keep_unset=True)
    app = parser.add_argument_group("app")
    app.add_argument("--theme", metavar="NAME", help="dark, light, projector, or a theme file's name from the config dir")
    app.add_argument("--session", metavar="NAME", help="open the saved session NAME (or start one saved under that name)")
    app.add_argument("--thinking", action="store_true", help="Qwen3 thinking mode for new chats")
    app.add_argument("--system", metavar="TEXT", help="system prompt for new chats")
    app.add_argument("--web", action="store_true", help="serve the app in a browser on localhost (textual-serve)")
    app.add_argument("--port", type=int_in(1, 65535, "port"), default=8000, help="port for --web (default 8000)")
    app.add_argument("--demo", action="store_true", help="run on a scripted fake engine (no model; to try the UI)")
    app.add_argument("--race", action="store_true",
                     help="open the race (the runs replayed side by side at their measured pace) as each comparison (F6) finishes")


def _settings_from_args(args: argparse.Namespace):
    from jetspec_chat.settings import load_settings

    s = load_settings()
    if getattr(args, "budget", None) is not None:
        s.budget = args.budget
        s.budget_auto = False
    if getattr(args, "depth", None) is not None:
        s.depth = tree_depth(args.depth)
    if getattr(args, "width", None) is not None:
        s.width = args.width
    if getattr(args, "tree_algo", None):
        s.tree_algo = args.tree_algo
    if getattr(args, "temperature", None) is not None:
        s.temperature = args.temperature
    if getattr(args, "top_p", None) is not None:
        s.top_p = args.top_p
    if getattr(args, "seed", None) is not None:
        s.seed = args.seed
    if getattr(args, "max_new_tokens", None) is not None:
        s.max_new_tokens = args.max_new_tokens
    if getattr(args, "no_spec", False):
        s.speculation = False
    elif getattr(args, "budget", None) is not None:
        s.speculation = True
    if getattr(args, "thinking", False):
        s.thinking = True
    if getattr(args, "system", None) is not None:
        s.system_prompt = args.system or None
    return s


def build_app(args: argparse.Namespace):
    from .app import JetspecApp

    backend = None
    if getattr(args, "demo", False):
        from .fake_engine import FakeBackend

        backend = FakeBackend(round_delay_s=0.05, load_delay_s=1.5)
    return JetspecApp(
        model=args.model,
        draft_head=getattr(args, "draft_head", None),
        device=getattr(args, "device", "auto") or "auto",
        dtype=getattr(args, "dtype", "auto") or "auto",
        max_context=getattr(args, "max_context", None),
        tp=getattr(args, "tp", None),
        backend=backend,
        settings=_settings_from_args(args),
        theme=getattr(args, "theme", None),
        session=getattr(args, "session", None),
        demo=backend is not None,
        race=getattr(args, "race", False),
    )


def app_argv(args: argparse.Namespace) -> list[str]:
    """The options in `args` as a command line for `python -m jetspec_chat.ui` (without --web)."""
    out: list[str] = []
    if args.model:
        out.append(args.model)
    for name in ("draft_head", "budget", "depth", "width", "tree_algo", "temperature", "top_p", "seed", "max_new_tokens",
                 "device", "dtype", "max_context", "tp", "theme", "session", "system"):
        value = getattr(args, name, None)
        if value is None or (name in ("device", "dtype") and value == "auto"):
            continue
        out += [f"--{name.replace('_', '-')}", str(value)]
    for flag in ("no_spec", "thinking", "demo", "race"):
        if getattr(args, flag, False):
            out.append(f"--{flag.replace('_', '-')}")
    return out


def serve_web(args: argparse.Namespace) -> int:
    try:
        from textual_serve.server import Server
    except ImportError:
        print("jetspec-chat: --web needs textual-serve: pip install textual-serve", file=sys.stderr)
        return 2
    command = shlex.join([sys.executable, "-m", "jetspec_chat.ui", *app_argv(args)])
    print(f"jetspec-chat: serving on http://localhost:{args.port} (each browser tab starts its own app and engine)")
    Server(command, host="localhost", port=args.port, title="jetspec-chat").serve()
    return 0


def run(args: argparse.Namespace) -> int:
    if getattr(args, "web", False):
        return serve_web(args)
    app = build_app(args)
    app.run()
    return app.return_code or 0

"""`python -m jetspec_chat.ui [MODEL] [options]`: the chat app alone (also what --web serves).

`python -m jetspec_chat.ui --demo` runs it on the scripted fake engine. It is `jetspec-chat`
without the subcommands: the same parser, model check, and error and Ctrl-C handling.
"""
from __future__ import annotations

import sys

from jetspec_chat.cli import run_app, run_guarded


def main(argv: list[str] | None = None) -> int:
    return run_guarded(run_app, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())

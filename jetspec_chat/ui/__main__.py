"""`python -m jetspec_chat.ui [MODEL] [options]`: the chat app alone (also what --web serves).

`python -m jetspec_chat.ui --demo` runs it on the scripted fake engine.
"""
from __future__ import annotations

import argparse
import sys

from .launch import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jetspec-chat", description="Chat with tree speculative decoding, live.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

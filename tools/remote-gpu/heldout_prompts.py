"""Held-out prompts for the bf16 lossless sweep, as a `bench --prompts` JSONL.

Only prompts no head was trained on: first user turns of ShareGPT conversations on the dev side
of the train/dev split (`prompts.is_dev`; training drops such conversations whole) and dev-side
prompts of the built-in coding/reasoning generators. Runs on the CPU (needs the `train` extra):

    python3 tools/remote-gpu/heldout_prompts.py --sharegpt 100 --builtin 60 > .stage/heldout.jsonl
"""
from __future__ import annotations

import argparse
import json

from jetspec_chat.training.prompts import builtin_prompts, is_dev
from jetspec_chat.training.sharegpt import open_sharegpt, read_conversations, to_messages


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sharegpt", type=int, default=100, help="ShareGPT dev-side first turns")
    ap.add_argument("--builtin", type=int, default=60, help="dev-side built-in generator prompts")
    ap.add_argument("--max-chars", type=int, default=1200)
    args = ap.parse_args()
    chat: list[str] = []
    with open_sharegpt() as f:
        for conversation in read_conversations(f):
            messages = to_messages(conversation)
            if not messages or messages[0]["role"] != "user":
                continue
            text = messages[0]["content"]
            if len(text) <= args.max_chars and is_dev(text) and text not in chat:
                chat.append(text)
            if len(chat) >= args.sharegpt:
                break
    _, dev = builtin_prompts(0, args.builtin)
    for source, prompts in (("sharegpt-dev", chat), ("builtin-dev", dev)):
        for p in prompts:
            print(json.dumps({"prompt": p, "source": source}))


if __name__ == "__main__":
    main()

"""The generation, speculation and loading options, declared once: name, type, range, default, help.

Every entry point builds its parser from here (`add_options`): the app (ui/launch.py), `generate`
(cli.py), `bench` (bench_cli.py) and `train-head` where it loads a model. A value out of range is
rejected while the command line is parsed, before any model loads. The app's Settings take their
defaults from here too; its parser defaults to None so that saved settings apply unless an
option is given. "The device picks the budget" lives in engine/params.auto_budget alone: a
budget left at None is resolved there once the device is known.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable

from .engine.params import CPU_BUDGET, DEFAULT_WIDTH, GPU_BUDGET, MAX_BUDGET, MAX_DEPTH, MAX_WIDTH, TREE_ALGOS

DEFAULT_MAX_NEW_TOKENS = 1024
DTYPES = ("auto", "float32", "bfloat16", "float16")


def int_in(lo: int, hi: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a whole number, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{what} must be between {lo} and {hi}, got {value}")
        return value

    parse.lo, parse.hi = lo, hi  # type: ignore[attr-defined]  # the range, for tests and help
    return parse


def float_in(lo: float, hi: float, what: str, *, lo_open: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a number, got {text!r}") from None
        if not ((lo < value) if lo_open else (lo <= value)) or value > hi:
            span = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
            raise argparse.ArgumentTypeError(f"{what} must be in {span}, got {value}")
        return value

    parse.lo, parse.hi = lo, hi  # type: ignore[attr-defined]
    return parse


FULL_DEPTH = "full"


def depth(text: str) -> int | str:
    """A depth, or FULL_DEPTH (full/max/auto) for the head's whole block (see tree_depth)."""
    if text.lower() in ("full", "max", "auto"):
        return FULL_DEPTH
    return _depth_int(text)


def tree_depth(value: int | str | None) -> int | None:
    """SpecParams.depth of a parsed --depth: None for the head's whole block."""
    return None if value in (None, FULL_DEPTH) else int(value)


_depth_int = int_in(1, MAX_DEPTH, "depth")
depth.lo, depth.hi = 1, MAX_DEPTH  # type: ignore[attr-defined]


def any_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


class OptionParser(argparse.ArgumentParser):
    """A parser whose mistakes are one line: `error: PROG: argument --depth: ...` (raised as a
    ConfigError, which every entry point prints as one line with exit code 2), not usage + exit."""

    def error(self, message: str):  # type: ignore[override]
        from .engine.errors import ConfigError

        raise ConfigError(f"{self.prog}: {message} (`{self.prog} -h` lists the options)")


@dataclass(frozen=True)
class Option:
    flag: str
    type: Callable[[str], Any] | None
    default: Any
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


OPTIONS: dict[str, Option] = {o.dest: o for o in (
    # loading
    Option("--draft-head", None, None, "draft head: a directory or hub id, 'random[:LAYERS]' (random weights), "
           "or 'none' (no head: plain AR); default: the model's own", "H"),
    Option("--device", None, "auto", "auto (a GPU if there is one), cpu, cuda, cuda:N"),
    Option("--dtype", None, "auto", "auto (bfloat16 on a GPU, float32 on a CPU), float32, bfloat16, float16",
           choices=DTYPES),
    Option("--max-context", int_in(16, 1 << 24, "max context"), None, "KV cache size in tokens", "N"),
    Option("--tp", int_in(1, 64, "tp"), None, "tensor parallel: split the model over N processes (one GPU each; "
           "N CPU processes on a CPU); default 1, or on GPUs the fewest that hold the model's weights", "N"),
    # the draft tree
    Option("--budget", int_in(1, MAX_BUDGET, "budget"), None,
           f"draft tree nodes including the root (1-{MAX_BUDGET}; default: {GPU_BUDGET} on a GPU, {CPU_BUDGET} on a CPU)",
           "N"),
    Option("--depth", depth, None, f"tree depth (1-{MAX_DEPTH}, or 'full'; default: the head's block size - 1)", "D"),
    Option("--width", int_in(1, MAX_WIDTH, "width"), DEFAULT_WIDTH,
           f"candidates per depth (top-K, 1-{MAX_WIDTH}; default {DEFAULT_WIDTH})", "W"),
    Option("--tree-algo", None, "accum_logp", f"tree algorithm: {', '.join(TREE_ALGOS)} (default accum_logp)",
           "A", choices=TREE_ALGOS),
    # the answer
    Option("--max-new-tokens", int_in(1, 1 << 20, "max new tokens"), DEFAULT_MAX_NEW_TOKENS,
           f"answer length limit in tokens (default {DEFAULT_MAX_NEW_TOKENS})", "N"),
    Option("--temperature", float_in(0.0, 100.0, "temperature"), 0.0, "sampling temperature (0 = greedy, the default)",
           "T"),
    Option("--top-p", float_in(0.0, 1.0, "top-p", lo_open=True), 1.0, "nucleus sampling mass (default 1.0: off)", "P"),
    Option("--top-k", int_in(0, 1 << 20, "top-k"), 0, "sample among the K likeliest tokens (default 0: off)", "K"),
    Option("--seed", any_int, None, "sampling seed (default: a fixed seed when sampling)", "S"),
)}


def add_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, names: list[str] | tuple[str, ...], *,
                keep_unset: bool = False) -> None:
    """Add the options `names` (their dest names, e.g. "max_new_tokens") to `parser`. keep_unset:
    default None, so the caller can tell "not given" from the default (the app's saved settings)."""
    for name in names:
        o = OPTIONS[name]
        kwargs: dict[str, Any] = dict(default=None if keep_unset else o.default, help=o.help)
        if o.type is not None:
            kwargs["type"] = o.type
        if o.metavar:
            kwargs["metavar"] = o.metavar
        if o.choices:
            kwargs["choices"] = o.choices
        parser.add_argument(o.flag, **kwargs)


LOAD_OPTIONS = ("draft_head", "device", "dtype", "max_context", "tp")
TREE_OPTIONS = ("budget", "depth", "width", "tree_algo")
ANSWER_OPTIONS = ("max_new_tokens", "temperature", "top_p", "top_k", "seed")

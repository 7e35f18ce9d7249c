"""Count the torch ops the fixed-shape tree build issues (a proxy for kernel launches in the
draft graph), on the CPU: every dispatched aten op except views and allocations.

    python benchmarks/tree_ops.py                        # the installed engine/tree.py
    python benchmarks/tree_ops.py --module old_tree.py   # another copy, e.g. `git show REV:engine/tree.py`

On CUDA most counted ops are one kernel; sort/topk are 1-3 (copy, index fill, sort), and
a Triton kernel is one launch (counted as `triton:<name>` with --triton, which runs the path
CUDA tensors take under TRITON_INTERPRET=1; "cpu ms" is then the interpreter's time).
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

# Metadata-only ops: no kernel on any device.
FREE = {
    "view", "_unsafe_view", "reshape", "select", "slice", "t", "expand", "as_strided", "alias",
    "unsqueeze", "squeeze", "permute", "transpose", "detach", "empty", "empty_like", "empty_strided",
    "lift_fresh", "_to_copy_noop", "unbind", "split", "split_with_sizes", "_reshape_alias",
}


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name not in FREE:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def load_tree_module(path: str | None):
    if path is None:
        from jetspec_chat.engine import tree
        return tree
    spec = importlib.util.spec_from_file_location("tree_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--module", help="path of a tree.py to measure instead of the installed one")
    p.add_argument("--budgets", default="16,32,64,128,256,512,1024")
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--depth", type=int, default=15)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--triton", action="store_true", help="count the Triton path (needs TRITON_INTERPRET=1 on a CPU)")
    p.add_argument("--detail", action="store_true", help="print the per-op counts")
    args = p.parse_args()
    tree = load_tree_module(args.module)
    launches = collections.Counter()
    if args.triton:
        if not os.environ.get("TRITON_INTERPRET"):
            sys.exit("--triton on a CPU needs TRITON_INTERPRET=1")
        from jetspec_chat.kernels import accum_tree_triton

        tree.accum_tree = accum_tree_triton  # the path CUDA tensors take
        count_triton_launches(launches)
    g = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(torch.randn(args.depth, args.vocab, generator=g) * 3, dim=-1)
    root = torch.tensor(5)
    print(f"{'budget':>6} {'nodes':>5} {'ops':>5} {'sort/topk':>9} {'cpu ms':>8}  (width {args.width}, depth {args.depth}, vocab {args.vocab})")
    for budget in (int(b) for b in args.budgets.split(",")):
        def build(budget=budget):
            return tree.build_accum_logp(root, logp, budget, args.width)

        build()  # warm-up
        launches.clear()
        with OpCounter() as c:
            t = build()
        c.ops.update(launches)
        reps = 1 if args.triton else 5
        t0 = time.perf_counter()
        for _ in range(reps):
            build()
        ms = (time.perf_counter() - t0) / reps * 1e3
        total = sum(c.ops.values())
        sorts = c.ops["sort"] + c.ops["topk"]
        print(f"{budget:>6} {t.size:>5} {total:>5} {sorts:>9} {ms:>8.2f}")
        if args.detail:
            print("        " + ", ".join(f"{k} {v}" for k, v in c.ops.most_common()))


def count_triton_launches(launches: collections.Counter) -> None:
    """Count launches of the tree kernels (wraps their launcher)."""
    from jetspec_chat.kernels import tree_build

    for name in tree_build.KERNELS:
        kernel = getattr(tree_build, name)
        run = kernel.run

        def counted(*a, _run=run, _name=name, **k):
            launches[f"triton:{_name}"] += 1
            with _disable_current_modes():  # the interpreter's own tensor copies are not launches
                return _run(*a, **k)

        kernel.run = counted


if __name__ == "__main__":
    main()

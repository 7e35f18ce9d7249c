"""Paged tree attention alone (bf16, CUDA-graphed): this tree's kernel against a previous one, on
the Qwen2.5-1.5B (12/2 heads) and Qwen3-8B (32/8 heads) shapes, head_dim 128.

The previous kernel is read from git (`git show OLD:kernels/tree_attention.py`, default b8bab39,
the kernel before session 9) and timed in the same process. Each sample is one graph replay of
REPEAT back-to-back calls (as in a forward: the calls' launch gaps count, the graph launch does
not), divided by REPEAT; medians of 30. Random tree masks in topological order, shuffled pages,
a block table of `capacity` positions (it sets split_len: 593 and 8448 both give 256).

Every timed case also checks that the two kernels' outputs are bitwise equal ("bits" column).
--sweep times the launch knobs (NUM_STAGES x NUM_WARPS) on a subset, checks each knob set's bits
against the previous kernel, and prints the fastest bit-exact set as constants to paste.

    python3 scripts/gpu-lease/attention_bench.py [--sweep] [--old b8bab39] [--json-out FILE]
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import os
import statistics
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from jetspec_chat.engine.bench.timing import graphed_ms
from jetspec_chat.kernels import paged_tree_attention_triton, split_len_for, tree_attention, visible_keys

REPO = Path(__file__).resolve().parents[2]
HEADS = {"1.5b": (12, 2), "8b": (32, 8)}
BLOCK_SIZE, HEAD_DIM, REPEAT = 16, 128, 20


@dataclass(frozen=True)
class Case:
    shape: str
    t: int
    context: int
    capacity: int
    mask: str = "tree"


def cases() -> list[Case]:
    out = [Case(s, 1, c, cap) for s in HEADS for cap in (593, 8448) for c in (512, 2048, 8192)]
    out += [Case(s, t, c, 8448) for s in HEADS for t in (16, 64, 128, 256) for c in (512, 4096)]
    out += [Case(s, 512, c, 8448, "causal") for s in HEADS for c in (0, 3000)]
    return out


SWEEP_CASES = [Case(s, 1, 512, 593) for s in HEADS] + [Case(s, 1, 8192, 8448) for s in HEADS] + [
    Case(s, t, c, 8448) for s in HEADS for t, c in ((16, 512), (64, 512), (256, 4096))]


def load_old(commit_or_file: str):
    """The previous kernel: a commit (read with git show) or a saved copy of its file."""
    if Path(commit_or_file).is_file():
        src = Path(commit_or_file).read_text()
    else:
        src = subprocess.run(["git", "show", f"{commit_or_file}:kernels/tree_attention.py"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "old_tree_attention.py"
    path.write_text(src.replace("from .reference import", "from jetspec_chat.kernels.reference import"))
    spec = importlib.util.spec_from_file_location("old_tree_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tree_mask(t: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    if kind == "causal":
        return torch.ones(t, t, dtype=torch.bool).tril()
    mask = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):  # random tree, topological order, depth grows like a real draft tree
        mask[i, i] = True
        if i:
            mask[i] |= mask[int(torch.randint(max(0, i - 8), i, (), generator=gen))]
    return mask


class Inputs:
    def __init__(self, case: Case, gen: torch.Generator):
        n_heads, n_kv = HEADS[case.shape]
        cap = max(case.capacity, case.context + case.t + BLOCK_SIZE)
        blocks = -(-cap // BLOCK_SIZE)
        self.split_len = split_len_for(blocks * BLOCK_SIZE)
        self.k = torch.randn(blocks, BLOCK_SIZE, n_kv, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        self.v = torch.randn_like(self.k)
        self.table = torch.randperm(blocks, device="cuda").to(torch.int32)
        self.q = torch.randn(case.t, n_heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        self.mask = tree_mask(case.t, case.mask, gen).cuda()
        self.keys = visible_keys(self.mask)
        self.prefix = torch.tensor([case.context], dtype=torch.int32, device="cuda")
        self.out = torch.empty_like(self.q)

    def new(self) -> torch.Tensor:
        return paged_tree_attention_triton(self.q, self.k, self.v, self.table, self.prefix, self.keys,
                                           HEAD_DIM**-0.5, out=self.out)

    def old(self, module) -> torch.Tensor:
        return module.paged_tree_attention_triton(self.q, self.k, self.v, self.table, self.prefix, self.keys,
                                                  HEAD_DIM**-0.5, out=self.out)


def per_call_us(fn) -> float:
    def calls():
        for _ in range(REPEAT):
            fn()
    return statistics.median(graphed_ms(calls, 30)) * 1e3 / REPEAT


def same_bits(inputs: Inputs, old) -> bool:
    a = inputs.new().clone()
    b = inputs.old(old).clone()
    return torch.equal(a, b)


def compiled_info() -> str:
    """Registers / spills of the compiled attention kernels (Triton internals: best effort)."""
    try:
        lines = []
        for entry in tree_attention._tree_attn_kernel.device_caches.values():
            for kernel in entry[0].values():
                md = kernel.metadata
                lines.append(f"  stages {md.num_stages} warps {md.num_warps}: {kernel.n_regs} regs, "
                             f"{kernel.n_spills} spills, {md.shared} B smem")
        return "\n".join(sorted(set(lines)))
    except Exception as exc:  # noqa: BLE001 - diagnostics only
        return f"  (no compile info: {exc!r})"


def run_table(old, json_rows: list) -> None:
    gen = torch.Generator().manual_seed(0)
    print(f"µs per call (CUDA graph of {REPEAT} calls, median of 30); bits: new == old bitwise")
    print(f"{'shape':>5} {'T':>4} {'ctx':>6} {'cap':>5} {'mask':>6} {'split':>5} {'old':>8} {'new':>8} {'new/old':>8} bits")
    for case in cases():
        x = Inputs(case, gen)
        bits = same_bits(x, old)
        old_us = per_call_us(lambda: x.old(old))
        new_us = per_call_us(x.new)
        print(f"{case.shape:>5} {case.t:>4} {case.context:>6} {case.capacity:>5} {case.mask:>6} {x.split_len:>5} "
              f"{old_us:8.1f} {new_us:8.1f} {new_us / old_us:8.2f} {'yes' if bits else 'NO'}")
        json_rows.append({**asdict(case), "old_us": old_us, "new_us": new_us, "bits_equal": bits})


def run_sweep(old) -> dict:
    gen = torch.Generator().manual_seed(1)
    inputs = [(c, Inputs(c, gen)) for c in SWEEP_CASES]
    old_us = [per_call_us(lambda x=x: x.old(old)) for _, x in inputs]
    default = (tree_attention.NUM_STAGES, tree_attention.NUM_WARPS)
    results = []
    print(f"\nsweep: geometric mean of new/old over {len(inputs)} cases "
          f"({', '.join(f'{c.shape} T={c.t} ctx={c.context}' for c, _ in inputs)})")
    for stages, warps in itertools.product((2, 3, 4, 5), (4, 8)):
        tree_attention.NUM_STAGES, tree_attention.NUM_WARPS = stages, warps
        try:
            bits = all(same_bits(x, old) for _, x in inputs)
            us = [per_call_us(x.new) for _, x in inputs]
        except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory at high stages
            print(f"  stages {stages} warps {warps}: failed ({type(exc).__name__}: {str(exc)[:80]})")
            continue
        score = math.exp(statistics.fmean(math.log(u / o) for u, o in zip(us, old_us)))
        results.append({"stages": stages, "warps": warps, "bits_equal": bits, "score": score, "us": us})
        print(f"  stages {stages} warps {warps}: {score:.3f}  bits {'yes' if bits else 'NO '}  "
              + " ".join(f"{u:6.1f}" for u in us))
    tree_attention.NUM_STAGES, tree_attention.NUM_WARPS = default
    print("  old kernel:            1.000              " + " ".join(f"{o:6.1f}" for o in old_us))
    exact = [r for r in results if r["bits_equal"]]
    if exact:
        best = min(exact, key=lambda r: r["score"])
        print(f"winner (bit-exact, new/old {best['score']:.3f}; now stages/warps {default}):\n"
              f"NUM_WARPS = {best['warps']}\nNUM_STAGES = {best['stages']}")
    return {"old_us": old_us, "results": results}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", default="b8bab39", help="the previous kernel: a commit, or its saved file (no .git)")
    ap.add_argument("--sweep", action="store_true", help="also sweep NUM_STAGES x NUM_WARPS")
    ap.add_argument("--json-out", default=os.path.join(os.environ.get("OUT", "."), "attention_bench.json"))
    args = ap.parse_args()
    old = load_old(args.old)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, previous kernel {args.old}, "
          f"NUM_STAGES {tree_attention.NUM_STAGES}, NUM_WARPS {tree_attention.NUM_WARPS}")
    rows: list = []
    run_table(old, rows)
    print("compiled:\n" + compiled_info())
    sweep = run_sweep(old) if args.sweep else None
    Path(args.json_out).write_text(json.dumps({"old": args.old, "rows": rows, "sweep": sweep}, indent=1))


if __name__ == "__main__":
    main()

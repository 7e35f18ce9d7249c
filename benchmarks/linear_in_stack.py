"""What the linears' configs buy, and what bit-identity costs: the decoder stack at the Qwen2.5-0.5B
/ 1.5B and Qwen3-8B shapes (random weights, bf16, a 512-token prefix, the engine's KV capacity),
µs per layer at T new tokens, with its linears run three ways:

  tuned:  the engine as it is (kernels/matmul.py: TUNED configs where measured, else the rule);
  rule:   TUNED emptied, every weight on `rule_config`;
  nopick: WIDE_PICKS and WS_PICKS emptied: every launch the rules' (`block_m_for`, `use_split`,
          `use_tma`), none of the tiles and forms picked per row count;
  cublas: F.linear (cuBLAS) for every linear: faster or slower, but a row's bits then depend on
          how many rows share the GEMM, so bf16 speculation no longer equals bf16 AR;
  trial:  (with --trial) TUNED plus the given entries: configs to try before adding them to TUNED
          (a new group count changes that weight's bits, for AR and verify alike).

One CUDA graph of TargetModel.forward per variant (the lm_head is not in it), replayed --reps times
(median), the variants alternating for --rounds rounds (median of the rounds). Prints new/`tuned`
ratios. (An L2-prefetch probe, prefetch_probe.py in c567824, measured a side-stream weight prefetch
the same way; docs/performance.md, "Prefetch".)

    python3 benchmarks/linear_in_stack.py [--models 0.5B,1.5B,8B] [--ts 1,64,128] [--reps 40]
        [--trial "6144,4096,64,64,4;4096,4096,64,64,6;4096,12288,64,64,6"] [--variants trial]

Runs from the repository root without installing the package. JSON to $OUT/linear_cost_bench.json.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # decoder_stack.py, also when loaded by path
from decoder_stack import build_stack, make_batch  # noqa: E402  (also puts the repo's package on the path)

import torch  # noqa: E402

from jetspec_chat.engine import layers  # noqa: E402
from jetspec_chat.bench.timing import graphed_ms  # noqa: E402
from jetspec_chat.kernels import matmul  # noqa: E402

VARIANTS = ("tuned", "rule", "nopick", "cublas")


def parse_trial(text: str) -> dict[tuple[int, int], matmul.LinearConfig]:
    """--trial entries "N,K,block_n,block_k,groups[,stages]" separated by ";" -> TUNED entries."""
    trial = {}
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        n, k, bn, bk, groups, *stages = (int(v) for v in entry.split(","))
        trial[(n, k)] = matmul.LinearConfig(block_n=bn, block_k=bk, groups=groups, num_stages=(stages or [4])[0])
    return trial


@contextlib.contextmanager
def linears(variant: str, trial: dict | None = None):
    """Run the model's linears as `variant` says (module docstring), then restore the engine's."""
    tuned, wide, ws = dict(matmul.TUNED), dict(matmul.WIDE_PICKS), dict(matmul.WS_PICKS)
    batch_invariant = layers._batch_invariant
    try:
        if variant == "trial":
            matmul.TUNED.update(trial)
        if variant == "rule":
            matmul.TUNED.clear()
        if variant == "nopick":
            matmul.WIDE_PICKS.clear()
            matmul.WS_PICKS.clear()
        if variant == "cublas":
            layers._batch_invariant = lambda *_: False
        matmul.choose_config.cache_clear()
        yield
    finally:
        for table, saved in ((matmul.TUNED, tuned), (matmul.WIDE_PICKS, wide), (matmul.WS_PICKS, ws)):
            table.clear()
            table.update(saved)
        matmul.choose_config.cache_clear()
        layers._batch_invariant = batch_invariant


def bench(name: str, ts, reps: int, rounds: int, trial: dict | None = None, only: tuple = ()) -> list[dict]:
    cfg, model, kv = build_stack(name)
    variants = tuple(v for v in VARIANTS + (("trial",) if trial else ()) if not only or v in only or v == "tuned")
    rows = []
    with torch.no_grad():
        for t in ts:
            batch = make_batch(t)
            us = {v: [] for v in variants}
            for _ in range(rounds):
                for variant in variants:
                    with linears(variant, trial):
                        samples = graphed_ms(lambda: model(batch, kv)[0], reps, warmup=2)
                    us[variant].append(statistics.median(samples) * 1e3 / cfg.num_layers)
            ref = statistics.median(us["tuned"])
            for variant in variants:
                m = statistics.median(us[variant])
                rows.append(dict(model=name, t=t, variant=variant, us_per_layer=m, ratio=m / ref, runs=us[variant]))
                print(f"{name:>5} T={t:<4} {variant:<7} {m:8.2f} µs/layer  {m / ref:6.3f}  "
                      f"{m * cfg.num_layers / 1e3:.3f} ms a forward", flush=True)
    del model, kv
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="0.5B,1.5B,8B")
    ap.add_argument("--ts", default="1,64,128")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trial", default="", help='a fifth variant: TUNED plus these entries, '
                    '"N,K,block_n,block_k,groups[,stages]" separated by ";"')
    ap.add_argument("--variants", default="", help="only these variants beside `tuned` (comma-separated; default all)")
    args = ap.parse_args()
    trial = parse_trial(args.trial)
    only = tuple(v for v in args.variants.split(",") if v)
    rows = []
    for name in args.models.split(","):
        rows += bench(name, [int(v) for v in args.ts.split(",")], args.reps, args.rounds, trial, only)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "linear_cost_bench.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

"""Old vs new batch-invariant linear, side by side, at the Qwen2.5-1.5B and Qwen3-8B shapes of
linear_bench.py, bf16, M = 1, 16, 64, 128, 256 (about 2-3 min on an H100/H200 with compiles).

Variants (each a kernel and a config rule for (N, K)):
  main      the kernel at main 0313288 (matmul_main.py: rows wrap, second launch sums the groups),
            with main's configs: the numbers the engine had.
  new       kernels/matmul.py (masked rows, groups summed in the GEMM kernel), today's configs.
  new-1w    groups for one program per SM at M=1 (groups_for target = SMS, half today's): fewer,
            longer groups, less partial traffic and fewer fused-launch drains at large M.
  new-64    64-wide N tiles, groups as today's rule for them (two programs per SM at M=1): twice
            the tiles, so more programs for the fused launch at M=128-256.
The other variants run only where `new` has K groups (not gate_up, lm_head: their tiles fill
the SMs; the sweep found 64-wide tiles slower there) and differ from `new`'s config.

Per (shape, variant, M): µs per call for each launch (s = split over K groups, f = fused;
both where the config has groups), `*` marking the one `use_split` picks, and the variant's
checks: `inv` = bitwise M-invariance of every launch (x[:m] rows equal the M=256 rows; single
rows alone), `=main` = the same bits as `main` (expected yes for `new`: same arithmetic; the
other variants change the group count, hence the sum order, so `no` is expected there).
Timing as in linear_bench.py: CUDA graph over >= 128 MB of weight copies, median of replays.

    python3 scripts/gpu-lease/linear_variants.py [--ms 1,16,64,128,256] [--models 1.5B,8B]

JSON to $OUT/linear_variants.json when $OUT is set.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import linear_bench as lb  # noqa: E402  (also puts the repo's kernels/ on jetspec_chat's path)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from jetspec_chat.kernels import matmul  # noqa: E402


def _load_main_kernel():
    spec = importlib.util.spec_from_file_location("matmul_main", HERE / "matmul_main.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["matmul_main"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


MAIN = _load_main_kernel()


@dataclass(frozen=True)
class Variant:
    name: str
    module: object  # the kernel module: linear_triton, use_split, LinearConfig
    config: Callable[[int, int], object]  # (N, K) -> the module's LinearConfig


def _cfg(block_n: int, target: int) -> Callable[[int, int], matmul.LinearConfig]:
    return lambda n, k: matmul.LinearConfig(block_n, 64, matmul.groups_for(n, k, block_n, 64, target))


VARIANTS = [
    Variant("main", MAIN, MAIN.choose_config),
    Variant("new", matmul, matmul.choose_config),
    Variant("new-1w", matmul, _cfg(128, matmul.SMS)),
    Variant("new-64", matmul, _cfg(64, matmul.TARGET_PROGRAMS)),
]


def label(c, k: int) -> str:
    return f"{c.block_n}x{c.block_k} G{c.num_groups(k)}"


def run(ms: list[int], reps: int) -> list[dict]:
    rows = []
    for s_i, (model, name, n, k, bias) in enumerate(lb.SHAPES):
        weights, b = lb.make_weights(n, k, bias, seed=s_i)
        w = weights[0]
        gen = torch.Generator(device="cuda").manual_seed(100 + s_i)
        x_all = torch.randn(lb.MAX_ROWS, k, device="cuda", generator=gen).to(lb.DTYPE)
        cublas = {m: lb.graphed_us(lambda ww, m=m: F.linear(x_all[:m], ww, b), weights, reps) for m in ms}
        print(f"\n{model} {name} N={n} K={k}: µs per call (s split, f fused, * = use_split's pick)")
        print(f"{'variant':<8}{'config':<12}" + "".join(f"{'M=' + str(m):>16}" for m in ms) + f"{'inv':>5}{'=main':>6}")
        print(f"{'cuBLAS':<20}" + "".join(f"{cublas[m]:>16.1f}" for m in ms))
        main_y = MAIN.linear_triton(x_all, w, b)
        new_config = matmul.choose_config(n, k)
        for v in VARIANTS:
            c = v.config(n, k)
            if v.name not in ("main", "new") and (new_config.num_groups(k) == 1 or (
                    c.block_n, c.block_k, c.num_groups(k)) == (new_config.block_n, new_config.block_k, new_config.num_groups(k))):
                continue
            mod = v.module
            launches = (True, False) if c.num_groups(k) > 1 else (False,)
            times: dict[int, dict[str, float]] = {}
            for m in ms:
                x = x_all[:m]
                times[m] = {("s" if sp else "f"): lb.graphed_us(
                    lambda ww, sp=sp, x=x: mod.linear_triton(x, ww, b, config=c, split=sp), weights, reps)
                    for sp in launches}
            inv = all(lb.invariant(lambda xx, sp=sp: mod.linear_triton(xx, w, b, config=c, split=sp), x_all, ms)
                      for sp in launches)
            same_main = torch.equal(mod.linear_triton(x_all, w, b, config=c), main_y)
            cells = ""
            for m in ms:
                pick = "s" if mod.use_split(m, n, k, c) else "f"
                cell = " ".join(f"{t:.1f}{key}{'*' if key == pick else ''}" for key, t in times[m].items())
                cells += f"{cell:>16}"
            print(f"{v.name:<8}{label(c, k):<12}{cells}{'yes' if inv else 'NO':>5}{'yes' if same_main else 'no':>6}")
            rows.append(dict(model=model, name=name, n=n, k=k, variant=v.name, config=c.__dict__,
                             groups=c.num_groups(k), times=times, picked={m: mod.use_split(m, n, k, c) for m in ms},
                             cublas_us=cublas, invariant=inv, same_bits_as_main=same_main))
        del weights, w, b, x_all
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="1,16,64,128,256")
    ap.add_argument("--models", default="1.5B,8B")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    ms = [int(v) for v in args.ms.split(",")]
    assert max(ms) <= lb.MAX_ROWS
    lb.SHAPES[:] = [s for s in lb.SHAPES if s[0] in set(args.models.split(","))]
    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    import triton
    print(f"{props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}, triton {triton.__version__}; "
          f"kernels from {Path(matmul.__file__).parent}")
    rows = run(ms, args.reps)
    bad = [f"{r['model']} {r['name']} {r['variant']}" for r in rows if not r["invariant"]]
    new_differs = [f"{r['model']} {r['name']}" for r in rows if r["variant"] == "new" and not r["same_bits_as_main"]]
    print(f"\nM-invariance failures: {bad or 'none'}; new != main bits: {new_differs or 'none'}")
    print(f"{time.time() - t0:.0f} s")
    if os.environ.get("OUT"):
        path = os.path.join(os.environ["OUT"], "linear_variants.json")
        with open(path, "w") as f:
            json.dump(dict(device=props.name, rows=rows, seconds=time.time() - t0), f, indent=1)
        print("wrote", path)


if __name__ == "__main__":
    main()

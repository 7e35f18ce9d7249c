"""visible_keys on a CUDA GPU: the one-launch Triton kernel (kernels/key_order.py) against the
torch reference's chain of small kernels (visible_keys_ref), CUDA-graphed, per mask size.

    python benchmarks/visible_keys.py
    python benchmarks/visible_keys.py --sizes 1,64,256 --warps 1,2,4

Each graph holds REPEAT calls back to back (a lone µs-scale kernel is below the events' noise);
the printed time is per call. Before timing, each path's outputs are checked equal to the
reference's on the same mask ("same" column).
"""
from __future__ import annotations

import argparse

import torch

from jetspec_chat.bench.timing import graphed_us_per_call
from jetspec_chat.kernels import ancestor_mask_ref, key_order, visible_keys_ref, visible_keys_triton

REPEAT = 20


def tree_mask(t: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(t)
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (), generator=gen)) for i in range(1, t)])
    return ancestor_mask_ref(parents, t).to(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1,16,64,128,256,512")
    p.add_argument("--warps", default="1,2,4", help="kernel warps to time (the engine uses key_order.NUM_WARPS)")
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args()
    device = torch.device("cuda")
    warps = [int(w) for w in args.warps.split(",")]
    print(f"{torch.cuda.get_device_name(device)}; engine warps {key_order.NUM_WARPS}; µs per call, median of {args.reps} graph replays")
    print(f"{'T':>5} {'mask':>6} {'torch':>8} " + " ".join(f"{f'triton w{w}':>10}" for w in warps) + "  same")
    default_warps = key_order.NUM_WARPS
    for t in (int(s) for s in args.sizes.split(",")):
        for kind in ("tree", "causal"):
            mask = tree_mask(t, device) if kind == "tree" else torch.ones(t, t, dtype=torch.bool, device=device).tril()
            ref = visible_keys_ref(mask)
            row = [graphed_us_per_call(lambda: visible_keys_ref(mask), args.reps, REPEAT)]
            same = True
            for w in warps:
                key_order.NUM_WARPS = w
                out = visible_keys_triton(mask)
                same &= torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
                row.append(graphed_us_per_call(lambda: visible_keys_triton(mask), args.reps, REPEAT))
            key_order.NUM_WARPS = default_warps
            print(f"{t:>5} {kind:>6} {row[0]:>8.2f} " + " ".join(f"{v:>10.2f}" for v in row[1:]) + f"  {same}")


if __name__ == "__main__":
    main()

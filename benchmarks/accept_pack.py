"""The round's acceptance and packing: the one-launch kernel (kernels/accept.py) against the torch
code it replaces (engine/accept.py: `accept` + `pack_round`), CUDA-graphed, on bucket-padded
trees of the verify buckets' sizes (the size a device scalar, the path as long as a bucket's).

    python3 benchmarks/accept_pack.py [--nodes 1,16,32,64,128,256] [--real 0.6] [--reps 50]

Each figure is µs per call: a CUDA graph of REPEAT calls back to back (as inside the verify
graph, launch gaps included), replayed `--reps` times, the median divided by REPEAT; `same`
compares the kernel's packed round and path with the torch code's, bit for bit.
"""
from __future__ import annotations

import argparse

import torch

from jetspec_chat.bench.timing import graphed_us_per_call
from jetspec_chat.engine.accept import accept, pack_round
from jetspec_chat.engine.tree import Tree, ancestor_mask
from jetspec_chat.kernels.accept import accept_pack_triton

REPEAT = 20
MAX_PATH = 16  # a bucket's path length: min(bucket, the head's block)


def padded_tree(bucket: int, real: int, device: torch.device, g: torch.Generator) -> tuple[Tree, torch.Tensor]:
    """A random tree of `real` nodes (chain-heavy, at most MAX_PATH - 1 deep) padded to `bucket`
    as the verify bucket pads it, and target choices that follow it."""
    parents = [-1]
    depths = [0]
    for i in range(1, real):
        p = i - 1 if torch.rand(1, generator=g).item() < 0.5 else int(torch.randint(0, i, (1,), generator=g))
        while depths[p] >= MAX_PATH - 1:  # keep the tree within the path's length
            p = parents[p]
        parents.append(p)
        depths.append(depths[p] + 1)
    parents_t = torch.tensor(parents + [-1] * (bucket - real))
    depths_t = torch.tensor(depths + [0] * (bucket - real))
    tokens = torch.arange(bucket)  # distinct: siblings differ
    ancestors = torch.eye(bucket, dtype=torch.bool)
    ancestors[:real, :real] = ancestor_mask(parents_t[:real], MAX_PATH)
    choices = torch.randint(0, bucket, (bucket,), generator=g)
    for i in range(1, real):  # each node chooses its last child: a path of a few nodes is accepted
        choices[parents[i]] = i
    tree = Tree(tokens, parents_t, depths_t, torch.randn(bucket, generator=g), ancestors, MAX_PATH - 1)
    return Tree(*(t.to(device) for t in (tree.tokens, tree.parents, tree.depths, tree.scores, tree.ancestors)),
                tree.max_depth), choices.to(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", default="1,16,32,64,128,256", help="bucket sizes")
    p.add_argument("--real", type=float, default=0.6, help="real nodes as a share of the bucket")
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args()
    device = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    print(f"{torch.cuda.get_device_name(device)}; µs per call (CUDA graph of {REPEAT})")
    print(f"{'N':>5} {'real':>5} {'P':>3} {'count':>5} {'torch µs':>9} {'kernel µs':>10} {'ratio':>6}  same")
    for bucket in (int(n) for n in args.nodes.split(",")):
        real = max(1, round(bucket * args.real))
        tree, choices = padded_tree(bucket, real, device, g)
        size = torch.tensor(real, device=device)
        path_len = min(bucket, MAX_PATH)

        def torch_round():
            acc = accept(tree, choices, size, path_len)
            return acc.path, pack_round(tree, acc)

        def kernel_round():
            return accept_pack_triton(tree.tokens, tree.parents, tree.depths, tree.ancestors, tree.scores, choices,
                                      size, path_len)

        path, want = torch_round()
        head, packed = kernel_round()
        same = torch.equal(packed, want) and torch.equal(head[2:], path)
        t_torch = graphed_us_per_call(torch_round, args.reps, REPEAT)
        t_kernel = graphed_us_per_call(kernel_round, args.reps, REPEAT)
        print(f"{bucket:>5} {real:>5} {path_len:>3} {int(want[0]):>5} {t_torch:9.1f} {t_kernel:10.1f} "
              f"{t_torch / t_kernel:6.1f}  {same}")


if __name__ == "__main__":
    main()

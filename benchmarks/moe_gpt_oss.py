"""gpt-oss's MoE block alone at gpt-oss-20b's shapes (bf16, random weights), against its bytes bound,
with the experts as checkpoints store them and as a K-contiguous copy.

Runs LAYERS distinct MoE layers back to back in one CUDA graph (each output plus the first input
feeds the next layer, as a residual would, so no layer's experts sit in L2 from the last replay)
and prints, per row count T and layout, the time per layer, the distinct experts touched, the
time over (touched experts' bytes + router) / copy bandwidth, and whether the two layouts give
the same bits and a token alone the bits it has among the T (batch invariance).

Layouts: `stored` is transformers' GptOssExperts layout, the engine's: gate_up [E, H, 2I] with gate
and up columns interleaved, down [E, I, H]; `k_major` the same logical tensors with K contiguous
(gate_up.transpose(1, 2).contiguous().transpose(1, 2), likewise down): the kernels walk the
weights by their strides, so only the loads change.

    python benchmarks/moe_gpt_oss.py [--rows 1,4,16,64,256] [--layers 8]
"""
from __future__ import annotations

import argparse
import statistics

import torch

from jetspec_chat.bench.timing import graphed_ms, measure_copy_bandwidth
from jetspec_chat.kernels import moe_block_gpt_oss_triton, moe_route_gpt_oss_ref

HIDDEN, INTER, EXPERTS, TOP_K, ALPHA, LIMIT = 2880, 2880, 32, 4, 1.702, 7.0  # gpt-oss-20b


def make_layer(g: torch.Generator, device: torch.device) -> list[torch.Tensor]:
    """router weight + bias, gate_up + bias, down + bias (bf16, the stored layout)."""
    def randn(*shape, scale):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=torch.bfloat16)

    return [randn(EXPERTS, HIDDEN, scale=HIDDEN**-0.5), randn(EXPERTS, scale=0.5),
            randn(EXPERTS, HIDDEN, 2 * INTER, scale=HIDDEN**-0.5), randn(EXPERTS, 2 * INTER, scale=0.1),
            randn(EXPERTS, INTER, HIDDEN, scale=INTER**-0.5), randn(EXPERTS, HIDDEN, scale=0.1)]


def k_major(layer: list[torch.Tensor]) -> list[torch.Tensor]:
    r, rb, gu, gub, d, db = layer
    return [r, rb, gu.transpose(1, 2).contiguous().transpose(1, 2), gub, d.transpose(1, 2).contiguous().transpose(1, 2), db]


def block(x: torch.Tensor, layer: list[torch.Tensor]) -> torch.Tensor:
    r, rb, gu, gub, d, db = layer
    return moe_block_gpt_oss_triton(x, r, rb, gu, gub, d, db, TOP_K, ALPHA, LIMIT)


def chain_inputs(x0: torch.Tensor, layers: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    xs = [x0]
    for layer in layers[:-1]:
        xs.append(block(xs[-1], layer) + x0)
    return xs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,4,16,64,256")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    stored = [make_layer(g, dev) for _ in range(args.layers)]
    layouts = {"stored": stored, "k_major": [k_major(layer) for layer in stored]}
    rows = [int(v) for v in args.rows.split(",")]
    x = torch.randn(max(rows), HIDDEN, generator=g).to(device=dev, dtype=torch.bfloat16)
    _, gb_s = measure_copy_bandwidth(dev, 1 << 30, 3, 10)
    expert_bytes = sum(t[0].numel() * t.element_size() for t in stored[0][2:])  # one expert and its biases
    router_bytes = sum(t.numel() * t.element_size() for t in stored[0][:2])
    print(f"gpt-oss-20b MoE block, bf16, {args.layers} layers in one graph, copy bandwidth {gb_s:.0f} GB/s")
    print(f"{'rows':>5} {'experts':>8} {'bound us':>9} " + " ".join(f"{n + ' us':>11} {'x bound':>8}" for n in layouts)
          + "  same bits  invariant")
    for t in rows:
        x0 = x[:t]
        touched = [moe_route_gpt_oss_ref(xi, layer[0], layer[1], TOP_K)[1].unique().numel()
                   for xi, layer in zip(chain_inputs(x0, stored), stored)]
        experts = sum(touched) / len(touched)
        bound_us = (experts * expert_bytes + router_bytes) / (gb_s * 1e9) * 1e6
        cells = []
        for layers in layouts.values():
            def chain(layers=layers):
                h = x0
                for layer in layers:
                    h = block(h, layer) + x0
                return h
            us = statistics.median(graphed_ms(chain, args.reps)) / len(layers) * 1e3
            cells.append(f"{us:11.1f} {us / bound_us:8.2f}")
        outs = [block(x0, layers[0]) for layers in layouts.values()]
        same = all(torch.equal(outs[0], o) for o in outs[1:])
        alone = all(torch.equal(block(x0[i:i + 1], stored[0])[0], outs[0][i]) for i in {0, t - 1})
        print(f"{t:>5} {experts:8.1f} {bound_us:9.1f} " + " ".join(cells) + f"  {str(same):>9}  {str(alone):>9}")


if __name__ == "__main__":
    main()

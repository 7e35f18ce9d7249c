"""Where an AR step's time goes inside the chain: the decoder stack at the Qwen2.5-1.5B / Qwen3-8B
shapes (random weights, bf16, 512-token prefix, T = 1), timed whole and with one kind of kernel
left out at a time, in one CUDA graph each (alternating, median of rounds). The difference is
what that kernel costs in place, with its neighbours' programmatic launches around it, which a
kernel timed alone does not show. The outputs of the ablated stacks are meaningless; only the
times are read.

  full:        TargetModel.forward's loop
  -attention:  o = q (no attention, no merge)
  -rope:       q is the qkv GEMM's q rows (no norm / RoPE / KV write; the GEMM's output summed)
  -silu:       down reads the gate half (no silu_mul)
  gemms:       only the four GEMMs a layer, each on the previous one's output (no norms either)

    python3 benchmarks/layer_ablation.py [--models 1.5B,8B] [--reps 40] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # decoder_stack.py, also when loaded by path
from decoder_stack import build_stack, make_batch  # noqa: E402  (also puts the repo's package on the path)

import torch  # noqa: E402

from jetspec_chat.bench.timing import graphed_ms  # noqa: E402
from jetspec_chat.engine.layers import linear  # noqa: E402
from jetspec_chat.kernels import add_rms_norm, paged_tree_attention, prefix_tensor, silu_mul, visible_keys  # noqa: E402

VARIANTS = ("full", "-attention", "-rope", "-silu", "gemms")


def forward(model, batch, kv, variant: str) -> torch.Tensor:
    t = batch.input_ids.shape[0]
    h = model.model.embed_tokens(batch.input_ids)
    cos, sin = model.rotary.cos_sin(batch.positions, h.dtype)
    slots = kv.slots_of(batch.prefix_len + torch.arange(t, device=h.device))
    keys = visible_keys(batch.tree_mask)
    prefix = prefix_tensor(batch.prefix_len, h.device)
    layers = model.model.layers
    eps = model.cfg.rms_norm_eps
    x = layers[0].input_layernorm(h)
    for i, layer in enumerate(layers):
        attn, mlp = layer.self_attn, layer.mlp
        if variant == "gemms":
            qkv = linear(x, attn.qkv_proj.weight)
            o = linear(qkv[:, : attn.n_heads * attn.head_dim], attn.o_proj.weight)
            gu = linear(o, mlp.gate_up_proj.weight)
            x = linear(gu[:, : mlp.down_proj.weight.shape[1]], mlp.down_proj.weight)
            continue
        k_pool, v_pool = kv.layer(i)
        if variant == "-rope":
            q = attn.qkv_proj(x)[:, : attn.n_heads * attn.head_dim].reshape(t, attn.n_heads, attn.head_dim)
        else:
            q = attn.qkv_rope_write(x, cos, sin, k_pool, v_pool, slots)
        if variant == "-attention":
            o = q
        else:
            o = paged_tree_attention(q, k_pool, v_pool, kv.block_table, prefix, batch.tree_mask, model.scale, keys)
        x, h = add_rms_norm(attn.o_proj.forward_partials(o.reshape(t, -1)), h, layer.post_attention_layernorm.weight, eps)
        gate, up = mlp.gate_up_proj.split(mlp.gate_up_proj(x))
        act = gate.contiguous() if variant == "-silu" else silu_mul(gate, up)
        next_norm = layers[i + 1].input_layernorm if i + 1 < len(layers) else model.model.norm
        x, h = add_rms_norm(mlp.down_proj.forward_partials(act), h, next_norm.weight, eps)
    return x


def bench(name: str, reps: int, rounds: int) -> list[dict]:
    cfg, model, kv = build_stack(name)
    batch = make_batch(1)
    us = {v: [] for v in VARIANTS}
    with torch.no_grad():
        for _ in range(rounds):
            for v in VARIANTS:
                samples = graphed_ms(lambda v=v: forward(model, batch, kv, v), reps, warmup=2)
                us[v].append(statistics.median(samples) * 1e3 / cfg.num_layers)
    full = statistics.median(us["full"])
    rows = []
    for v in VARIANTS:
        m = statistics.median(us[v])
        rows.append(dict(model=name, variant=v, us_per_layer=m, saved_us=full - m, runs=us[v]))
        print(f"{name:>5} {v:<11} {m:7.2f} µs/layer   {full - m:+6.2f} against full", flush=True)
    del model, kv
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="1.5B,8B")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for name in args.models.split(","):
        rows += bench(name, args.reps, args.rounds)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "layer_ablation.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

"""Probe: does streaming the next GEMMs' weights into L2 during the memory-idle kernels of a layer
(RoPE + KV write, attention, merge, norms) shorten the AR step? And the linear sweep's tuned configs.

The decoder stack at the Qwen2.5-1.5B / Qwen3-8B shapes (random weights, bf16, 512-token prefix),
one CUDA graph per variant, alternating, µs per layer (median). A prefetch is a kernel on a side
stream of the graph (fork after a GEMM, joined at the end) that issues `cp.async.bulk.prefetch.L2`
for a weight's first bytes; it reads nothing into registers, so no output bit can change (checked).

    python3 scripts/gpu-lease/prefetch_probe.py [--models 1.5B,8B] [--ts 1,64] [--reps 40]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
import jetspec_chat  # noqa: E402

if str(REPO) not in jetspec_chat.__path__:
    jetspec_chat.__path__.append(str(REPO))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from jetspec_chat.engine.bench.timing import graphed_ms  # noqa: E402
from jetspec_chat.engine.kv_cache import PagedKVCache  # noqa: E402
from jetspec_chat.engine.model import ForwardBatch, TargetModel, build_target  # noqa: E402
from jetspec_chat.engine.model_config import ModelConfig  # noqa: E402
from jetspec_chat.kernels import add_rms_norm, paged_tree_attention, prefix_tensor, qkv_rope_write, silu_mul, visible_keys  # noqa: E402
from jetspec_chat.kernels import matmul  # noqa: E402
from jetspec_chat.kernels.matmul import LinearConfig  # noqa: E402

VOCAB = 4096
PREFIX = 512
CAPACITY = 33792
HF = {
    "1.5B": dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, rope_theta=1e6, tie_word_embeddings=True),
    "8B": dict(model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
               num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=1e6),
}
TUNED_15B = {
    (2048, 1536): LinearConfig(block_n=64, block_k=64, groups=8, num_warps=4, num_stages=6),
    (1536, 1536): LinearConfig(block_n=64, block_k=64, groups=5, num_warps=4, num_stages=4),
    (17920, 1536): LinearConfig(block_n=64, block_k=64, groups=1, num_warps=4, num_stages=4),
    (1536, 8960): LinearConfig(block_n=64, block_k=64, groups=11, num_warps=4, num_stages=6),
}
CHUNK = 16384  # bytes per lane and bulk prefetch
LANES = 32


@triton.jit
def _prefetch_kernel(P, nbytes, CHUNK: tl.constexpr, LANES: tl.constexpr, LINES: tl.constexpr):
    lane = tl.arange(0, LANES)
    start = tl.program_id(0).to(tl.int64) * (LANES * CHUNK) + lane.to(tl.int64) * CHUNK
    size = tl.minimum(nbytes - start, CHUNK).to(tl.int32)
    ptr = P + start
    if LINES:
        for j in range(0, CHUNK, 128):
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }",
                "=r,l,r", [ptr + j, size - j], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [ptr, size], dtype=tl.int32, is_pure=False, pack=1)


LINES = False


def prefetch_l2(w: torch.Tensor, frac: float) -> None:
    flat = w.view(-1).view(torch.uint8)
    n = int(flat.numel() * frac) // 16 * 16
    if n <= 0:
        return
    _prefetch_kernel[(triton.cdiv(n, LANES * CHUNK),)](flat, n, CHUNK=CHUNK, LANES=LANES, LINES=LINES, num_warps=1)


class Plan:
    """What each layer prefetches at its two forks: after the qkv GEMM (for o_proj and gate_up,
    used after RoPE, attention, merge and a norm) and after the gate_up GEMM (down, next qkv)."""

    def __init__(self, name: str, o: float = 0.0, gate_up: float = 0.0, down: float = 0.0, next_qkv: float = 0.0):
        self.name, self.o, self.gate_up, self.down, self.next_qkv = name, o, gate_up, down, next_qkv


def forward(model: TargetModel, batch: ForwardBatch, kv: PagedKVCache, plan: Plan | None, side) -> torch.Tensor:
    t = batch.input_ids.shape[0]
    h = model.model.embed_tokens(batch.input_ids)
    cos, sin = model.rotary.cos_sin(batch.positions, h.dtype)
    slots = kv.slots_of(batch.prefix_len + torch.arange(t, device=h.device))
    keys = visible_keys(batch.tree_mask, shared=batch.causal)
    prefix = prefix_tensor(batch.prefix_len, h.device)
    layers = model.model.layers
    eps = model.cfg.rms_norm_eps
    main = torch.cuda.current_stream()

    def fork(items):
        items = [(w, f) for w, f in items if f > 0]
        if not items:
            return
        side.wait_stream(main)
        with torch.cuda.stream(side):
            for w, f in items:
                prefetch_l2(w, f)

    x = layers[0].input_layernorm(h)
    for i, layer in enumerate(layers):
        attn = layer.self_attn
        k_pool, v_pool = kv.layer(i)
        qkv = attn.qkv_proj.forward_partials(x)
        if plan:
            fork([(attn.o_proj.weight, plan.o), (layer.mlp.gate_up_proj.weight, plan.gate_up)])
        q = qkv_rope_write(qkv, attn.n_heads, attn.n_kv, attn._norm_weight(attn.q_norm), attn._norm_weight(attn.k_norm),
                           cos, sin, attn.eps, k_pool, v_pool, slots)
        o = paged_tree_attention(q, k_pool, v_pool, kv.block_table, prefix, batch.tree_mask, model.scale, keys)
        x, h = add_rms_norm(attn.o_proj.forward_partials(o.reshape(t, -1)), h, layer.post_attention_layernorm.weight, eps)
        gate, up = layer.mlp.gate_up_proj.split(layer.mlp.gate_up_proj(x))
        if plan and (plan.down or plan.next_qkv):
            nxt = layers[i + 1].self_attn.qkv_proj.weight if i + 1 < len(layers) else None
            fork([(layer.mlp.down_proj.weight, plan.down)] + ([(nxt, plan.next_qkv)] if nxt is not None else []))
        next_norm = layers[i + 1].input_layernorm if i + 1 < len(layers) else model.model.norm
        x, h = add_rms_norm(layer.mlp.down_proj.forward_partials(silu_mul(gate, up)), h, next_norm.weight, eps)
    if plan:
        main.wait_stream(side)
    return x


def make_batch(t: int, device) -> ForwardBatch:
    gen = torch.Generator(device=device).manual_seed(t)
    return ForwardBatch(
        input_ids=torch.randint(0, VOCAB, (t,), device=device, generator=gen),
        positions=PREFIX + torch.arange(t, device=device),
        tree_mask=torch.ones(t, t, dtype=torch.bool, device=device).tril(),
        prefix_len=torch.tensor(PREFIX, device=device),
        causal=False,
    )


def set_tuned(on: bool) -> None:
    matmul.TUNED.clear()
    if on:
        matmul.TUNED.update(TUNED_15B)
    matmul.choose_config.cache_clear()


def bench(name: str, ts, reps: int, rounds: int) -> list[dict]:
    global LINES
    device = torch.device("cuda")
    cfg = ModelConfig.from_hf(HF[name] | {"vocab_size": VOCAB})
    model = build_target(cfg, device, torch.bfloat16)
    model.init_random(seed=0)
    kv = PagedKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, CAPACITY, device, torch.bfloat16)
    kv.pool.normal_(generator=torch.Generator(device=device).manual_seed(1))
    kv.length = PREFIX
    side = torch.cuda.Stream()
    plans = [None, Plan("o+gu25", o=1, gate_up=0.25), Plan("o+gu50", o=1, gate_up=0.5), Plan("o+gu75", o=1, gate_up=0.75),
             Plan("o+gu50+d25", o=1, gate_up=0.5, down=0.25), Plan("o+gu50+q", o=1, gate_up=0.5, next_qkv=1),
             Plan("lines o+gu50", o=1, gate_up=0.5)]
    variants = [("base", None, False)] + [(p.name, p, False) for p in plans[1:]]
    if name == "1.5B":
        variants += [("tuned", None, True), ("tuned o+gu50", plans[2], True)]
    rows = []
    with torch.no_grad():
        for t in ts:
            batch = make_batch(t, device)
            ref = None
            us = {v[0]: [] for v in variants}
            for r in range(rounds):
                for vname, plan, tuned in variants:
                    LINES = vname.startswith("lines")
                    set_tuned(tuned)
                    if r == 0:
                        y = forward(model, batch, kv, plan, side)
                        torch.cuda.synchronize()
                        if not tuned:
                            if ref is None:
                                ref = y.clone()
                            assert torch.equal(y, ref), f"{vname} changed the output"
                    samples = graphed_ms(lambda: forward(model, batch, kv, plan, side), reps, warmup=2)
                    us[vname].append(statistics.median(samples) * 1e3 / cfg.num_layers)
            base = statistics.median(us["base"])
            for vname, *_ in variants:
                m = statistics.median(us[vname])
                rows.append(dict(model=name, t=t, variant=vname, us_per_layer=m, ratio=m / base, runs=us[vname]))
                print(f"{name:>5} T={t:<4} {vname:<16} {m:8.2f} µs/layer  {m / base:6.3f}  "
                      f"step {m * cfg.num_layers / 1e3:.3f} ms", flush=True)
    set_tuned(False)
    del model, kv
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="1.5B,8B")
    ap.add_argument("--ts", default="1,64")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for name in args.models.split(","):
        rows += bench(name, [int(v) for v in args.ts.split(",")], args.reps, args.rounds)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "prefetch_probe.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

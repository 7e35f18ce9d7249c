"""Launch fusion (session 9): the decoder stack before and after, in one process, at the
Qwen2.5-1.5B and Qwen3-8B shapes (random weights, bf16, all layers, a small vocabulary).

  old: TargetModel.forward as it was (session 8): the qkv GEMM with its group-sum pass, then
       qk_norm_rope, write_kv; o_proj and down with their group-sum passes, then add_rms_norm.
       Rebuilt here from the same modules (`old_forward`): every kernel it calls still exists.
  new: TargetModel.forward: the split GEMMs hand their group sums to qkv_rope_write (norm + RoPE
       + KV write) and add_rms_norm, which add them as they load.

Per model and T (1, 16, 64, 128 new tokens after a 512-token prefix, causal; KV capacity 8448,
the engine's at --contexts up to 8192): µs per layer (one CUDA graph of the whole forward, CUDA
events, median of --reps replays after warm-up, divided by the layer count), kernel launches per
layer (torch.profiler: kernels of a 2-layer forward minus those of a 1-layer one), and whether
the outputs (final hidden states and every layer's new K/V rows) are bitwise equal. Also the
weight-streaming floor of a layer at T=1 (its bytes / the measured copy bandwidth).

    python3 scripts/gpu-lease/layer_launch_bench.py [--models 1.5B,8B] [--ts 1,16,64,128] [--reps 50]

Runs from the repository root without installing the package (as linear_bench.py). JSON to
$OUT/layer_launch_bench.json when $OUT is set. About 1-2 minutes on an H200 (compiles included).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # decoder_stack.py, also when loaded by path
from decoder_stack import build_stack, make_batch, new_cache  # noqa: E402  (also puts the repo's package on the path)

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from jetspec_chat.engine.bench.timing import graphed_ms, measure_copy_bandwidth  # noqa: E402
from jetspec_chat.engine.kv_cache import PagedKVCache  # noqa: E402
from jetspec_chat.engine.model import ForwardBatch, TargetModel  # noqa: E402
from jetspec_chat.kernels import add_rms_norm, paged_tree_attention, visible_keys, write_kv  # noqa: E402

CAPACITY = 8448


def old_forward(model: TargetModel, batch: ForwardBatch, kv: PagedKVCache) -> torch.Tensor:
    """TargetModel.forward before the launch fusion (session 8's loop, taps left out)."""
    t = batch.input_ids.shape[0]
    h = model.model.embed_tokens(batch.input_ids)
    cos, sin = model.rotary.cos_sin(batch.positions, h.dtype)
    slots = kv.slots_of(batch.prefix_len + torch.arange(t, device=h.device))
    keys = visible_keys(batch.tree_mask)
    layers = model.model.layers
    eps = model.cfg.rms_norm_eps
    x = layers[0].input_layernorm(h)
    for i, layer in enumerate(layers):
        attn = layer.self_attn
        q, k, v = attn.qkv_rope(x, cos, sin)
        k_pool, v_pool = kv.layer(i)
        write_kv(k_pool, v_pool, slots, k, v)
        o = paged_tree_attention(q, k_pool, v_pool, kv.block_table, batch.prefix_len, batch.tree_mask, model.scale, keys)
        x, h = add_rms_norm(attn.o_proj(o.reshape(t, -1)), h, layer.post_attention_layernorm.weight, eps)
        next_norm = layers[i + 1].input_layernorm if i + 1 < len(layers) else model.model.norm
        x, h = add_rms_norm(layer.mlp(x), h, next_norm.weight, eps)
    return x


def new_forward(model: TargetModel, batch: ForwardBatch, kv: PagedKVCache) -> torch.Tensor:
    return model(batch, kv)[0]


PATHS = {"old": old_forward, "new": new_forward}


def kernels_of(fn) -> list[str]:
    """Names of the GPU kernels one eager call of fn launches."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def launches_per_layer(model: TargetModel, fn, batch, kv) -> tuple[int, list[str]]:
    """Kernels of a 2-layer forward minus a 1-layer one (the per-forward kernels cancel)."""
    layers = model.model.layers
    counts = {}
    try:
        for n in (1, 2):
            model.model.layers = layers[:n]
            counts[n] = kernels_of(lambda: fn(model, batch, kv))
    finally:
        model.model.layers = layers
    extra = list(counts[2])
    for name in counts[1]:
        if name in extra:
            extra.remove(name)
    return len(counts[2]) - len(counts[1]), extra


def layer_bytes(model: TargetModel) -> int:
    layer = model.model.layers[0]
    return sum(p.numel() * p.element_size() for p in layer.parameters())


def bench_model(name: str, ts, reps: int, bandwidth: float) -> list[dict]:
    cfg, model, kv = build_stack(name, CAPACITY)
    floor_us = layer_bytes(model) / (bandwidth * 1e9) * 1e6  # bandwidth in GB/s
    rows = []
    with torch.no_grad():
        for t in ts:
            batch = make_batch(t)
            out, pools = {}, {}
            for path, fn in PATHS.items():
                kv_run = new_cache(cfg, CAPACITY)
                kv_run.pool.copy_(kv.pool)
                out[path] = fn(model, batch, kv_run)
                pools[path] = kv_run.pool
                del kv_run
            equal = torch.equal(out["old"], out["new"]) and torch.equal(pools["old"], pools["new"])
            del pools
            us = {path: [] for path in PATHS}
            for _ in range(3):  # alternate the paths: drift hits both alike
                for path, fn in PATHS.items():
                    samples = graphed_ms(lambda fn=fn: fn(model, batch, kv), reps, warmup=2)
                    us[path].append(statistics.median(samples) * 1e3 / cfg.num_layers)
            launches = {path: launches_per_layer(model, fn, batch, kv) for path, fn in PATHS.items()}
            row = dict(model=name, t=t, layers=cfg.num_layers, equal=equal,
                       old_us=statistics.median(us["old"]), new_us=statistics.median(us["new"]),
                       old_launches=launches["old"][0], new_launches=launches["new"][0],
                       old_kernels=launches["old"][1], new_kernels=launches["new"][1],
                       floor_us=floor_us if t == 1 else None)
            rows.append(row)
            print(f"{name:>5} {t:>4} {row['old_us']:>9.1f} {row['new_us']:>9.1f} {row['new_us'] / row['old_us']:>6.3f} "
                  f"{row['old_launches']:>6} {row['new_launches']:>6} "
                  f"{row['old_us'] * cfg.num_layers / 1e3:>9.3f} {row['new_us'] * cfg.num_layers / 1e3:>9.3f} "
                  f"{(f'{floor_us:.1f}' if t == 1 else ''):>8} {str(equal):>6}", flush=True)
    del model, kv
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="1.5B,8B")
    ap.add_argument("--ts", default="1,16,64,128")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    ts = [int(v) for v in args.ts.split(",")]
    bw = measure_copy_bandwidth(torch.device("cuda"), 1 << 30, warmup=3, reps=10)[1]  # GB/s
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; copy bandwidth {bw:.0f} GB/s")
    print(f"{'model':>5} {'T':>4} {'old µs/L':>9} {'new µs/L':>9} {'ratio':>6} {'old #':>6} {'new #':>6} "
          f"{'old ms':>9} {'new ms':>9} {'floor/L':>8} {'equal':>6}")
    rows = []
    for name in args.models.split(","):
        rows += bench_model(name, ts, args.reps, bw)
    for r in rows:
        if r["t"] == 1:
            print(f"{r['model']} T=1 kernels per layer, old: {', '.join(r['old_kernels'])}")
            print(f"{r['model']} T=1 kernels per layer, new: {', '.join(r['new_kernels'])}")
    path = args.json_out or (os.path.join(os.environ["OUT"], "layer_launch_bench.json") if os.environ.get("OUT") else None)
    if path:
        Path(path).write_text(json.dumps(dict(device=torch.cuda.get_device_name(), bandwidth=bw, rows=rows), indent=1))
    if not all(r["equal"] for r in rows):
        sys.exit("old and new outputs differ")


if __name__ == "__main__":
    main()

"""What sampling costs beside greedy decoding: the verify step (forward, the target's choices,
acceptance, KV commit, packing) of an AR step and of verify(N), greedy against sampling
(engine/sampling.py, inside the verify graph) against the sort-based reference run eagerly
after the forward graph (how sampling rounds ran before: sort the vocabulary per node); then
the sampler alone on N rows of logits.

    python3 benchmarks/sampling.py [MODEL] [--draft-head HEAD] [--nodes 64] [--context 512]
                                   [--temperature 0.7] [--top-p 0.95] [--logit-scale 12]

Random weights give nearly flat logits: the nucleus of top_p 0.95 is then most of the
vocabulary, which a trained model's rows almost never are. `--logit-scale S` multiplies the final
norm's weight by S (so the logits by S) to get peaked rows; the script prints how many tokens
the nuclei hold and how many rows the fast path decided, and times the flat rows (scale 1) as
well, where every row takes the exact fallback. bf16 on CUDA (`--device cpu`: a smoke run); each figure is the median of
`--reps` CUDA-event timings, all from one run.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

from jetspec_chat.engine.accept import finish_round
from jetspec_chat.bench.engine_only import _prepare_engine, _random_tree, _State
from jetspec_chat.bench.timing import time_fn
from jetspec_chat.engine.graphs import capture
from jetspec_chat.engine.models.loader import load_engine
from jetspec_chat.engine.params import SamplingParams
from jetspec_chat.engine import sampling as sampler
from jetspec_chat.engine.sampling import nucleus_candidates, sample, scaled_logits, uniforms
from jetspec_chat.kernels import (
    nucleus_sample_in_candidates_triton, nucleus_sample_triton, sample_candidates_triton, triton_samples,
)
from jetspec_chat.kernels import sampling as ksampling
from jetspec_chat.kernels.reference import nucleus_mask_ref, nucleus_sample_ref


def sort_based_round(engine, tree, sampling: SamplingParams, generator):
    """The verify step with the sort-based reference sampler, eager after the forward graph."""
    hidden, taps = engine.verify.forward(tree)
    x = scaled_logits(engine.target.logits(hidden), sampling.temperature, sampling.top_k)
    choices = nucleus_sample_ref(x, sampling.top_p, uniforms(tree.size, generator, x.device))[0]
    return finish_round(tree, choices, engine.kv, taps, engine.anchor, engine.verify.draft_append)


def median_ms(fn, setup, reps: int, device) -> float:
    return statistics.median(time_fn(fn, 5, reps, device, setup))


def step_table(engine, state, trees, sampling, generator, reps: int) -> None:
    device = engine.torch_device
    greedy = SamplingParams()
    noop = lambda phase: None  # noqa: E731
    print(f"{'step':>12} {'greedy ms':>10} {'sampling ms':>12} {'ratio':>6} {'sort ref ms':>12} {'ratio':>6}")
    for name, tree, staged in trees:
        g = median_ms(lambda: engine.verify.round(tree, staged, greedy, None, noop), state.restore, reps, device)
        s = median_ms(lambda: engine.verify.round(tree, staged, sampling, generator, noop), state.restore, reps, device)
        r = median_ms(lambda: sort_based_round(engine, tree, sampling, generator), state.restore, reps, device)
        print(f"{name:>12} {g:10.3f} {s:12.3f} {s / g:6.2f} {r:12.3f} {r / g:6.2f}")
        state.restore()


def nucleus_stats(engine, tree, sampling) -> str:
    """Nucleus sizes of the verify(N) rows and the share the fast path decides (the candidates
    kernel on CUDA, the torch top-k form elsewhere)."""
    hidden, _ = engine.verify.forward(tree)
    x = scaled_logits(engine.target.logits(hidden), sampling.temperature, sampling.top_k)
    sizes = nucleus_mask_ref(x, sampling.top_p)[1].sum(-1).tolist()
    if triton_samples(x):
        u = torch.rand(x.shape[0], dtype=torch.float64, device=x.device)
        exact = (sample_candidates_triton(x, sampling.top_p, u, sampler.CANDIDATES)[1] == 0).float().mean().item()
    else:
        exact = nucleus_candidates(x, sampling.top_p).exact.float().mean().item()
    return (f"nucleus tokens per row: median {statistics.median(sizes):.0f}, max {max(sizes)}; "
            f"fast path {exact:.0%} of rows")


def with_setting(name: str, value: int, fn):
    """fn run with kernels/sampling.py's constant `name` set to `value`."""
    def call():
        kept = getattr(ksampling, name)
        setattr(ksampling, name, value)
        try:
            return fn()
        finally:
            setattr(ksampling, name, kept)
    return call


CHUNKS = (1024, 2048, 4096)  # the candidates passes' chunk lengths timed (the shipped one among them)


def kernel_times_us(fn, reps: int) -> dict[str, float]:
    """The mean GPU time of each Triton sampling kernel that fn launches (eagerly, under the
    torch profiler; the kernels alone, without the gaps between launches)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.key.startswith(("_candidates_", "_nucleus_sample_kernel")):
            total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
            out[e.key] = total / reps
    return out


def sampler_table(engine, state, trees, sampling, reps: int) -> None:
    """The choice alone (argmax / sample / sort reference) on the rows' fp32 logits, and parts of
    `sample`: the temperature division, the candidates phase (its four passes over the row at
    several chunk lengths, and the draw), the bisection fallback kernel on every row (at 8 and 16
    warps), each call captured in a CUDA graph; then each kernel of `sample` alone."""
    device = engine.torch_device
    t = torch.tensor(sampling.temperature, dtype=torch.float32, device=device)
    p = torch.tensor(sampling.top_p, dtype=torch.float64, device=device)
    chunks = " / ".join(str(c) for c in CHUNKS)
    print(f"{'rows':>12} {'argmax us':>10} {'sample us':>10} {'sort ref us':>12} {'scale us':>9}"
          f" {'candidates us (chunk ' + chunks + ')':>38} {'fallback us (8 / 16 warps)':>27}")
    pool = torch.cuda.graph_pool_handle()
    for name, tree, _ in trees:
        hidden, _ = engine.verify.forward(tree)
        logits = engine.target.logits(hidden).clone()
        x = scaled_logits(logits, t, sampling.top_k)
        u = torch.rand(logits.shape[0], dtype=torch.float64, device=device)
        every = torch.ones(logits.shape[0], dtype=torch.bool, device=device)
        fns = (lambda: logits.argmax(-1), lambda: sample(logits, t, p, sampling.top_k, u),
               lambda: nucleus_sample_ref(scaled_logits(logits, t, sampling.top_k), p, u)[0],
               lambda: scaled_logits(logits, t, sampling.top_k),
               *(with_setting("CANDIDATE_CHUNK", c, lambda: sample_candidates_triton(x, p, u, sampler.CANDIDATES))
                 for c in CHUNKS),
               with_setting("FALLBACK_WARPS", 8, lambda: nucleus_sample_triton(x, p, u, every)),
               with_setting("FALLBACK_WARPS", 16, lambda: nucleus_sample_triton(x, p, u, every)))
        us = []
        for fn in fns:
            try:
                graph, _ = capture(fn, device, pool)
            except RuntimeError as e:  # say so and go on: the other columns still stand
                print(f"  (a call could not be captured: {str(e).splitlines()[0]})")
                us.append(float("nan"))
                continue
            us.append(median_ms(graph.replay, None, reps, device) * 1e3)
        cands = " / ".join(f"{v:.1f}" for v in us[4:4 + len(CHUNKS)])
        print(f"{name:>12} {us[0]:10.1f} {us[1]:10.1f} {us[2]:12.1f} {us[3]:9.1f}"
              f" {cands:>38} {us[-2]:13.1f} / {us[-1]:11.1f}")
        times = kernel_times_us(lambda: nucleus_sample_in_candidates_triton(x, p, u, sampler.CANDIDATES), reps)
        print(f"{'':>12} kernels alone (us, eager): " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()))
        state.restore()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="random:Qwen/Qwen2.5-Coder-1.5B-Instruct")
    ap.add_argument("--draft-head", default="random:2")
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--logit-scale", type=float, default=12.0)
    ap.add_argument("--candidates", type=int, default=sampler.CANDIDATES, help="the fast path's top logits a row")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the step table (fp32, no graphs)")
    args = ap.parse_args()
    sampler.CANDIDATES = args.candidates
    cuda = args.device.startswith("cuda")
    engine = load_engine(args.model, args.draft_head, device=args.device, dtype="bfloat16" if cuda else "float32")
    device = engine.torch_device
    where = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"{args.model} + {args.draft_head} on {where}, context {args.context}, "
          f"T {args.temperature}, top-p {args.top_p}, top-k {args.top_k}, {args.candidates} candidates")
    _prepare_engine(engine, args.context + max(args.nodes, 1) + 64, 0)
    gen = torch.Generator().manual_seed(0)
    state = _State(engine, args.context, gen)
    state.restore()
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    generator = torch.Generator(device=device).manual_seed(0)
    trees = [("AR step", engine._root, True), (f"verify({args.nodes})", _random_tree(engine, args.nodes, 8, gen), False)]
    norm = engine.target.model.norm.weight
    flat = norm.detach().clone()
    with torch.inference_mode():
        for scale in (args.logit_scale, 1.0):
            norm.copy_(flat * scale)
            print(f"\n== final norm x{scale:g}: {nucleus_stats(engine, trees[1][1], sampling)}")
            state.restore()
            step_table(engine, state, trees, sampling, generator, args.reps)
            if cuda:
                sampler_table(engine, state, trees, sampling, args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())

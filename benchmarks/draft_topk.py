"""The draft's per-depth top-k: the fused kernel (kernels/top_logprobs.py) against torch's
`log_softmax` + `topk`, at the draft's shape (D depths x a 151,936-token vocabulary), CUDA-graphed.

    python3 benchmarks/draft_topk.py [--depths 15,16] [--ks 8,32,64] [--vocab 151936]
                                     [--chunks 2048,4096,8192] [--reps 50]

Each figure is µs per call: a CUDA graph of REPEAT calls back to back (as inside the draft's
graph, launch gaps included), replayed `--reps` times, the median divided by REPEAT. "fp32 in":
the logits cast to fp32 (torch's path, and the fused kernel's input under tensor parallelism);
"bf16 in": the lm_head's output as the draft graph hands it (torch's path casts it first). `same ids` compares each path's ids with the
reference (`top_log_probs_ref`: logit descending, ties to the lower id); torch's topk orders ties
as it likes, so on tied rows it may differ there and only there.
"""
from __future__ import annotations

import argparse

import torch

from jetspec_chat.bench.timing import graphed_us_per_call
from jetspec_chat.kernels import top_log_probs_ref, top_log_probs_triton
from jetspec_chat.kernels.top_logprobs import CHUNK

REPEAT = 20


def torch_top(x: torch.Tensor, k: int):
    top = torch.log_softmax(x, dim=-1).topk(k, dim=-1)
    return top.values, top.indices


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--depths", default="15,16")
    p.add_argument("--ks", default="8,32,64")
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--chunks", default="2048,4096,8192", help="the fused kernel's chunk lengths to time")
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args()
    device = torch.device("cuda")
    chunks = [int(c) for c in args.chunks.split(",")]
    g = torch.Generator(device=device).manual_seed(0)
    print(f"vocab {args.vocab}, {torch.cuda.get_device_name(device)}; µs per call (CUDA graph of {REPEAT}); "
          f"the engine's chunk is {CHUNK}")
    head = f"{'D':>3} {'k':>3} {'in':>5} {'torch µs':>9} " + " ".join(f"{'fused/' + str(c):>11}" for c in chunks)
    print(head + "  same ids (torch, fused)  max |value diff|")
    for depth in (int(d) for d in args.depths.split(",")):
        for k in (int(k) for k in args.ks.split(",")):
            logits = torch.randn(depth, args.vocab, generator=g, device=device) * 3
            for dtype in (torch.float32, torch.bfloat16):
                x = logits.to(dtype)
                want_values, want_ids = top_log_probs_ref(x, k)
                t_torch = graphed_us_per_call(lambda: torch_top(x.float(), k), args.reps, REPEAT)  # .float() of fp32: x itself
                fused = [graphed_us_per_call(lambda c=c: top_log_probs_triton(x, k, chunk=c), args.reps, REPEAT)
                         for c in chunks]
                values, ids = top_log_probs_triton(x, k)
                torch_ids = torch_top(x.float(), k)[1]
                diff = (values - want_values).abs().max().item()
                name = "fp32" if dtype == torch.float32 else "bf16"
                print(f"{depth:>3} {k:>3} {name:>5} {t_torch:9.1f} " + " ".join(f"{t:11.1f}" for t in fused)
                      + f"  same ids: {torch.equal(torch_ids, want_ids)}, {torch.equal(ids, want_ids)}  {diff:.2e}")


if __name__ == "__main__":
    main()

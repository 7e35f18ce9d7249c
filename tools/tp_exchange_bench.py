"""What one rank-sum exchange of a tensor-parallel layer costs on this machine's GPUs.

Run with one process per GPU:
    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
        python -m torch.distributed.run --nproc-per-node 2 tools/tp_exchange_bench.py

A forward of the Qwen3-8B shape makes 72 exchanges (2 a layer) of [rows, 4096] bf16, each
consumed by the next residual add + RMSNorm (`add_rms_norm`, which sums the N partials as it
loads them). This captures 72 back-to-back exchanges in one CUDA graph (as the engine's graphs
hold them) and prints the microseconds per exchange for 1 and 128 rows: the engine's
symmetric-memory exchange with its consumer (`parallel.SymmetricExchange`, slots alternating as
in a forward: the barrier, then the consumer reads the peers' slots in place), the same with a
`torch.stack` of the slots into a local [N, rows, 4096] buffer between the two (the form before
the in-place read), the consumer alone on a local buffer, the barrier alone, the NCCL all-gather
the engine falls back to (`parallel.gather_partials` without an exchange), and for comparison
torch's symmetric-memory one-shot all-reduce where this torch has it (a latency reference only:
its summation order is not the engine's). It first checks that both of the engine's exchanges
hand every rank the same [N, rows, 4096] bits and the consumer the same outputs (prints
"identical: True").
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

EXCHANGES = 72
HIDDEN = 4096
EPS = 1e-6


def graphed_us(fn, reps: int = 20) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    dist.barrier()
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    us = start.elapsed_time(end) * 1e3 / reps / EXCHANGES
    del graph
    return us


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    from jetspec_chat.engine.parallel import SymmetricExchange, gather_partials
    from jetspec_chat.kernels import Partials, add_rms_norm

    results = {}
    exchange = SymmetricExchange(128, HIDDEN, torch.bfloat16, device, dist.group.WORLD.group_name)
    weight = torch.randn(HIDDEN, device=device).to(torch.bfloat16)
    same = True
    for rows in (1, 7, 128):
        resid = torch.randn(rows, HIDDEN, device=device, dtype=torch.bfloat16)
        for slot in (0, 1, 0):
            x = torch.randn(rows, HIDDEN, device=device, dtype=torch.bfloat16) * (rank + 1)
            nccl = gather_partials(x, world)
            want = (nccl.groups, *add_rms_norm(nccl, resid, weight, EPS))
            ours = exchange.gather(x, slot)
            got = (ours.stacked(), *add_rms_norm(ours, resid, weight, EPS))
            exchange.out(rows, slot).copy_(x)
            ours = exchange.gather(exchange.out(rows, slot), slot)
            got_in_place = (ours.stacked(), *add_rms_norm(ours, resid, weight, EPS))
            same = same and all(torch.equal(a, b) and torch.equal(c, b) for a, b, c in zip(got, want, got_in_place))
    results["identical"] = f"{same} (ours, copied in and written in place, vs the NCCL all-gather, 1/7/128 rows)"
    for rows in (1, 128):
        x = torch.randn(rows, HIDDEN, device=device, dtype=torch.bfloat16)
        resid = torch.randn(rows, HIDDEN, device=device, dtype=torch.bfloat16)

        def ours():  # as in the engine: the GEMM has written the partial into `out`
            for i in range(EXCHANGES):
                add_rms_norm(exchange.gather(exchange.out(rows, i % 2), i % 2), resid, weight, EPS)

        results[f"ours + consumer (barrier, the norm reads the peers' slots in place), {rows} rows"] = graphed_us(ours)

        def stacked():
            for i in range(EXCHANGES):
                parts = exchange.gather(exchange.out(rows, i % 2), i % 2)
                add_rms_norm(Partials(parts.stacked(), None, parts.dtype), resid, weight, EPS)

        results[f"  with a stack of the slots before the consumer (the earlier form), {rows} rows"] = graphed_us(stacked)

        def copied_in():  # a MoE block's output is copied into the slot
            for i in range(EXCHANGES):
                add_rms_norm(exchange.gather(x, i % 2), resid, weight, EPS)

        results[f"  the partial copied in first (a MoE block's), {rows} rows"] = graphed_us(copied_in)
        local = Partials(torch.randn(world, rows, HIDDEN, device=device).to(torch.bfloat16), None, torch.bfloat16)

        def consumer_only():
            for _ in range(EXCHANGES):
                add_rms_norm(local, resid, weight, EPS)

        results[f"  the consumer alone on a local [N, rows, H] buffer, {rows} rows"] = graphed_us(consumer_only)

    def barrier_only():
        for _ in range(EXCHANGES):
            exchange.handle.barrier(channel=0)

    results["the barrier alone"] = graphed_us(barrier_only)
    for rows in (1, 128):
        x = torch.randn(rows, HIDDEN, device=device, dtype=torch.bfloat16)
        out = torch.empty(world * rows, HIDDEN, device=device, dtype=torch.bfloat16)

        def all_gather():
            for _ in range(EXCHANGES):
                dist.all_gather_into_tensor(out, x)

        results[f"nccl all-gather, {rows} rows"] = graphed_us(all_gather)
    try:
        import torch.distributed._symmetric_memory as symm_mem

        for rows in (1, 128):
            buf = symm_mem.empty(rows, HIDDEN, device=device, dtype=torch.bfloat16)
            symm_mem.rendezvous(buf, dist.group.WORLD.group_name)
            buf.normal_()

            def one_shot():
                for _ in range(EXCHANGES):
                    torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", dist.group.WORLD.group_name)

            results[f"symm-mem one-shot all-reduce, {rows} rows"] = graphed_us(one_shot)
    except Exception as err:  # a torch without it, or no P2P: say so, keep the NCCL numbers
        results["symm-mem one-shot"] = f"unavailable ({type(err).__name__}: {str(err)[:160]})"
    if rank == 0:
        for what, us in results.items():
            print(f"{what}: " + (f"{us:.2f} us per exchange" if isinstance(us, float) else us), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

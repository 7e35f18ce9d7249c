"""Tensor parallelism on CUDA (CUDA-graphed verify and draft with the exchange inside: symmetric
memory, or NCCL's all-gather): runs only where at least 2 GPUs are. Each case runs in its own
process(es)."""
import json
import os
import subprocess
import sys

import pytest
import torch
from engine_helpers import random_prompt, run_two_ranks, spec_change_rounds

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                reason="needs 2 CUDA GPUs")


def _generate(model: str, *extra: str, env: dict | None = None) -> dict:
    cmd = [sys.executable, "-m", "jetspec_chat", "generate", model, "--tp", "2", "--device", "cuda", "--json",
           "--raw", "--prompt", "Write a function that reverses a list, then explain it.", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "did not exit" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]  # a clean close
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("model", ["random:tiny-qwen3", "random:tiny-qwen3-moe"])
def test_tp2_fp32_is_lossless_against_transformers(model):
    out = _generate(model, "--dtype", "float32", "--budget", "16", "--max-new-tokens", "48", "--check-lossless")
    assert out["lossless"], out


def test_tp2_bf16_speculation_equals_bf16_ar_through_nccl():
    """The same through the NCCL all-gather alone (the exchange where symmetric memory is off)."""
    out = _generate("random:tiny-qwen3-moe", "--dtype", "bfloat16", "--budget", "64", "--max-new-tokens", "64",
                    "--check-lossless=ar", env={**os.environ, "JETSPEC_TP_EXCHANGE": "nccl"})
    assert out["lossless"], out


@pytest.mark.parametrize("model", ["random:tiny-qwen3", "random:tiny-qwen3-moe"])
@pytest.mark.parametrize("budget", [2, 16, 64])
def test_tp2_bf16_speculation_equals_bf16_ar(model, budget):
    """The rank-order sum is row-count invariant: a verified token's bits equal its AR step's."""
    out = _generate(model, "--dtype", "bfloat16", "--budget", str(budget), "--max-new-tokens", "64",
                    "--check-lossless=ar")
    assert out["lossless"], out


@pytest.mark.parametrize("model", ["random:tiny-qwen3", "random:tiny-qwen3-moe"])
def test_tp2_bf16_speculation_equals_bf16_ar_with_a_split_three_layer_head(model):
    """The draft head's layers split over the ranks, several of them (o_proj, MLP, o_proj, ...:
    the exchange's slots alternate inside the draft graph too), between target forwards."""
    out = _generate(model, "--dtype", "bfloat16", "--draft-head", "random:3", "--budget", "32",
                    "--max-new-tokens", "48", "--check-lossless=ar")
    assert out["lossless"], out


def test_tp2_plain_rounds_hold_their_rows_and_drafting_after_them_equals_ar():
    """bf16, CUDA graphs on 2 GPUs: an answer switched live between drafting and plain rounds (spec
    off, and budget 1) for more than a held-rows block of them, then a second turn reusing the
    prefix. Each rank holds its plain rounds' draft-context rows and appends them before its next
    draft forward; a rank whose context lagged would draft another tree than its peer and the
    exchange would mix two trees' sums. Both turns equal plain decoding, token for token."""
    from jetspec_chat.engine import GenerationParams, SpecParams
    from jetspec_chat.engine.tp_launcher import launch

    spec, ar, budget_1 = SpecParams(budget=16, width=4), SpecParams(enabled=False), SpecParams(budget=1)
    engine = launch(2, "random:tiny-qwen3", None, device="cuda", dtype="bfloat16", max_context=2048)

    def answer(prompt, params, changes=None):
        return [t for ev in spec_change_rounds(engine, prompt, params, changes or {}) for t in ev.new_tokens]

    try:
        engine.allocate()
        held_rows = engine.draft_kv.held_rows
        prompt = random_prompt(305, 12)
        mixed = answer(prompt, GenerationParams(max_new_tokens=96, spec=spec),
                       {1: ar, held_rows + 8: spec, held_rows + 10: budget_1, 2 * held_rows + 12: spec})
        second = prompt + mixed + random_prompt(306, 5)
        mixed_2 = answer(second, GenerationParams(max_new_tokens=48, spec=ar), {held_rows + 3: spec})
        engine.reset()
        plain = answer(prompt, GenerationParams(max_new_tokens=96, spec=ar))
        plain_2 = answer(second, GenerationParams(max_new_tokens=48, spec=ar))
    finally:
        engine.close()
    assert mixed == plain and mixed_2 == plain_2, (mixed, plain, mixed_2, plain_2)


def _exchange_rank(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from jetspec_chat.engine.parallel import SymmetricExchange, gather_partials, init_ranks
    from jetspec_chat.kernels import add_rms_norm

    device = torch.device("cuda", rank)
    init_ranks(rank, 2, port, device)
    exchange = SymmetricExchange(64, 256, torch.bfloat16, device, dist.group.WORLD.group_name)
    gen = torch.Generator(device=device).manual_seed(rank)
    weight = torch.randn(256, device=device, generator=gen).to(torch.bfloat16)

    def consumed(parts, resid):
        """The parts as one [N, T, H] tensor and the consumer's outputs (residual add + norm)."""
        return (parts.stacked().clone(), *add_rms_norm(parts, resid, weight, 1e-6))

    def equal(a, b):
        return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))

    same = []
    for rows in (1, 5, 64):
        resid = torch.randn(rows, 256, device=device, dtype=torch.bfloat16, generator=gen)
        for slot in (0, 1, 0, 1):
            x = torch.randn(rows, 256, device=device, dtype=torch.bfloat16, generator=gen)
            want = consumed(gather_partials(x, 2), resid)
            same.append(equal(consumed(exchange.gather(x, slot), resid), want))
            exchange.out(rows, slot).copy_(x)  # as the row-parallel GEMM leaves it: in place
            same.append(equal(consumed(exchange.gather(exchange.out(rows, slot), slot), resid), want))
    # Graphed as in a forward (slots alternating, each consumed by the norm before the next
    # exchange), replayed on new inputs.
    x = torch.zeros(3, 256, device=device, dtype=torch.bfloat16)
    resid = torch.randn(3, 256, device=device, dtype=torch.bfloat16, generator=gen)

    def forward():
        first = add_rms_norm(exchange.gather(x, 0), resid, weight, 1e-6)
        return first, add_rms_norm(exchange.gather(x + 1, 1), resid, weight, 1e-6)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        first, second = forward()
    for _ in range(3):
        x.copy_(torch.randn(3, 256, device=device, dtype=torch.bfloat16, generator=gen))
        graph.replay()
        same.append(equal(first, add_rms_norm(gather_partials(x, 2), resid, weight, 1e-6)))
        same.append(equal(second, add_rms_norm(gather_partials(x + 1, 2), resid, weight, 1e-6)))
    torch.cuda.synchronize()
    if rank == 0:
        torch.save(same, out)
    del graph
    dist.destroy_process_group()


def test_symmetric_exchange_equals_the_all_gather(tmp_path):
    """The symmetric-memory exchange hands every rank the same [N, T, H] bits as the NCCL
    all-gather, and its consumer (residual add + norm, reading the peers' slots in place) gives
    the same bits as on the all-gathered buffer: eagerly (the partial copied in, and already in
    place) and replayed from a CUDA graph (new inputs each replay)."""
    same = run_two_ranks(_exchange_rank, str(tmp_path / "same.pt"))
    assert len(same) == 30 and all(same), same


def split_draft_logp(device: torch.device, shard=None, ranks=None) -> torch.Tensor:
    """bf16 draft log-probs (DraftRunner.logp: CUDA-graphed on the GPU) of a random 3-layer head
    on random context taps, tiny-qwen3 target; with `shard` and `ranks` the rank's part of both,
    its exchange open (symmetric memory where it can)."""
    import gc

    from jetspec_chat.engine.draft_head import DraftKVCache
    from jetspec_chat.engine.graphs import DraftRunner
    from jetspec_chat.engine.model_config import ModelConfig
    from jetspec_chat.engine.models.loader import load_draft_head, load_target
    from jetspec_chat.engine.models.model_sources import resolve_model
    from jetspec_chat.engine.parallel import open_exchange

    source, dtype = resolve_model("random:tiny-qwen3"), torch.bfloat16
    target = load_target(source, device, dtype, shard)
    head, _ = load_draft_head("random:3", source, ModelConfig.from_hf(source.hf_config), device, dtype, shard)
    if ranks is not None:
        open_exchange(target, ranks, 64, dtype, head)
    cache = DraftKVCache(head.cfg, 64, device, dtype)
    taps = torch.randn(6, len(head.cfg.target_layer_ids) * target.cfg.hidden_size, generator=torch.Generator().manual_seed(2))
    anchor = torch.tensor(7, device=device)
    with torch.inference_mode():
        head.append_context(cache, taps.to(device, dtype))
        runner = DraftRunner(head, cache, target, anchor, verify=None)
        logp = [runner.logp(anchor, 3).clone() for _ in range(2)]  # captured, then replayed
    assert torch.equal(logp[0], logp[1])
    del runner  # its graph holds NCCL's captured all-gather: gone before the group is left
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return logp[0].cpu()


def _draft_rank(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from jetspec_chat.engine.parallel import Shard, init_ranks

    device = torch.device("cuda", rank)
    ranks = init_ranks(rank, 2, port, device)
    torch.save(split_draft_logp(device, Shard(rank, 2), ranks), out if rank == 0 else out + ".rank1")
    dist.destroy_process_group()


def test_a_split_draft_head_gives_every_rank_the_same_logits(tmp_path):
    """The draft head's layers split over 2 GPUs (bf16, graphed, the exchange inside): both
    ranks get the same bits (so they build the same tree), close to the whole head's on one GPU
    (the layers' sums add the ranks' partials in another order)."""
    out = str(tmp_path / "draft.pt")
    got = run_two_ranks(_draft_rank, out)
    assert torch.equal(got, torch.load(out + ".rank1"))
    torch.testing.assert_close(got, split_draft_logp(torch.device("cuda", 0)), atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("world", [2, 4])
def test_a_vocabulary_slice_of_the_lm_head_gives_the_whole_lm_heads_bits(world):
    """Each rank's GEMM over its vocabulary rows (bf16, the batch-invariant Triton GEMM) gives
    every logit the bits the whole lm_head gives it, at the Qwen3-8B shape and every row count a
    round uses: the gathered logits are the whole lm_head's."""
    from jetspec_chat.engine.layers import linear

    gen = torch.Generator(device="cuda").manual_seed(0)
    vocab, hidden = 151936, 4096
    weight = (torch.randn(vocab, hidden, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    rows = vocab // world
    for m in (1, 16, 64, 128, 256):
        x = torch.randn(m, hidden, device="cuda", generator=gen).to(torch.bfloat16)
        whole = linear(x, weight)
        for rank in range(world):
            part = linear(x, weight[rank * rows : (rank + 1) * rows])
            assert torch.equal(part, whole[:, rank * rows : (rank + 1) * rows]), (m, rank)

"""Tensor parallelism on the CPU (gloo, 2 processes): the fixed-order reduction, TP=2 logits
against TP=1 on the same weights, lossless generation through the CLI, a dead worker."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from jetspec_chat.engine.errors import WORKER_DIED_EXIT_CODE
from jetspec_chat.engine.parallel import reduce_in_rank_order

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_rank_order_sum_is_row_count_invariant():
    # bf16 partials of 3 ranks: each row's sum is the same bits alone as among 37 rows, and
    # the same as adding the ranks one by one in fp32.
    gen = torch.Generator().manual_seed(0)
    parts = torch.randn(3, 37, 64, generator=gen).to(torch.bfloat16)
    full = reduce_in_rank_order(parts, torch.bfloat16)
    for i in range(37):
        assert torch.equal(reduce_in_rank_order(parts[:, i : i + 1], torch.bfloat16)[0], full[i])
    expected = ((parts[0].float() + parts[1].float()) + parts[2].float()).to(torch.bfloat16)
    assert torch.equal(full, expected)


def _forward_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    from jetspec_chat.engine.kv_cache import PagedKVCache
    from jetspec_chat.engine.model import ForwardBatch

    cfg = model.cfg
    t = tokens.shape[0]
    kv = PagedKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 64, torch.device("cpu"), torch.float32)
    batch = ForwardBatch(tokens, torch.arange(t), torch.ones(t, t, dtype=torch.bool).tril(), 0, causal=True)
    with torch.inference_mode():
        hidden, _ = model(batch, kv)
        return model.logits(hidden)


def _load(name: str):
    from jetspec_chat.engine.models.loader import load_target
    from jetspec_chat.engine.models.model_sources import resolve_model

    return load_target(resolve_model(name), torch.device("cpu"), torch.float32)


MODELS = ("random:tiny-qwen3", "random:tiny-qwen3-moe")
TOKENS = torch.tensor([3, 141, 59, 26, 5, 358, 97, 9])


def _tp_rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    from jetspec_chat.engine.parallel import init_ranks, shard_target

    init_ranks(rank, 2, port, torch.device("cpu"))
    logits = {}
    for name in MODELS:
        model = _load(name)
        shard_target(model, rank, 2)
        logits[name] = _forward_logits(model, TOKENS)
    if rank == 0:
        torch.save(logits, out)
    torch.distributed.destroy_process_group()


def test_tp2_logits_equal_tp1(tmp_path):
    from jetspec_chat.engine.tp_launcher import _free_port

    out = str(tmp_path / "logits.pt")
    port = _free_port()
    ctx = torch.multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_tp_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    got = torch.load(out)
    for name in MODELS:
        want = _forward_logits(_load(name), TOKENS)
        torch.testing.assert_close(got[name], want, rtol=1e-5, atol=1e-5)


def _generate(model: str, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "jetspec_chat", "generate", model, "--tp", "2", "--device", "cpu", "--json",
           "--prompt", "hi", "--raw", "--max-new-tokens", "8", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("model", MODELS)
def test_generate_tp2_is_lossless(model):
    out = _generate(model, "--check-lossless")
    assert out["tp"] == 2 and out["spec"] and out["new_tokens"] == 8
    assert out["lossless"] is True, out


def test_dead_worker_is_one_sentence():
    script = textwrap.dedent("""
        import os, signal
        from jetspec_chat.engine import GenerationParams, load_engine
        engine = load_engine("random:tiny-qwen3", device="cpu", tp=2)
        worker = engine.workers[0]
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        for _ in engine.generate([1, 2, 3], GenerationParams(max_new_tokens=4)):
            pass
        print("not reached")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == WORKER_DIED_EXIT_CODE, proc.stderr[-3000:]
    assert "not reached" not in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if "worker of rank 1" in line]
    assert lines and lines[-1].startswith("error: the tensor-parallel worker of rank 1") and lines[-1].endswith("stopped."), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_bench_engine_only_tp2(tmp_path):
    # Every rank runs the measurements in step; rank 0 reports per-rank weight bytes.
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "jetspec_chat", "bench", "random:tiny-qwen3", "--engine-only", "--tp", "2",
           "--device", "cpu", "--contexts", "32", "--tree-sizes", "1,4", "--round-budget", "4", "--warmup", "1",
           "--reps", "2", "--copy-mib", "8", "--profile-rounds", "0", "--json-out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["options"]["tp"] == 2
    (model,) = report["models"]
    assert model["bars"]["ar_step_ms"] > 0 and model["bars"]["round_ms"] > 0

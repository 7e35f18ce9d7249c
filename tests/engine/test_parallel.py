"""Tensor parallelism on the CPU (gloo, 2 processes): the fixed-order reduction, the lm_head
split by vocabulary, TP=2 logits against TP=1 on the same weights, lossless generation through
the CLI, a dead worker."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from engine_helpers import run_two_ranks

from jetspec_chat.engine.errors import WORKER_DIED_EXIT_CODE
from jetspec_chat.kernels import Partials

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_gpt_oss_is_refused_over_several_ranks():
    from jetspec_chat.engine.model_config import ModelConfig
    from jetspec_chat.engine.models.model_sources import resolve_model
    from jetspec_chat.engine.parallel import check_splits

    cfg = ModelConfig.from_hf(resolve_model("random:tiny-gpt-oss").hf_config)
    check_splits(cfg, 1)
    with pytest.raises(ValueError, match="gpt-oss is not split over several ranks yet; run it with --tp 1"):
        check_splits(cfg, 2)


def test_rank_order_sum_is_row_count_invariant():
    # bf16 partials of 3 ranks: each row's sum is the same bits alone as among 37 rows, and
    # the same as adding the ranks one by one in fp32.
    gen = torch.Generator().manual_seed(0)
    parts = torch.randn(3, 37, 64, generator=gen).to(torch.bfloat16)
    full = Partials(parts, None, torch.bfloat16).sum()
    for i in range(37):
        assert torch.equal(Partials(parts[:, i : i + 1].contiguous(), None, torch.bfloat16).sum()[0], full[i])
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
TIED = "random:tiny-qwen2"  # its lm_head is the embedding
TOKENS = torch.tensor([3, 141, 59, 26, 5, 358, 97, 9])


def test_a_vocabulary_that_does_not_divide_is_refused():
    import dataclasses

    from jetspec_chat.engine.model_config import ModelConfig
    from jetspec_chat.engine.models.model_sources import resolve_model
    from jetspec_chat.engine.parallel import check_splits

    cfg = dataclasses.replace(ModelConfig.from_hf(resolve_model("random:tiny-qwen3").hf_config), vocab_size=511)
    check_splits(cfg, 1)
    with pytest.raises(ValueError, match=r"the vocabulary \(511\) does not split over 2 ranks"):
        check_splits(cfg, 2)


def test_a_vocabulary_slice_keeps_the_gemm_sum_order():
    # Each rank's lm_head GEMM sums every logit in the order the whole lm_head's does (same K
    # blocks and K groups), so the gathered logits are the whole lm_head's bits, for every
    # shipped (vocabulary, hidden) at 2, 4 and 8 ranks.
    from jetspec_chat.engine.model_config import ModelConfig
    from jetspec_chat.engine.models.model_sources import list_random, resolve_model
    from jetspec_chat.kernels.matmul import choose_config

    cfgs = [ModelConfig.from_hf(resolve_model(f"random:{name}").hf_config) for name in list_random()]
    shapes = {(cfg.vocab_size, cfg.hidden_size) for cfg in cfgs}
    assert (151936, 4096) in shapes  # the Qwen3-8B
    for vocab, k in sorted(shapes):
        whole = choose_config(vocab, k)
        for world in (2, 4, 8):
            part = choose_config(vocab // world, k)
            assert (part.block_k, part.num_groups(k)) == (whole.block_k, whole.num_groups(k)), (vocab, k, world)


@pytest.mark.parametrize("name", (*MODELS, TIED))
def test_a_rank_holds_its_vocabulary_rows(name):
    # Untied: a [V/N, H] weight of its own; tied: a view of the whole embedding's rows. The
    # bench's per-rank bytes count the rank's rows.
    from jetspec_chat.bench.moe_bytes import expected_weight_bytes
    from jetspec_chat.engine.parallel import shard_target

    whole = _load(name)
    vocab, hidden = whole.lm_head_weight().shape
    embed = whole.model.embed_tokens.weight
    for rank in range(2):
        part = _load(name)
        shard_target(part, rank, 2)
        w = part.lm_head_weight()
        assert w.shape == (vocab // 2, hidden) and part.cfg.vocab_size == vocab
        assert torch.equal(w, whole.lm_head_weight()[rank * vocab // 2 : (rank + 1) * vocab // 2])
        own = part.model.embed_tokens.weight
        assert own.shape == embed.shape
        if part.lm_head is None:
            assert w.untyped_storage().data_ptr() == own.untyped_storage().data_ptr()  # no copy
        if part.cfg.moe_layers:  # (its bytes count expected experts)
            continue
        saved = expected_weight_bytes(whole, 1) - expected_weight_bytes(part, 1)
        layer_bytes = sum(p.numel() * 4 for p in whole.model.layers.parameters()) - \
            sum(p.numel() * 4 for p in part.model.layers.parameters())
        assert saved == layer_bytes + vocab // 2 * hidden * 4 - (hidden * 4 if part.lm_head is None else 0)


@pytest.mark.parametrize("name", MODELS)
def test_a_rank_loads_only_its_part(name, tmp_path):
    # Shard-on-load (random weights drawn whole and cut; safetensors read by slices) gives the
    # rank exactly the parameters that cutting the whole model gives, and no more.
    from safetensors.torch import save_file

    from jetspec_chat.engine.layers import hf_parameters
    from jetspec_chat.engine.models.loader import load_target
    from jetspec_chat.engine.models.model_sources import resolve_model
    from jetspec_chat.engine.parallel import Shard, shard_target

    source = resolve_model(name)
    whole = _load(name)
    save_file({k: v.contiguous() for k, v in hf_parameters(whole)}, str(tmp_path / "model.safetensors"))
    for rank in range(2):
        want = _load(name)
        shard_target(want, rank, 2)
        random_part = load_target(source, torch.device("cpu"), torch.float32, Shard(rank, 2))
        read_part = build_shard_like(random_part)
        read_part.load_safetensors(tmp_path, shard=Shard(rank, 2))
        for got in (random_part, read_part):
            params, expected = dict(got.named_parameters()), dict(want.named_parameters())
            assert params.keys() == expected.keys()
            for key, value in expected.items():
                assert torch.equal(params[key], value), key
        assert sum(p.numel() for p in random_part.parameters()) < sum(p.numel() for p in whole.parameters())


def _random_head(name: str, shard=None):
    from jetspec_chat.engine.models.loader import load_draft_head
    from jetspec_chat.engine.models.model_sources import resolve_model

    source = resolve_model(name)
    target_cfg = _load(name).cfg
    return load_draft_head("random:2", source, target_cfg, torch.device("cpu"), torch.float32, shard)[0]


@pytest.mark.parametrize("int8", [False, True])
def test_a_rank_holds_its_part_of_the_draft_head(int8, tmp_path):
    # A random head drawn whole and cut, and a head file (int8 too) read and cut, give the rank
    # exactly what cutting the whole head gives: 1/N of each layer's heads and MLP width
    # (q/k/v rows, o_proj and down_proj columns), fc and the norms whole.
    from jetspec_chat.engine.draft_head import load_head_dir
    from jetspec_chat.engine.parallel import Shard, shard_head

    name = "random:tiny-qwen3"
    whole = _random_head(name)
    whole.save(tmp_path, int8=int8)
    for rank in range(2):
        shard = Shard(rank, 2)
        want = _random_head(name)
        shard_head(want, rank, 2)
        cut = load_head_dir(tmp_path, torch.device("cpu"), torch.float32)
        shard_head(cut, rank, 2)
        expected = dict(want.named_parameters())
        for got, reference in ((_random_head(name, shard), expected),
                               (load_head_dir(tmp_path, torch.device("cpu"), torch.float32, shard),
                                dict(cut.named_parameters()))):
            params = dict(got.named_parameters())
            assert params.keys() == reference.keys() and got.cfg == want.cfg
            for key, value in reference.items():
                assert torch.equal(params[key], value), key
        attn, mlp = want.layers[0].self_attn, want.layers[0].mlp
        heads, hd = whole.cfg.num_heads // 2, whole.cfg.head_dim
        w = whole.layers[0].self_attn.qkv_proj.weight
        assert torch.equal(attn.qkv_proj.weight[: heads * hd], w[rank * heads * hd : (rank + 1) * heads * hd])
        assert torch.equal(attn.o_proj.weight, whole.layers[0].self_attn.o_proj.weight[:, rank * heads * hd : (rank + 1) * heads * hd])
        n = whole.cfg.intermediate_size // 2
        assert torch.equal(mlp.down_proj.weight, whole.layers[0].mlp.down_proj.weight[:, rank * n : (rank + 1) * n])
        assert torch.equal(want.fc.weight, whole.fc.weight)
        assert want.cfg.num_kv_heads == whole.cfg.num_kv_heads // 2 and want.cfg.intermediate_size == n


def test_a_draft_head_that_does_not_split_stays_whole():
    import dataclasses

    from jetspec_chat.engine.parallel import Shard, head_shard

    cfg = _random_head("random:tiny-qwen3").cfg  # 4 heads, 2 KV heads, width 128
    assert head_shard(cfg, Shard(1, 2)) == Shard(1, 2)
    assert head_shard(cfg, Shard(1, 4)) is None  # 2 KV heads over 4 ranks
    assert head_shard(dataclasses.replace(cfg, intermediate_size=129), Shard(0, 2)) is None
    assert head_shard(dataclasses.replace(cfg, num_heads=3, num_kv_heads=1), Shard(0, 2)) is None
    whole = _random_head("random:tiny-qwen3")
    kept = _random_head("random:tiny-qwen3", Shard(3, 4))
    assert kept.cfg == whole.cfg
    assert all(torch.equal(a, b) for a, b in zip(kept.parameters(), whole.parameters()))


class _RecordingExchange:
    """Stands in for a SymmetricExchange of one rank: records each exchange's slot, and whether
    its partial was written in place (into the tensor `out_for` handed out)."""

    def __init__(self):
        self.slots, self.in_place, self.handed = [], [], {}

    def fits(self, partial):
        return True

    def out_for(self, x, n, slot):
        self.handed[slot] = torch.full((x.shape[0], n), float("nan"), dtype=x.dtype)
        return self.handed[slot]

    def gather(self, partial, slot):
        self.slots.append(slot)
        handed = self.handed.pop(slot, None)
        self.in_place.append(handed is not None and partial.data_ptr() == handed.data_ptr())
        return Partials(partial[None].contiguous(), None, partial.dtype)


@pytest.mark.parametrize("name", MODELS)
def test_consecutive_exchanges_alternate_slots(name):
    # The symmetric exchange's two buffers are safe with one barrier each only if no two
    # consecutive exchanges use the same slot: o_proj takes slot 0, the MLP / MoE block slot 1,
    # across layers and across forwards. One rank (world 1) runs the exchange path for real.
    from jetspec_chat.engine.parallel import RowParallelLinear, RowParallelMoe, shard_target

    model = _load(name)
    want = _forward_logits(model, TOKENS)
    shard_target(model, 0, 1)
    exchange = _RecordingExchange()
    for module in model.modules():
        if isinstance(module, (RowParallelLinear, RowParallelMoe)):
            module.exchange = exchange
    for _ in range(2):
        assert torch.equal(_forward_logits(model, TOKENS), want)
    assert exchange.slots == [0, 1] * (2 * model.cfg.num_layers)
    # o_proj and a dense MLP's down_proj write their partial in place; a MoE block's is copied in.
    moe = [isinstance(m, RowParallelMoe) for m in model.modules() if isinstance(m, (RowParallelLinear, RowParallelMoe))]
    assert exchange.in_place == [not is_moe for is_moe in moe] * 2


def test_the_draft_head_alternates_slots_and_its_append_exchanges_nothing():
    # A split draft head's forward starts on slot 0 and ends on slot 1 as the target's does, so
    # target and draft forwards may follow each other in any order; its context append (each
    # rank projects its own KV heads) makes no exchange.
    from jetspec_chat.engine.draft_head import DraftKVCache
    from jetspec_chat.engine.graphs import DraftRunner
    from jetspec_chat.engine.parallel import RowParallelLinear, Shard, shard_target

    name = "random:tiny-qwen3"
    model = _load(name)
    head = _random_head(name)
    taps = torch.randn(6, len(head.cfg.target_layer_ids) * model.cfg.hidden_size, generator=torch.Generator().manual_seed(2))

    def draft(head):
        cache = DraftKVCache(head.cfg, 64, torch.device("cpu"), torch.float32)
        with torch.inference_mode():
            head.append_context(cache, taps)
            appended = list(exchange.slots)
            return DraftRunner(head, cache, model, torch.tensor(7), verify=None).logp(torch.tensor(7), 3), appended

    exchange = _RecordingExchange()
    want, _ = draft(head)
    shard_target(model, 0, 1)
    one_rank = _random_head(name, Shard(0, 1))
    for module in one_rank.modules():
        if isinstance(module, RowParallelLinear):
            module.exchange = exchange
    got, appended = draft(one_rank)
    assert appended == []
    assert exchange.slots == [0, 1] * head.cfg.num_layers
    assert exchange.in_place == [True] * (2 * head.cfg.num_layers)
    assert torch.equal(got, want)


def build_shard_like(model):
    """An empty copy of a rank's model (same shapes), to load a checkpoint into."""
    import copy

    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.fill_(float("nan"))
    return other


def _draft_logp(model, name: str, whole_cfg, shard=None) -> tuple[torch.Tensor, int]:
    """The engine's draft log-probs (DraftRunner: the head through the target's lm_head) for a
    random 2-layer head on random context taps, and the head's attention heads on this rank;
    `shard`: the head's layers split as on that rank."""
    from jetspec_chat.engine.draft_head import DraftKVCache
    from jetspec_chat.engine.graphs import DraftRunner
    from jetspec_chat.engine.models.loader import load_draft_head
    from jetspec_chat.engine.models.model_sources import resolve_model

    cpu = torch.device("cpu")
    head, _ = load_draft_head("random:2", resolve_model(name), whole_cfg, cpu, torch.float32, shard)
    cache = DraftKVCache(head.cfg, 64, cpu, torch.float32)
    width = len(head.cfg.target_layer_ids) * whole_cfg.hidden_size
    with torch.inference_mode():
        head.append_context(cache, torch.randn(6, width, generator=torch.Generator().manual_seed(2)))
        logp = DraftRunner(head, cache, model, torch.tensor(7), verify=None).logp(torch.tensor(7), 3)
    return logp, head.cfg.num_heads


def _tp_rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    from jetspec_chat.engine.parallel import Shard, init_ranks, shard_target

    init_ranks(rank, 2, port, torch.device("cpu"))
    logits = {}
    hidden = torch.randn(9, 64, generator=torch.Generator().manual_seed(1))
    for name in (*MODELS, TIED):
        model = _load(name)
        whole_cfg = model.cfg
        shard_target(model, rank, 2)
        logits[name] = _forward_logits(model, TOKENS)
        with torch.inference_mode():  # the gathered lm_head alone, on the same hidden states
            logits[name, "head"] = [model.logits(hidden[:m]) for m in (1, 2, 9)]
        logits[name, "draft"] = _draft_logp(model, name, whole_cfg, Shard(rank, 2))  # its layers split
        logits[name, "whole draft"] = _draft_logp(model, name, whole_cfg)  # as a head that does not split
    if rank == 0:
        torch.save(logits, out)
    torch.distributed.destroy_process_group()


def test_tp2_logits_equal_tp1(tmp_path):
    got = run_two_ranks(_tp_rank, str(tmp_path / "logits.pt"))
    hidden = torch.randn(9, 64, generator=torch.Generator().manual_seed(1))
    for name in (*MODELS, TIED):
        whole = _load(name)
        want = _forward_logits(whole, TOKENS)
        # The forward's row-parallel sums add the ranks' partials in another order: close.
        torch.testing.assert_close(got[name], want, rtol=1e-5, atol=1e-5)
        # The lm_head split by vocabulary and gathered: the whole lm_head's bits.
        with torch.inference_mode():
            for m, logits in zip((1, 2, 9), got[name, "head"]):
                assert logits.dtype == torch.float32 and logits.is_contiguous()
                assert torch.equal(logits, whole.logits(hidden[:m])), (name, m)
        want, heads = _draft_logp(whole, name, whole.cfg)
        # The draft head's layers split like the target's: its row-parallel sums add the ranks'
        # partials in another order, so close; a whole head through the split lm_head: the
        # same bits.
        (split, split_heads), (whole_draft, whole_heads) = got[name, "draft"], got[name, "whole draft"]
        assert (split_heads, whole_heads) == (heads // 2, heads), name
        torch.testing.assert_close(split, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(whole_draft, want), name


def _generate(model: str, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "jetspec_chat", "generate", model, "--tp", "2", "--device", "cpu", "--json",
           "--prompt", "hi", "--raw", "--max-new-tokens", "8", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "did not exit" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]  # a clean close
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("model", (*MODELS, TIED))
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


def test_the_launcher_and_rank_0_reuse_the_resolved_model():
    # --tp 2: the model is resolved once in this process (the launcher's split check and rank 0's
    # load take that source; the worker gets it as JSON), not once by each.
    script = textwrap.dedent("""
        from jetspec_chat.engine import load_engine
        from jetspec_chat.engine.models import model_sources
        calls = []
        resolve = model_sources.resolve_model
        model_sources.resolve_model = lambda model, progress=None: calls.append(model) or resolve(model, progress)
        engine = load_engine("random:tiny-qwen3", device="cpu", tp=2)
        engine.close()
        print("resolved", calls)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resolved ['random:tiny-qwen3']" in proc.stdout, proc.stdout


def test_a_failed_load_ends_its_workers_and_a_retry_works():
    # The load fails on every rank (a depth the head cannot draft): rank 0 raises its own error,
    # no worker is reported dead, none is left running, and the next launch starts afresh.
    script = textwrap.dedent("""
        from jetspec_chat.engine import ConfigError, GenerationParams, load_engine
        try:
            load_engine("random:tiny-qwen3", device="cpu", tp=2, depth=99)
        except ConfigError as err:
            print("load failed:", err)
        engine = load_engine("random:tiny-qwen3", device="cpu", tp=2)
        for _ in engine.generate([1, 2, 3], GenerationParams(max_new_tokens=4)):
            pass
        engine.close()
        print("retried")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "load failed:" in proc.stdout and "retried" in proc.stdout, proc.stdout
    assert "worker of rank" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]


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

"""The CUDA path (Triton attention, CUDA-graphed verify and draft): runs only where a GPU is."""
import contextlib
import warnings

import pytest
import torch
from engine_helpers import assert_launches_per_round, held_rows_scenario, round_launches

from jetspec_chat.engine import ChatSession, GenerationParams, RoundEvent, SamplingParams, SpecParams, load_engine
from jetspec_chat.engine.models.oracle import check_lossless

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]


@pytest.fixture(scope="module", params=["tiny-qwen3", "tiny-qwen3-moe"])
def engine(request):
    """The dense target and the MoE one (fused MoE kernel inside the same graphs)."""
    return load_engine(f"random:{request.param}", None, device="cuda", dtype="float32", max_context=2048)


@pytest.mark.parametrize("budget,width,algo", [(1, 1, "accum_logp"), (2, 2, "accum_logp"), (16, 4, "accum_logp"),
                                               (64, 8, "accum_logp"), (256, 8, "accum_logp"), (16, 1, "chain"),
                                               (64, 8, "adaptive")])
def test_graphed_fp32_is_lossless(engine, budget, width, algo):
    engine.reset()
    params = GenerationParams(max_new_tokens=48, spec=SpecParams(budget=budget, width=width, tree_algo=algo))
    result = list(engine.generate(PROMPT, params))[-1].result
    verdict = check_lossless(engine, PROMPT, result, 48)
    assert verdict["lossless"], verdict


BF16_PROMPTS = [PROMPT, [3, 1, 4, 1, 5, 9, 2, 6] * 9, list(range(40, 240, 3)), [7] * 70]


@pytest.mark.parametrize("model", ["tiny-qwen3", "tiny-qwen2", "tiny-llama", "tiny-qwen3-moe", "tiny-gpt-oss",
                                   "tiny-gemma4"])
def test_bf16_speculation_equals_bf16_ar(model):
    """Batch-invariant kernels: in bf16 (random weights: logits full of near-ties), every greedy
    speculative answer equals the same engine's greedy AR answer token for token, across budgets,
    tree shapes and prompts that put the prefix end anywhere in a 64-key tile."""
    bf16 = load_engine(f"random:{model}", None, device="cuda", dtype="bfloat16", max_context=2048)
    for prompt in BF16_PROMPTS:
        for budget, width, algo in [(4, 2, "accum_logp"), (16, 4, "accum_logp"), (64, 8, "accum_logp"),
                                    (256, 8, "accum_logp"), (16, 1, "chain"), (64, 8, "adaptive")]:
            bf16.reset()
            params = GenerationParams(max_new_tokens=96, spec=SpecParams(budget=budget, width=width, tree_algo=algo))
            result = list(bf16.generate(prompt, params))[-1].result
            verdict = check_lossless(bf16, prompt, result, 96, against="ar", params=params)
            assert verdict["lossless"], (model, len(prompt), budget, algo, verdict)


def test_graphs_serve_every_context_length_and_turn(engine):
    engine.reset()
    s = ChatSession(engine)
    params = GenerationParams(max_new_tokens=40, spec=SpecParams(budget=32, width=4))
    for turn in ("one", "two", "three"):
        events = list(s.send(turn, params))
        ids = s.prompt_ids()
    # a fresh engine state on the final conversation reproduces the last answer
    last = s.messages.pop()
    engine.reset()
    again = list(s.rerun_last(params))[-1].result
    assert again.text == last["content"]
    assert events[0].reused_tokens > 0 and ids


@contextlib.contextmanager
def eager_runners(engine):
    """The same engine without CUDA graphs (exact tree sizes, finish_round run eagerly)."""
    engine.allocate()
    runners = [r for r in (engine.verify, engine.drafter) if r is not None]
    for r in runners:
        r.use_graphs = False
    try:
        yield
    finally:
        for r in runners:
            r.use_graphs = True


@pytest.mark.parametrize("budget,width", [(1, 1), (2, 2), (16, 4), (64, 8), (256, 8)])
def test_graphed_greedy_equals_eager_greedy(engine, budget, width):
    """The greedy verify graph (forward + accept + KV commit + packing + device anchor) gives the
    eager path's tokens."""
    params = GenerationParams(max_new_tokens=48, spec=SpecParams(budget=budget, width=width))
    engine.reset()
    graphed = list(engine.generate(PROMPT, params))[-1].result
    engine.reset()
    with eager_runners(engine):
        eager = list(engine.generate(PROMPT, params))[-1].result
    assert graphed.token_ids == eager.token_ids


@pytest.mark.parametrize("spec", [SpecParams(budget=64, width=8), SpecParams(enabled=False)])
def test_a_graphed_greedy_round_never_syncs_the_stream(engine, spec):
    """After the graphs are captured, a greedy round issues nothing that synchronizes: its one
    packed device->host copy goes into pinned memory in the stream, and the host waits only on
    that copy's event (which the sync debug mode does not flag: cudaEventSynchronize); no
    host->device anchor copy, no host read inside the acceptance."""
    params = GenerationParams(max_new_tokens=40, spec=spec)
    engine.reset()
    list(engine.generate(PROMPT, params))  # captures this answer's graphs
    engine.reset()
    events = engine.generate(PROMPT, params)
    next(events)  # the prefill (it syncs)
    syncs = []
    torch.cuda.set_sync_debug_mode("warn")
    try:
        while True:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                event = next(events)
            if not isinstance(event, RoundEvent):
                break  # the finish event (it syncs for the wall clock)
            syncs.append(sum("synchroniz" in str(w.message) for w in caught))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert syncs and all(n == 0 for n in syncs), syncs


@pytest.mark.parametrize("spec,replays", [(SpecParams(budget=64, width=8), 2), (SpecParams(budget=16, tree_algo="chain"), 2),
                                          (SpecParams(enabled=False), 1)])
def test_a_graphed_greedy_round_launches_only_its_graphs_and_one_copy(engine, spec, replays):
    """After capture, a greedy fixed-shape round is the draft graph's replay (which writes the
    tree into the verify bucket), the verify graph's (which appends the draft context and
    advances the lengths on the device; an AR round holds its row instead, and every held_rows
    AR rounds the held rows' append graph is replayed), and the packed device->host copy: no aten op is
    dispatched outside the replays but that copy (eager fills, staging copies, the context
    append would all show). (An eager Triton launch with no aten op around it would not: none
    is left on this path.)"""
    params = GenerationParams(max_new_tokens=40, spec=spec)
    engine.reset()
    rounds = round_launches(engine, PROMPT, params)
    assert_launches_per_round(rounds, replays, held_rows=None if spec.enabled else engine.draft_kv.held_rows)


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.8, top_k=20, seed=5),
                                      SamplingParams(temperature=0.7, top_p=0.95, seed=5),
                                      SamplingParams(temperature=1.0, seed=5)])
def test_graphed_sampling_is_reproducible_and_equals_eager_sampling(engine, sampling):
    """The sampling verify graph (the sampler, the fallback kernel, acceptance) draws the same
    tokens as the eager path from the same seed (the uniforms of an eager round are the first of
    its bucket's), and the same again."""
    params = GenerationParams(max_new_tokens=32, spec=SpecParams(budget=1), sampling=sampling)
    runs = []
    for _ in range(2):
        engine.reset()
        runs.append(list(engine.generate(PROMPT, params))[-1].result.token_ids)
    engine.reset()
    with eager_runners(engine):
        eager = list(engine.generate(PROMPT, params))[-1].result.token_ids
    assert runs[0] == runs[1] == eager and runs[0]


@pytest.mark.parametrize("spec", [SpecParams(budget=64, width=8), SpecParams(enabled=False)])
def test_a_graphed_sampling_round_draws_its_uniforms_replays_and_copies(engine, spec):
    """Sampling rounds are graphed like greedy ones: the host adds only the draw of the round's
    uniforms, and syncs only for the packed copy."""
    params = GenerationParams(max_new_tokens=40, spec=spec, sampling=SamplingParams(temperature=0.7, top_p=0.95, seed=1))
    engine.reset()
    rounds = round_launches(engine, PROMPT, params)
    assert_launches_per_round(rounds, 2 if spec.enabled else 1, ops=1,
                              held_rows=None if spec.enabled else engine.draft_kv.held_rows)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graphed_batch_decoding_equals_eager_and_greedy(dtype):
    """The data stage's decoder: each step one graph replay, the same tokens as its eager steps
    (bitwise the same kernels), and in fp32 the same answers as transformers greedy."""
    from jetspec_chat.training.batch_decode import BatchDecoder
    from jetspec_chat.engine.models.oracle import reference_greedy

    eng = load_engine("random:tiny-qwen3", "none", device="cuda", dtype=dtype, max_context=512)
    gen = torch.Generator().manual_seed(5)
    ps = [torch.randint(3, eng.target.cfg.vocab_size, (n,), generator=gen).tolist() for n in (7, 1, 19, 12, 40)]

    def run(graphs: bool):
        d = BatchDecoder(eng.target, batch_size=8, max_prompt=64, max_new_tokens=32, stop_ids=eng.stop_token_ids, pad_id=0)
        d.use_graphs = graphs
        first = d.decode(ps)
        return first, d.decode(ps[::-1]), len(d._graphs)

    graphed, graphed_rev, captured = run(True)
    eager, eager_rev, _ = run(False)
    assert captured == 1 and graphed == eager and graphed_rev == eager_rev
    if dtype == "float32":
        assert [ids for ids, _ in graphed] == [reference_greedy(eng, p, 32) for p in ps]


def test_graphed_batch_sampling_runs_inside_the_graph():
    """--self-prompts samples in the captured decode step (Gumbel noise from the default CUDA
    generator): it must capture, and a near-zero temperature must give the greedy answers."""
    from jetspec_chat.training.batch_decode import BatchDecoder

    eng = load_engine("random:tiny-qwen3", "none", device="cuda", dtype="float32", max_context=512)
    gen = torch.Generator().manual_seed(7)
    ps = [torch.randint(3, eng.target.cfg.vocab_size, (n,), generator=gen).tolist() for n in (5, 9, 3)]

    def run(temperature):
        torch.manual_seed(0)
        d = BatchDecoder(eng.target, batch_size=4, max_prompt=16, max_new_tokens=24, stop_ids=eng.stop_token_ids,
                         pad_id=0, temperature=temperature)
        return [ids for ids, _ in d.decode(ps)], len(d._graphs)

    greedy, _ = run(0.0)
    cold, captured = run(1e-4)
    hot, _ = run(1.0)
    assert captured == 1 and cold == greedy
    assert hot != greedy and all(0 <= t < eng.target.cfg.vocab_size for row in hot for t in row)


@pytest.mark.parametrize("model", ["tiny-gpt-oss", "tiny-gemma4"])
def test_windowed_targets_fp32_on_cuda_are_lossless(model):
    """fp32 speculative equals transformers, CUDA-graphed, prompts past the window, for gpt-oss
    (sliding windows of 8 keys, attention sinks, YaRN, its biased MoE through the fused Triton
    kernels) and Gemma 4 (sliding windows of 8 keys, global layers with their own head_dim and
    K = V, the soft-cap, its MoE through the fused Triton kernels beside the dense MLP)."""
    fp32 = load_engine(f"random:{model}", None, device="cuda", dtype="float32", max_context=2048)
    for prompt in (PROMPT, BF16_PROMPTS[1]):
        for budget, width, algo in [(1, 1, "accum_logp"), (16, 4, "accum_logp"), (64, 8, "adaptive"), (16, 1, "chain")]:
            fp32.reset()
            params = GenerationParams(max_new_tokens=48, spec=SpecParams(budget=budget, width=width, tree_algo=algo))
            result = list(fp32.generate(prompt, params))[-1].result
            verdict = check_lossless(fp32, prompt, result, 48)
            assert verdict["lossless"], (model, len(prompt), budget, algo, verdict)


@pytest.mark.parametrize("model", ["tiny-qwen3.5", "tiny-qwen3.5-moe"])
def test_hybrid_targets_on_cuda(model):
    """Qwen3.5 hybrids (Gated DeltaNet + gated attention): fp32 speculative equals transformers;
    bf16 speculative equals the same engine's AR (a node's recurrent step is the AR step's
    arithmetic: kernels/gated_delta.py walks each node's path with the AR step's per-token code,
    batch-invariant linears and attention), both with the greedy rounds CUDA-graphed."""
    fp32 = load_engine(f"random:{model}", None, device="cuda", dtype="float32", max_context=2048)
    for budget, width, algo in [(1, 1, "accum_logp"), (16, 4, "accum_logp"), (64, 8, "adaptive"), (16, 1, "chain")]:
        fp32.reset()
        params = GenerationParams(max_new_tokens=48, spec=SpecParams(budget=budget, width=width, tree_algo=algo))
        result = list(fp32.generate(PROMPT, params))[-1].result
        verdict = check_lossless(fp32, PROMPT, result, 48)
        assert verdict["lossless"], (budget, algo, verdict)
    bf16 = load_engine(f"random:{model}", None, device="cuda", dtype="bfloat16", max_context=2048)
    for prompt in BF16_PROMPTS:
        for budget, width, algo in [(4, 2, "accum_logp"), (16, 4, "accum_logp"), (64, 8, "accum_logp"),
                                    (16, 1, "chain"), (64, 8, "adaptive")]:
            bf16.reset()
            params = GenerationParams(max_new_tokens=64, spec=SpecParams(budget=budget, width=width, tree_algo=algo))
            result = list(bf16.generate(prompt, params))[-1].result
            verdict = check_lossless(bf16, prompt, result, 64, against="ar", params=params)
            assert verdict["lossless"], (model, len(prompt), budget, algo, verdict)
    # The greedy rounds ran as CUDA graphs: the recurrent walk and commit need no host values.
    assert bf16.verify.use_graphs and all(bf16.verify._buckets[size].rounds for size in (16, 64))
    # Graphed rounds (padded buckets) give the eager path's tokens (exact tree sizes); a second
    # turn reuses the committed state (and the answer's rollback inside its last round).
    params = GenerationParams(max_new_tokens=48, spec=SpecParams(budget=16, width=4))
    bf16.reset()
    graphed = list(bf16.generate(BF16_PROMPTS[1], params))[-1].result
    bf16.reset()
    with eager_runners(bf16):
        eager = list(bf16.generate(BF16_PROMPTS[1], params))[-1].result
    assert graphed.token_ids == eager.token_ids
    turn2 = BF16_PROMPTS[1] + list(eager.token_ids) + PROMPT
    second = list(bf16.generate(turn2, params))[-1].result
    assert second.reused_tokens >= len(BF16_PROMPTS[1]) + len(eager.token_ids) - 1
    verdict = check_lossless(bf16, turn2, second, 48, against="ar", params=params)
    assert verdict["lossless"], (model, "second turn", verdict)


def test_ar_rounds_hold_their_rows_and_the_draft_context_equals_the_always_appended_one_bitwise(monkeypatch):
    """bf16, CUDA graphs: AR rounds hold their draft-context rows and append them in one graph
    every held_rows rounds, before a draft forward and before a prefill's append; every draft
    forward sees the whole context, and the context rows are bitwise those of appending in every
    round (the head's GEMMs and row kernels are batch-invariant)."""
    engine = load_engine("random:tiny-qwen3", None, device="cuda", dtype="bfloat16", max_context=2048)
    held_drafts, always_drafts = [], []
    k, v, committed, held = held_rows_scenario(engine, held_drafts, contextlib.nullcontext())
    with monkeypatch.context() as m:
        m.setattr(type(engine), "_holds", property(lambda self: False))
        ref_k, ref_v, ref_committed, _ = held_rows_scenario(engine, always_drafts, contextlib.nullcontext())
    assert ref_committed == committed and held > 0
    assert held_drafts == always_drafts and all(c == d for c, d in held_drafts) and held_drafts, held_drafts
    n = k.shape[1]
    assert torch.equal(k, ref_k[:, :n]) and torch.equal(v, ref_v[:, :n]), (k.float() - ref_k[:, :n].float()).abs().max()
    with torch.inference_mode():
        engine.reset()
        held_rows_scenario(engine, [], contextlib.nullcontext())
        engine.draft_kv.note_advance(engine._append_held())
    assert engine.draft_kv.length == committed
    assert torch.equal(engine.draft_kv.k[:, :committed], ref_k) and torch.equal(engine.draft_kv.v[:, :committed], ref_v)

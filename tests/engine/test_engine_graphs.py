"""The CUDA-graph code path (trees padded to buckets, static buffers, the greedy verify graph
that also accepts, commits and sets the device anchor) run on the CPU with emulated graphs:
the same Python the GPU captures, checked against transformers and against the eager path."""
import itertools

import pytest
import torch
from engine_helpers import (
    OracleDraft,
    assert_launches_per_round,
    emulated_graphs,
    held_rows_scenario,
    hf_greedy,
    hf_model,
    random_prompt,
    round_launches,
    run,
    spec_change_rounds,
    tiny_engine,
)
from jetspec_chat.engine import GenerationParams, RoundEvent, SamplingParams, SpecParams

CONFIGS = [  # (budget, width, depth, algo): buckets 1, 16, 32, 64, 256 and the eager tree builder
    (1, 1, None, "accum_logp"),
    (2, 2, None, "accum_logp"),
    (17, 4, None, "accum_logp"),
    (64, 8, None, "accum_logp"),
    (200, 8, None, "accum_logp"),
    (16, 3, 2, "accum_logp"),
    (32, 1, None, "chain"),
    (64, 8, 5, "adaptive"),
]


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama"])
def test_graph_path_is_lossless_with_long_accepted_paths(name):
    engine = tiny_engine(name)
    prompt = random_prompt(300, 9)
    ref = hf_greedy(name, prompt, 40)
    taus = []
    with emulated_graphs(engine):
        for budget, width, depth, algo in CONFIGS:
            engine.reset()
            with OracleDraft(engine, hf_model(name), error_rate=0.3, seed=budget):
                _, res = run(engine, prompt, max_new_tokens=40, budget=budget, width=width, depth=depth, tree_algo=algo)
            assert res.decoded_ids == ref, (budget, width, depth, algo)
            taus.append(res.mean_accept_length)
    assert max(taus) > 3.0  # long paths were accepted, so padding and the KV commit were exercised


def test_graph_path_rounds_equal_the_eager_rounds_across_spec_changes():
    """Same trees, paths and tokens round by round as the eager path, with the draft head's own
    (context-dependent) drafts: the device anchor and the accepted nodes' taps (read from the
    verify graph's output buffers) must reach the next drafts intact, also across AR rounds
    (spec off, bucket 1) and bucket changes."""
    engine = tiny_engine("tiny-qwen3")
    prompt = random_prompt(301, 11)
    params = GenerationParams(max_new_tokens=48, spec=SpecParams(budget=16, width=4))
    changes = {2: SpecParams(enabled=False), 6: SpecParams(budget=64, width=8), 9: SpecParams(budget=1)}
    eager = spec_change_rounds(engine, prompt, params, changes)
    engine.reset()
    with emulated_graphs(engine):
        graphed = spec_change_rounds(engine, prompt, params, changes)
    assert len(graphed) == len(eager)
    for g, e in zip(graphed, eager):
        assert (g.tree_tokens, g.tree_parents, g.tree_depths, g.accepted_nodes, g.new_tokens) == (
            e.tree_tokens, e.tree_parents, e.tree_depths, e.accepted_nodes, e.new_tokens), g.index
        assert g.tree_scores == pytest.approx(e.tree_scores, abs=1e-4)


@pytest.mark.parametrize("spec,replays", [(SpecParams(budget=16, width=4), 2), (SpecParams(budget=32, tree_algo="chain"), 2),
                                          (SpecParams(budget=200, width=8), 2), (SpecParams(enabled=False), 1)])
def test_a_greedy_round_is_the_graph_replays_and_one_copy(spec, replays):
    """Fixed-shape greedy rounds: the draft graph writes the tree into the verify bucket and the
    verify graph appends the draft context and advances the lengths, so the host issues nothing
    but the replays (draft + verify, or verify alone for an AR round, plus every held_rows AR
    rounds the append of the rows they held) and the one copy."""
    engine = tiny_engine("tiny-qwen3")
    with emulated_graphs(engine):
        rounds = round_launches(engine, random_prompt(302, 10), GenerationParams(max_new_tokens=24, spec=spec))
    assert_launches_per_round(rounds, replays, held_rows=None if spec.enabled else engine.draft_kv.held_rows)


@pytest.mark.parametrize("spec,replays", [(SpecParams(budget=16, width=4), 2), (SpecParams(enabled=False), 1)])
def test_a_sampling_round_is_the_uniforms_the_replays_and_one_copy(spec, replays):
    """Sampling rounds too: the target's samples are taken inside the verify graph, so the host
    adds only the draw of the round's uniforms (the temperature and top_p were written once)."""
    engine = tiny_engine("tiny-qwen3")
    params = GenerationParams(max_new_tokens=24, spec=spec, sampling=SamplingParams(temperature=0.8, top_p=0.9, seed=3))
    with emulated_graphs(engine):
        rounds = round_launches(engine, random_prompt(304, 10), params)
    assert_launches_per_round(rounds, replays, ops=1, held_rows=None if spec.enabled else engine.draft_kv.held_rows)
    assert {op for _, _, ops in rounds for op in ops} == {"aten.rand.generator_out"}



def _draft_context_reference(engine, tokens):
    """The draft cache rows of `tokens`, projected in one eager prefill (chunks' append_context)."""
    engine.reset()
    with torch.inference_mode():
        engine._prefill(tokens)
    d = engine.draft_kv
    return d.k[:, : d.length].clone(), d.v[:, : d.length].clone()


@pytest.mark.parametrize("budget,width,algo", [(64, 8, "accum_logp"), (16, 1, "chain"), (64, 8, "adaptive")])
def test_graph_rounds_append_the_accepted_rows_to_the_draft_context(budget, width, algo):
    """After graphed rounds (long accepted paths from the oracle draft, AR rounds in between),
    the draft cache holds exactly the committed tokens' projected features, at their positions,
    and the host and device lengths agree: the fixed-size append inside the verify graph wrote
    the accepted rows (not the padding, the rejected nodes or the root twice) and advanced the
    device length by the accepted count. The AR rounds hold their rows, which the next drafting
    round's launch appends."""
    engine = tiny_engine("tiny-qwen3")
    prompt = random_prompt(303, 13)
    params = GenerationParams(max_new_tokens=40, spec=SpecParams(budget=budget, width=width, tree_algo=algo))
    lengths, helds = [], []
    with emulated_graphs(engine), OracleDraft(engine, hf_model("tiny-qwen3"), error_rate=0.3, seed=budget):
        for ev in engine.generate(prompt, params):
            if isinstance(ev, RoundEvent):
                kv, d = engine.kv, engine.draft_kv
                lengths.append(((kv.length, d.length), (int(kv.device_length), int(d.device_length)), engine.round_ahead))
                helds.append(d.held)
                if ev.index == 3:
                    engine.update_spec(SpecParams(enabled=False))
                if ev.index == 5:
                    engine.update_spec(params.spec)
        tokens = list(engine.tokens[: engine.kv.length])
        k, v = engine.draft_kv.k[:, : len(tokens)].clone(), engine.draft_kv.v[:, : len(tokens)].clone()
    # The host's lengths follow the device's: at an event, the device has also run the round
    # ahead when there is one, which the host sees at the next event (but for the last round,
    # which ends the answer and may roll back inside itself).
    hosts = [host for host, _, _ in lengths]
    for (host, device, ahead), later in zip(lengths[:-2], hosts[1:-1]):
        assert device == (later if ahead else host), lengths
    assert lengths[-1][:2] == (hosts[-1], hosts[-1]) and not lengths[-1][2], lengths
    assert hosts[-1][0] == hosts[-1][1] and helds[-1] == 0, (lengths, helds)  # the last rounds drafted
    assert max(helds) > 1, helds  # AR rounds held rows
    assert max(b[0] - a[0] for a, b in itertools.pairwise(hosts)) > 3  # long paths were appended
    ref_k, ref_v = _draft_context_reference(engine, tokens)
    torch.testing.assert_close(k, ref_k, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(v, ref_v, rtol=1e-4, atol=1e-4)


def test_ar_rounds_hold_their_rows_and_the_draft_context_equals_the_always_appended_one(monkeypatch):
    """AR rounds on the graph path hold their draft-context rows (one append of the held rows
    every held_rows of them, before a draft forward and before a prefill's append): across live
    spec changes, a rollback into the held rows and a second prompt reusing the prefix, every
    draft forward sees the whole context (draft length == committed length) and the context
    rows equal those of appending in every round."""
    engine = tiny_engine("tiny-qwen3")
    held_drafts, always_drafts = [], []
    k, v, committed, held = held_rows_scenario(engine, held_drafts, emulated_graphs(engine))
    assert held >= 3  # the second prompt's prefill rolled back into them
    with monkeypatch.context() as m:
        m.setattr(type(engine), "_holds", property(lambda self: False))
        ref_k, ref_v, ref_committed, _ = held_rows_scenario(engine, always_drafts, emulated_graphs(engine))
    assert engine.draft_kv.length == ref_committed == committed
    assert held_drafts == always_drafts and all(c == d for c, d in held_drafts), held_drafts
    assert len(held_drafts) > 4
    n = k.shape[1]
    assert n < committed  # rows were still held at the end
    # the same projections of the same taps, 1 row (each AR round) or held_rows at a time
    torch.testing.assert_close(k, ref_k[:, :n], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v, ref_v[:, :n], rtol=1e-5, atol=1e-5)
    # appending the held rows completes the context
    with torch.inference_mode():
        engine.reset()
        held_rows_scenario(engine, [], emulated_graphs(engine))
        engine.draft_kv.note_advance(engine._append_held())
    assert engine.draft_kv.length == committed
    torch.testing.assert_close(engine.draft_kv.k[:, :committed], ref_k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(engine.draft_kv.v[:, :committed], ref_v, rtol=1e-5, atol=1e-5)

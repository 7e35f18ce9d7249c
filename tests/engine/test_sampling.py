"""Sampling with speculation is distribution-preserving and reproducible."""
import contextlib
import itertools

import pytest
import torch
from scipy.stats import chisquare

from engine_helpers import OracleDraft, emulated_graphs, hf_model, random_prompt, run, tiny_engine
from jetspec_chat.engine.sampling import processed_probs
from jetspec_chat.engine.params import SamplingParams

# Tiny models: one intra-op thread (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")

# top_p 0.6 of the top 3: the nucleus drops the third token (or the second) in most steps.
SAMPLING = SamplingParams(temperature=0.7, top_k=3, top_p=0.6)
K_TOKENS = 3


def exact_distribution(name, prompt, sampling=SAMPLING):
    """Probability of every possible first-K_TOKENS answer under plain AR sampling; an answer
    that samples a stop token ends there (the stop token is its last)."""
    model = hf_model(name)
    stops = tiny_engine(name).stop_token_ids
    probs = {}
    frontier = [((), 1.0)]
    with torch.inference_mode():
        for _ in range(K_TOKENS):
            nxt = []
            for seq, p in frontier:
                if seq and seq[-1] in stops:
                    nxt.append((seq, p))
                    continue
                logits = model(torch.tensor([prompt + list(seq)])).logits[0, -1:].float()
                q = processed_probs(logits, sampling)[0]
                for tok in torch.nonzero(q).flatten().tolist():
                    nxt.append((seq + (tok,), p * float(q[tok])))
            frontier = nxt
    for seq, p in frontier:
        probs[seq] = p
    return probs


# tiny-gemma4: its final logit soft-cap (0.5) reshapes the distribution the sampler draws from;
# at temperature 0.1 (no top-p there, to keep enough outcomes) an uncapped sampler fails this test.
@pytest.mark.parametrize("name,budget,error_rate,temperature,top_p,graphs", [
    ("tiny-qwen3", 16, 0.3, SAMPLING.temperature, SAMPLING.top_p, True),
    ("tiny-llama", 4, 0.6, SAMPLING.temperature, SAMPLING.top_p, False),
    ("tiny-gemma4", 16, 0.3, 0.1, 1.0, False),
    ("tiny-qwen3.5", 16, 0.3, SAMPLING.temperature, SAMPLING.top_p, False),  # the recurrent tree verify
])
def test_speculative_sampling_matches_the_target_distribution(name, budget, error_rate, temperature, top_p, graphs):
    """graphs: the CUDA-graph code path (sampling inside the verify graph, emulated on the CPU),
    else the eager one."""
    engine = tiny_engine(name)
    prompt = random_prompt(11, 6)
    sampling = SamplingParams(temperature=temperature, top_k=SAMPLING.top_k, top_p=top_p)
    exact = exact_distribution(name, prompt, sampling)
    counts = dict.fromkeys(exact, 0)
    n = 600
    accepted_deep = 0
    with emulated_graphs(engine) if graphs else contextlib.nullcontext(), \
            OracleDraft(engine, hf_model(name), error_rate=error_rate, seed=1):
        for seed in range(n):
            engine.reset()
            _, res = run(engine, prompt, max_new_tokens=K_TOKENS, budget=budget, width=3,
                         temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, seed=seed)
            counts[tuple(res.decoded_ids[:K_TOKENS])] += 1  # a stop token ends the answer, as above
            accepted_deep += any(n > 1 for n in res.accept_lengths)
    # The draft must actually have been accepted for the test to say anything.
    assert accepted_deep > n // 4
    keys = sorted(exact)
    f_exp = [exact[k] * n for k in keys]
    f_obs = [counts[k] for k in keys]
    # merge rare outcomes so expected counts stay >= 5 (chi-square validity)
    merged_obs, merged_exp, acc_o, acc_e = [], [], 0, 0.0
    for o, e in sorted(zip(f_obs, f_exp), key=lambda t: t[1]):
        acc_o, acc_e = acc_o + o, acc_e + e
        if acc_e >= 5:
            merged_obs.append(acc_o)
            merged_exp.append(acc_e)
            acc_o, acc_e = 0, 0.0
    merged_obs[-1] += acc_o
    merged_exp[-1] += acc_e
    assert len(merged_obs) >= 4
    total = sum(merged_exp)
    merged_exp = [e * n / total for e in merged_exp]  # exact probabilities sum to 1 up to rounding
    p_value = chisquare(merged_obs, merged_exp).pvalue
    assert p_value > 1e-3, (p_value, merged_obs, [round(e, 1) for e in merged_exp])


def test_the_same_test_catches_a_biased_acceptance_rule(monkeypatch):
    """Power check: accepting the draft's top token whenever it is plausible is biased and must fail."""
    import jetspec_chat.engine.engine as engine_mod

    real = engine_mod.target_choices

    def biased(logits, sampling, generator):
        choices = real(logits, sampling, generator)
        return logits.argmax(-1) if torch.rand((), generator=generator) < 0.5 else choices

    monkeypatch.setattr(engine_mod, "target_choices", biased)
    with pytest.raises(AssertionError):
        test_speculative_sampling_matches_the_target_distribution("tiny-qwen3", 16, 0.3, SAMPLING.temperature, SAMPLING.top_p, True)


def test_seed_reproducibility():
    engine = tiny_engine("tiny-qwen3")
    prompt = random_prompt(2, 8)
    outs = []
    for seed in (5, 5, 6):
        engine.reset()
        _, res = run(engine, prompt, max_new_tokens=25, budget=16, temperature=1.0, top_p=0.9, seed=seed)
        outs.append(res.token_ids)
    assert outs[0] == outs[1]
    assert outs[0] != outs[2]

"""Greedy speculative decoding equals transformers' greedy decoding, token for token."""
import pytest

from engine_helpers import TREE_GRID, OracleDraft, hf_greedy, hf_model, random_prompt, run, tiny_engine

# Tiny models: one intra-op thread (a MoE layer is ~10 small GEMMs per forward; on a busy 2-core
# runner extra threads made the MoE model's tests 10x slower).
pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-qwen3-moe", "tiny-gpt-oss", "tiny-gemma4"]


@pytest.mark.parametrize("name", MODELS)
def test_random_head_greedy_equals_transformers(name):
    engine = tiny_engine(name)
    for seed in range(4):
        prompt = random_prompt(seed, 5 + 7 * seed)
        ref = hf_greedy(name, prompt, 24)
        for budget, width, depth, algo in TREE_GRID:
            engine.reset()
            _, res = run(engine, prompt, max_new_tokens=24, budget=budget, width=width, depth=depth, tree_algo=algo)
            assert res.decoded_ids == ref, (seed, budget, width, depth, algo)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("error_rate", [0.2, 0.6])
def test_long_accepted_paths_stay_lossless(name, error_rate):
    """With an oracle draft most of the tree is right: many tokens per round, same output."""
    engine = tiny_engine(name)
    taus = []
    for seed in range(2):
        prompt = random_prompt(100 + seed, 9 + seed)
        ref = hf_greedy(name, prompt, 40)
        for budget, width, depth, algo in TREE_GRID:
            engine.reset()
            with OracleDraft(engine, hf_model(name), error_rate=error_rate, seed=seed):
                _, res = run(engine, prompt, max_new_tokens=40, budget=budget, width=width, depth=depth, tree_algo=algo)
            assert res.decoded_ids == ref, (seed, budget, width, depth, algo)
            if budget >= 16:
                taus.append(res.mean_accept_length)
    # The test only means something if long paths were actually accepted.
    assert max(taus) > 3.0
    assert sum(taus) / len(taus) > 1.8


def test_no_spec_and_spec_share_the_engine():
    engine = tiny_engine("tiny-qwen3")
    prompt = random_prompt(7, 12)
    _, ar = run(engine, prompt, max_new_tokens=30, enabled=False)
    engine.reset()
    _, spec = run(engine, prompt, max_new_tokens=30, budget=32)
    assert ar.token_ids == spec.token_ids
    assert all(n == 1 for n in ar.accept_lengths)


def test_the_oracle_loads_without_progress_bars(monkeypatch, capsys):
    """transformers' "Loading weights" bar would overwrite an answer streamed to the terminal."""
    import dataclasses

    import transformers
    from transformers.utils import logging as hf_logging

    from jetspec_chat.engine.models import oracle

    engine = tiny_engine("tiny-qwen3")
    seen = []

    def from_pretrained(path, dtype=None):
        seen.append(hf_logging.is_progress_bar_enabled())
        for _ in hf_logging.tqdm(range(3), desc="Loading weights"):
            pass
        raise RuntimeError("stop here")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    monkeypatch.setattr(engine, "source", dataclasses.replace(engine.source, path="/nowhere"))
    hf_logging.enable_progress_bar()
    with pytest.raises(RuntimeError, match="stop here"):
        oracle.transformers_model(engine)
    assert seen == [False] and "Loading weights" not in capsys.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # restored afterwards

"""The CUDA path (Triton attention, CUDA-graphed verify and draft): runs only where a GPU is."""
import pytest
import torch

from jetspec_chat.engine import ChatSession, GenerationParams, SpecParams, load_engine
from jetspec_chat.engine.oracle import check_lossless

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]


@pytest.fixture(scope="module")
def engine():
    return load_engine("random:tiny-qwen3", None, device="cuda", dtype="float32", max_context=2048)


@pytest.mark.parametrize("budget,width,algo", [(1, 1, "accum_logp"), (2, 2, "accum_logp"), (16, 4, "accum_logp"),
                                               (64, 8, "accum_logp"), (256, 8, "accum_logp"), (16, 1, "chain"),
                                               (64, 8, "adaptive")])
def test_graphed_fp32_is_lossless(engine, budget, width, algo):
    engine.reset()
    params = GenerationParams(max_new_tokens=48, spec=SpecParams(budget=budget, width=width, tree_algo=algo))
    result = list(engine.generate(PROMPT, params))[-1].result
    verdict = check_lossless(engine, PROMPT, result, 48)
    assert verdict["lossless"], verdict


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

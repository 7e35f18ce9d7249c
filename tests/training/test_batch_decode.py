"""The data stage's batched decoder (jetspec_chat/training/batch_decode.py) answers exactly as single-stream
greedy decoding does: transformers' `generate` on the same weights is the oracle. CPU, fp32,
tiny random targets (q/k norm, qkv bias, plain Llama), prompts of different lengths (left
padding), batches with unused rows, stop tokens."""
import functools

import pytest
import torch

from jetspec_chat.training.batch_decode import BatchDecoder
from jetspec_chat.engine.models.loader import load_engine
from jetspec_chat.engine.models.oracle import reference_greedy


pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def engine(name: str):
    return load_engine(f"random:{name}", "none", device="cpu", dtype="float32", max_context=512)


def prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (7, 1, 19, 12)]


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-qwen2", "tiny-llama", "tiny-qwen3.5"])
def test_batched_answers_equal_single_stream_greedy(name):
    eng = engine(name)
    ps = prompts(eng.target.cfg.vocab_size)
    new = 24
    refs = [reference_greedy(eng, p, new) for p in ps]
    decoder = BatchDecoder(eng.target, batch_size=6, max_prompt=32, max_new_tokens=new,
                           stop_ids=eng.stop_token_ids, pad_id=0)  # 6 rows: two unused
    got = decoder.decode(ps)
    assert [ids for ids, _ in got] == refs
    assert all(finish == ("eos" if len(ids) < new else "length") for ids, finish in got)
    # The decoder is reused across batches (another batch, another width bucket).
    again = decoder.decode(ps[2:3] + ps[:1])
    assert [ids for ids, _ in again] == [refs[2], refs[0]]


def test_stop_tokens_end_each_row_and_are_kept():
    eng = engine("tiny-qwen3")
    ps = prompts(eng.target.cfg.vocab_size)
    refs = [reference_greedy(eng, p, 20) for p in ps]
    stop = refs[0][4]  # a token row 0 produces fifth: row 0 stops there, the others where it first appears
    decoder = BatchDecoder(eng.target, batch_size=4, max_prompt=32, max_new_tokens=20, stop_ids={stop}, pad_id=0)
    got = decoder.decode(ps)
    for (ids, finish), ref in zip(got, refs):
        if stop in ref:
            cut = ref.index(stop)
            assert (ids, finish) == (ref[: cut + 1], "eos")
        else:
            assert (ids, finish) == (ref, "length")
    assert got[0][0][-1] == stop and len(got[0][0]) <= 5


def test_low_temperature_samples_the_argmax_and_bad_batches_are_refused():
    eng = engine("tiny-qwen2")
    ps = prompts(eng.target.cfg.vocab_size)[:2]
    refs = [reference_greedy(eng, p, 12) for p in ps]
    torch.manual_seed(0)
    decoder = BatchDecoder(eng.target, batch_size=2, max_prompt=32, max_new_tokens=12,
                           stop_ids=eng.stop_token_ids, pad_id=0, temperature=1e-4)
    assert [ids for ids, _ in decoder.decode(ps)] == refs
    with pytest.raises(ValueError, match="1..2 prompts"):
        decoder.decode(ps * 2)
    with pytest.raises(ValueError, match="prompts must have"):
        decoder.decode([[5] * 200])

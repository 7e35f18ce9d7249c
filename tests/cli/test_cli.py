"""The non-interactive CLI: `jetspec-chat generate`."""
import json
import subprocess
import sys

import pytest

from jetspec_chat.cli import main

REQUIRED = {"text", "token_ids", "new_tokens", "rounds", "accept_lengths", "mean_accept_length", "seconds",
            "tokens_per_second", "model", "draft_head", "budget", "depth", "width", "tree_algo", "device", "dtype"}


def generate_json(capsys, *args) -> dict:
    code = main(["generate", *args, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_the_default_budget_follows_the_device(capsys):
    """Without --budget, generate takes the app's default for the device: 4 on a CPU, where the
    verify forward is compute-bound (64 would make the 1.5B slower than plain decoding)."""
    out = generate_json(capsys, "random:tiny-qwen3", "--device", "cpu", "--prompt", "hi", "--max-new-tokens", "4")
    assert (out["device"], out["budget"]) == ("cpu", 4)


@pytest.mark.parametrize("budget", [1, 2, 3, 8, 16, 32, 64, 128, 256])
def test_check_lossless_across_budgets(capsys, budget):
    out = generate_json(capsys, "random:tiny-qwen3", "--prompt", "Write a haiku about trees.", "--budget", str(budget),
                        "--max-new-tokens", "32", "--check-lossless")
    assert REQUIRED <= set(out)
    assert out["lossless"] is True and out["first_mismatch"] is None
    assert out["budget"] == budget and out["model"] == "random:tiny-qwen3"
    assert sum(out["accept_lengths"]) + 1 >= out["new_tokens"]  # the first token comes from prefill
    assert out["new_tokens"] == len(out["token_ids"])
    assert out["kv_cache_bytes"] > 0


@pytest.mark.parametrize("model", ["random:tiny-qwen3", "random:tiny-llama"])
def test_check_lossless_against_the_engines_own_ar(capsys, model):
    out = generate_json(capsys, model, "--prompt", "Write a haiku about trees.", "--budget", "16",
                        "--max-new-tokens", "24", "--check-lossless", "ar")
    assert out["lossless"] is True and out["lossless_against"] == "ar"
    assert out["reference_tokens"] == out["new_tokens"] + (out["finish_reason"] == "eos")


def test_generate_with_no_spec_and_tree_options(capsys):
    ar = generate_json(capsys, "random:tiny-llama", "--prompt", "hi", "--no-spec", "--max-new-tokens", "12")
    assert ar["spec"] is False and set(ar["accept_lengths"]) <= {1}
    tree = generate_json(capsys, "random:tiny-llama", "--prompt", "hi", "--budget", "20", "--width", "3",
                         "--depth", "4", "--tree-algo", "adaptive", "--max-new-tokens", "12")
    assert tree["token_ids"] == ar["token_ids"]
    assert (tree["depth"], tree["width"], tree["tree_algo"]) == (4, 3, "adaptive")


def test_no_spec_loads_no_draft_head_and_a_random_head_is_named_in_english(capsys, monkeypatch):
    from jetspec_chat.engine.models import loader

    heads = []
    real = loader.load_draft_head

    def recording(spec, *args):
        head, name = real(spec, *args)
        heads.append(head)
        return head, name

    monkeypatch.setattr(loader, "load_draft_head", recording)
    generate_json(capsys, "random:tiny-qwen3", "--prompt", "hi", "--no-spec", "--max-new-tokens", "2")
    assert heads == [None]  # plain AR: no head built
    out = generate_json(capsys, "random:tiny-qwen3", "--prompt", "hi", "--draft-head", "random", "--max-new-tokens", "2")
    assert out["draft_head"] == "random (1 layer, block 16)"


def test_a_depth_beyond_the_head_fails_before_the_target_loads(capsys, monkeypatch):
    from jetspec_chat.engine.models import loader

    def no_target_load(*args, **kwargs):
        raise AssertionError("the target was loaded before the depth was checked")

    monkeypatch.setattr(loader, "load_target", no_target_load)
    assert main(["generate", "random:tiny-qwen3", "--prompt", "x", "--draft-head", "random", "--depth", "20"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == "error: depth 20 exceeds what the draft head drafts (block_size - 1 = 15)"


def test_sampling_flags_and_seed(capsys):
    args = ["random:tiny-qwen2", "--prompt", "hi", "--temperature", "0.8", "--top-p", "0.9", "--top-k", "50",
            "--seed", "3", "--max-new-tokens", "16"]
    assert generate_json(capsys, *args)["token_ids"] == generate_json(capsys, *args)["token_ids"]


@pytest.mark.parametrize("args,message", [
    (["random:nope", "--prompt", "x"], "random"),
    (["random:tiny-qwen3", "--prompt", "x", "--budget", "0"], "budget"),
    (["random:tiny-qwen3", "--prompt", "x", "--tree-algo", "bogus"], "--tree-algo"),
    (["random:tiny-qwen3", "--prompt", "x", "--temperature", "1", "--check-lossless"], "greedy"),
    (["random:tiny-qwen3", "--prompt", "x", "--draft-head", "/does/not/exist"], "not found"),
    (["random:tiny-qwen3", "--prompt", "  "], "empty"),
])
def test_bad_input_is_one_clear_line(capsys, args, message):
    assert main(["generate", *args]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last and "Traceback" not in err


def test_installed_console_script_streams_text(tmp_path):
    exe = [sys.executable, "-m", "jetspec_chat", "generate", "random:tiny-qwen3", "--max-new-tokens", "8"]
    proc = subprocess.run(exe, input="hello from stdin", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "tokens," in proc.stderr and "tok/s" in proc.stderr

"""Tensor parallelism on CUDA (NCCL, CUDA-graphed verify and draft with the all-gather inside):
runs only where at least 2 GPUs are. Each case runs `generate --tp 2` in its own process."""
import json
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                reason="needs 2 CUDA GPUs")


def _generate(model: str, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "jetspec_chat", "generate", model, "--tp", "2", "--device", "cuda", "--json",
           "--raw", "--prompt", "Write a function that reverses a list, then explain it.", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "did not exit" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]  # a clean close
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("model", ["random:tiny-qwen3", "random:tiny-qwen3-moe"])
def test_tp2_fp32_is_lossless_against_transformers(model):
    out = _generate(model, "--dtype", "float32", "--budget", "16", "--max-new-tokens", "48", "--check-lossless")
    assert out["lossless"], out


@pytest.mark.parametrize("model", ["random:tiny-qwen3", "random:tiny-qwen3-moe"])
@pytest.mark.parametrize("budget", [2, 16, 64])
def test_tp2_bf16_speculation_equals_bf16_ar(model, budget):
    """The rank-order sum is row-count invariant: a verified token's bits equal its AR step's."""
    out = _generate(model, "--dtype", "bfloat16", "--budget", str(budget), "--max-new-tokens", "64",
                    "--check-lossless=ar")
    assert out["lossless"], out

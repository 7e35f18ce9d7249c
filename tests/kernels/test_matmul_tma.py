"""The persistent TMA-fed linear (kernels/matmul_tma.py): it must give bitwise the rows of the
engine's linear (kernels/matmul.py) for the same config, at every M.

On the CPU the kernel runs under the interpreter (its descriptors' loads are masked loads with
zero fill there), against `_linear_kernel`'s fused launch: the same K blocks, groups, fold order,
bias and masking, tile by tile as each persistent program walks them. It is also compiled
offline for sm_90 and its MMA instructions compared with `_linear_kernel`'s (the instruction per
output element is what fixes the bits); the bitwise comparisons at the real shapes run on a GPU.
"""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from sm90 import run_compile_script  # noqa: E402

from jetspec_chat.kernels.matmul import BLOCK_M, TUNED, WIDE_BLOCK_M, LinearConfig, linear_tma, linear_triton, stages_for  # noqa: E402
from jetspec_chat.kernels import matmul_tma  # noqa: E402

CUDA = torch.cuda.is_available()
gpu_only = pytest.mark.skipif(not CUDA or not matmul_tma.available(torch.device("cuda")), reason="needs an sm_90+ GPU")

# (N, K): Qwen2.5-1.5B, Qwen3-8B and Qwen3-30B-A3B dense linears (a few; the benchmark has all).
REAL_SHAPES = {
    "1.5b_qkv": (2048, 1536), "1.5b_down": (1536, 8960), "1.5b_gate_up": (17920, 1536),
    "8b_qkv": (6144, 4096), "8b_o": (4096, 4096), "8b_down": (4096, 12288), "30b_qkv": (5120, 2048),
}


# Small configs for the interpreter: one K group, and three (K = 200: blocks of 32, the last
# ragged, so the copy engine's zero fill is what pads it).
CPU_CONFIGS = [LinearConfig(block_n=32, block_k=32, groups=1), LinearConfig(block_n=32, block_k=32, groups=3)]


@pytest.mark.skipif(CUDA, reason="the interpreter's run (the GPU's is the real-shape test below)")
@pytest.mark.parametrize("config", CPU_CONFIGS, ids=lambda c: f"groups{c.groups}")
def test_tma_kernel_gives_the_fused_launch_bits(config, monkeypatch, ordered_dot, poisoned_alloc):
    """Under the interpreter, linear_tma equals linear_triton's fused launch bitwise at M = 1, 65
    and 200 (ragged tiles of 64 and 128 rows), N = 80 (a ragged last column tile), K = 200, with
    and without a bias, flattened loop or not, and with the grid cut to 1 or 2 programs an SM
    over 3 SMs, so that each program walks several output tiles in turn; every element written. Rows 0
    and 130 sum 2^24, five 0.75s (K blocks 1-5) and -2^24 (block 6), whose fp32 result depends
    on where the groups end (test_matmul_kernel's test_groups_change_the_sum_order): the
    three-group launch gives 2 there, one group 0, groups cut one block early 3."""
    monkeypatch.setattr(matmul_tma, "SMS", 3)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(200, 200, generator=gen)
    w = torch.randn(80, 200, generator=gen) * 200 ** -0.5
    b = torch.randn(80, generator=gen).to(torch.bfloat16)
    for r in (0, 130):
        x[r] = 0.0
        x[r, 0] = x[r, 192] = 4096.0
        x[r, 32:161:32] = 1.0
    w[:, 0], w[:, 192], w[:, 32:161:32] = 4096.0, -4096.0, 0.75
    x, w = x.to(torch.bfloat16), w.to(torch.bfloat16)
    crafted = linear_triton(x[:1], w, config=config, split=False, block_m=BLOCK_M)
    assert (crafted == (2.0 if config.groups == 3 else 0.0)).all(), crafted[0, :4]
    for bias in (None, b):
        for m in (1, 65, 200):
            expect = linear_triton(x[:m], w, bias, config=config, split=False, block_m=BLOCK_M)
            for block_m, pps, flatten in ((BLOCK_M, 2, False), (WIDE_BLOCK_M, 1, True)):
                got = linear_tma(x[:m], w, bias, config=config, block_m=block_m, programs_per_sm=pps, flatten=flatten)
                assert torch.equal(got, expect), f"M={m} block_m={block_m} bias={bias is not None}"


def test_sm90_tma_kernel_runs_the_linears_wgmma():
    """Offline sm_90 compiles: for the 64- and 128-row programs of the rule's and every TUNED
    config, the TMA kernel uses the same warp layout and MMA instruction as `_linear_kernel`
    (test_matmul_kernel pins those: [4 or 8, 1] warps, m64nBLOCK_Nk16), loads through the copy
    engine, and spills nothing."""
    pytest.importorskip("triton.backends.nvidia")
    configs = {(64, 64, 4, 1), (128, 64, 4, 1), (64, 64, 4, 0)}
    for (n, k), c in TUNED.items():
        configs.add((c.block_n, c.block_k, c.num_stages, int(c.num_groups(k) == 1)))
    args = []
    for bn, bk, stages, one in sorted(configs):
        for bm, warps in ((BLOCK_M, 4), (WIDE_BLOCK_M, 8)):
            config = LinearConfig(block_n=bn, block_k=bk, groups=1, num_stages=stages)
            args.append(f"{bm},{bn},{bk},{stages_for(bm, config)},{warps},{one}")
    out = run_compile_script("sm90_tma_compile.py", args)
    assert len(out) == len(args)
    for got in out:
        bn, warps = got["block_n"], got["warps"]
        assert got["mma"] == [[warps, 1, 16, bn, 16]], got
        assert len(got["wgmma"]) == 1 and f"m64n{bn}k16" in got["wgmma"][0], got
        assert got["tma"] and got["local"] == 0, got


@gpu_only
@pytest.mark.parametrize("name", list(REAL_SHAPES))
def test_gpu_tma_rows_match_the_linear_bitwise(name):
    """bf16, random data: linear_tma at M = 1, 65, 128 and 256 (64- and 128-row tiles, 1 or 2
    programs an SM, bias or none) equals linear_triton at the same M, and its rows equal the rows
    linear_triton computes alone (M = 1: the AR step)."""
    n, k = REAL_SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(256, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=gen)
    for bias in (None, b):
        alone = torch.cat([linear_triton(x[r:r + 1], w, bias) for r in range(0, 256, 17)])
        for m in (1, 65, 128, 256):
            ref = linear_triton(x[:m], w, bias)
            for pps in (1, 2):
                out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                got = linear_tma(x[:m], w, bias, out=out, programs_per_sm=pps)
                assert torch.equal(got, ref), f"{name} M={m} pps={pps} bias={bias is not None}"
                rows = list(range(0, m, 17))
                assert torch.equal(got[rows], alone[:len(rows)]), f"{name} M={m}: rows differ from AR"


def test_tma_rule(monkeypatch):
    """use_tma: fused launches of 128-row programs with >= TMA_MIN_TILES output tiles (the
    lm_heads past 64 rows), on a device where the TMA form runs; never the AR step."""
    from jetspec_chat.kernels import matmul

    monkeypatch.setattr(matmul, "tma_available", lambda device: True)
    cuda = torch.device("cuda")

    def picks(m, n, k):
        return matmul.use_tma(m, n, k, matmul.choose_config(n, k), None, cuda)

    assert [picks(m, 151936, 4096) for m in (1, 64, 65, 128, 256)] == [False, False, True, True, True]
    assert not any(picks(m, n, k) for m in (1, 128, 256) for n, k in REAL_SHAPES.values())

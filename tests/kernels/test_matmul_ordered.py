"""The persistent linear whose K groups meet in order (kernels/matmul_ordered.py): it must give
bitwise the rows of the engine's linear (kernels/matmul.py: its fused and split launches) for
the same config, at every M, and leave its tile flags at zero.

On the CPU the kernel runs under TRITON_INTERPRET=1 with one program (the interpreter runs
programs one after another), which walks every work unit in order through the same waits,
workspace round trips and flag resets as the GPU's grid; small shapes and tile configs there.
Offline sm_90 compiles pin its MMA instructions, its flag atomics and its residency bound. The
real shapes and the persistent grid's many programs run on a GPU, after a hang guard.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

from sm90 import run_compile_script  # noqa: E402

from jetspec_chat.kernels import matmul_ordered  # noqa: E402
from jetspec_chat.kernels.matmul import BLOCK_M, TUNED, WIDE_BLOCK_M, LinearConfig, linear_ordered, linear_triton  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
gpu_only = pytest.mark.skipif(not CUDA, reason="needs a GPU")

# Small tiles for the interpreter: K = 200 is 7 blocks of 32 (the last one ragged) in 3 groups of
# at most 3 blocks; N = 80 is 2.5 tiles of 32.
SMALL = LinearConfig(block_n=32, block_k=32, groups=3)
ONE_GROUP = LinearConfig(block_n=32, block_k=32, groups=1)


def randn(*shape, seed, scale=1.0, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=torch.bfloat16)


def problem(m, n, k, seed):
    return randn(m, k, seed=seed), randn(n, k, seed=seed + 1, scale=k ** -0.5), randn(n, seed=seed + 2)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw 16-bit patterns: torch.equal on them also tells -0.0 from +0.0."""
    return t.view(torch.int16)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(bits(a), bits(b))


# ----------------------------------------------------------------------------- CPU (interpreter) and GPU


@pytest.mark.parametrize("config,k", [(SMALL, 200), (SMALL, 192), (ONE_GROUP, 200)], ids=["groups-ragged-k", "groups-even-k", "one-group"])
@pytest.mark.parametrize("block_m", [BLOCK_M, WIDE_BLOCK_M])
def test_bitwise_equal_to_the_linear_launches(config, k, block_m, poisoned_alloc):
    """bf16, M = 70 (a ragged last row tile of either height), N = 80 (a ragged last column tile),
    bias or none: the same 16-bit patterns as linear_triton's fused and split launches. The
    workspace and output start as NaN (poisoned allocations): a group that read a total nobody
    wrote, or an element left unstored, would show."""
    x, w, b = problem(70, 80, k, seed=k + block_m)
    assert config.num_groups(k) == (1 if config is ONE_GROUP else 3)
    for bias in (None, b):
        got = linear_ordered(x, w, bias, config=config, block_m=block_m)
        for split in (False, True):
            ref = linear_triton(x, w, bias, config=config, split=split, block_m=BLOCK_M)
            assert same_bits(got, ref), f"split={split} bias={bias is not None}"


def test_rows_alone_equal_rows_among_many():
    """A row's bits do not depend on M (1, 7, 64, 65, 130: 64- and 128-row programs, one or
    several row tiles) nor on its neighbours: prefixes and single rows equal the full result."""
    x, w, b = problem(130, 80, 200, seed=5)
    full = linear_ordered(x, w, b, config=SMALL)
    for m in (1, 7, 64, 65):
        assert same_bits(linear_ordered(x[:m], w, b, config=SMALL), full[:m]), f"M={m}"
    for r in (0, 63, 64, 129):
        assert same_bits(linear_ordered(x[r:r + 1], w, b, config=SMALL)[0], full[r]), f"row {r} alone"


def test_fp16_strided_weight_view_and_out(poisoned_alloc):
    """fp16; the weight a row slice of a bigger one, the output columns of a wider buffer: the
    linear's bits, and the buffer's other columns untouched."""
    x, big_w, b = (t.half() for t in problem(33, 160, 200, seed=11))
    w, b = big_w[40:120], b[:80]
    wide = torch.zeros(33, 100, dtype=torch.float16, device=DEVICE)
    got = linear_ordered(x, w, b, out=wide[:, 10:90], config=SMALL)
    assert same_bits(got, linear_triton(x, w.contiguous(), b, config=SMALL))
    assert wide[:, :10].eq(0).all() and wide[:, 90:].eq(0).all()


def test_flags_are_back_to_zero_and_a_second_call_is_the_same():
    """Every tile's flag ends at zero (the last group resets it, even from a stale value), so a
    second call (a CUDA-graph replay) starts clean and gives the same bits."""
    x, w, b = problem(70, 80, 200, seed=9)
    tiles = 2 * 3  # 64-row tiles x 32-wide tiles
    flags = matmul_ordered.flags_for(x.device, tiles)
    flags[:tiles] = 7  # stale values where the call's tiles keep theirs
    first = linear_ordered(x, w, b, config=SMALL, block_m=BLOCK_M)
    assert flags[:tiles].eq(0).all(), flags[:tiles]
    second = linear_ordered(x, w, b, config=SMALL, block_m=BLOCK_M)
    assert same_bits(first, second) and flags.eq(0).all()
    assert same_bits(first, linear_triton(x, w, b, config=SMALL))


def test_programs_that_fit_an_sm():
    """The residency bound of the persistent grid: registers in 256-register units per warp,
    shared memory with the driver's 1 KB per program, warps; at least one."""
    # the compiled 64-row, 4-stage program on sm_90 (sm90_ordered_compile.py): 156 regs, 64 KB
    assert matmul_ordered.programs_that_fit(156, 65536, 4) == 3
    # the 128-row program: 155 regs x 8 warps = 40 K of the 64 K registers
    assert matmul_ordered.programs_that_fit(155, 73728, 8) == 1
    assert matmul_ordered.programs_that_fit(40, 16384, 4) == 12  # registers bind: 5 K a program
    assert matmul_ordered.programs_that_fit(32, 0, 1) == 32  # the programs-per-SM cap
    assert matmul_ordered.programs_that_fit(255, 200 * 1024, 8) == 1


def test_sm90_ordered_kernel_runs_the_linears_wgmma_and_orders_its_flags():
    """Offline sm_90 compiles (64- and 128-row programs, 64- and 128-wide tiles, the rule's and a
    TUNED config's stages, even and ragged K, bias): m64nBLOCK_Nk16 wgmma, the very instructions
    `_linear_kernel` compiles to for the same tile; the flags through an acquire compare-and-swap
    and a release exchange at GPU scope; workspace loads that skip L1; no spills; and the
    residency bound the launch takes for its grid (at least one program an SM)."""
    pytest.importorskip("triton.backends.nvidia")
    stages = TUNED[(2048, 1536)].num_stages  # 6
    variants = [(64, 64, 4, 1, 0), (64, 64, stages, 0, 1), (128, 64, 3, 1, 1), (128, 128, 3, 0, 0)]
    out = run_compile_script("sm90_ordered_compile.py", [f"{bm},{bn},64,{st},{even},{bias}" for bm, bn, st, even, bias in variants])
    assert len(out) == len(variants)
    for got in out:
        bn, warps = got["block_n"], 4 * got["block_m"] // 64
        assert got["mma"] == [[warps, 1, 16, bn, 16]], got
        assert got["wgmma"] == [f"m64n{bn}k16"] and got["same_wgmma"], got
        assert "atom.global.acquire.gpu.cas.b32" in got["atomics"], got
        assert "atom.global.gpu.release.exch.b32" in got["atomics"], got
        assert got["bypass_l1"] and got["local"] == 0 and got["shared"] <= 227 * 1024 and got["fit"] >= 1, got


# ----------------------------------------------------------------------------- GPU

# (N, K): every dense linear of Qwen2.5-1.5B, Qwen3-8B and Qwen3-30B-A3B (its experts run in
# kernels/moe.py), as benchmarks/linear_ordered.py times them.
REAL_SHAPES = {
    "1.5b_qkv": (2048, 1536), "1.5b_o": (1536, 1536), "1.5b_gate_up": (17920, 1536), "1.5b_down": (1536, 8960),
    "1.5b_lm_head": (151936, 1536),
    "8b_qkv": (6144, 4096), "8b_o": (4096, 4096), "8b_gate_up": (24576, 4096), "8b_down": (4096, 12288),
    "8b_lm_head": (151936, 4096),
    "30b_qkv": (5120, 2048), "30b_o": (2048, 4096), "30b_lm_head": (151936, 2048),
}
GPU_MS = (1, 16, 64, 128, 256)
# (block_m, block_n, programs_per_sm): speed-only options
GPU_OPTIONS = [(None, None, None), (64, None, 1), (64, None, 2), (128, None, None), (64, 128, None)]

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "linear_ordered.py"


@pytest.fixture(scope="module")
def no_hang():
    """One launch (the 8B qkv at 128 rows: 3 K groups) in a subprocess with a 60-s timeout first:
    a persistent grid that deadlocked would hang this process's GPU context for good."""
    try:
        run = subprocess.run([sys.executable, str(BENCHMARK), "--smoke"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("linear_ordered hung (60 s) on the 8B qkv at M=128")
    assert run.returncode == 0 and run.stdout.strip() == "smoke ok", run.stdout + run.stderr[-3000:]


@gpu_only
@pytest.mark.parametrize("name", list(REAL_SHAPES))
def test_gpu_rows_match_the_linear_bitwise(name, no_hang):
    """bf16, random data: linear_ordered at M = 1, 16, 64, 128 and 256 (64- and 128-row programs,
    64- and 128-wide tiles, 1, 2 or as many programs an SM as fit; bias or none) has the bits of
    linear_triton's fused and split launches at the same M, and its rows equal the rows
    linear_triton computes alone (M = 1: the AR step)."""
    n, k = REAL_SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(256, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=gen)
    for bias in (None, b):
        alone = torch.cat([linear_triton(x[r:r + 1], w, bias, tma=False) for r in range(0, 256, 17)])
        for m in GPU_MS:
            refs = [linear_triton(x[:m], w, bias, split=split, tma=False) for split in (False, True)]
            rows = list(range(0, m, 17))
            for block_m, block_n, pps in GPU_OPTIONS:
                out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                got = linear_ordered(x[:m], w, bias, out=out, block_m=block_m, block_n=block_n, programs_per_sm=pps)
                what = f"{name} M={m} block_m={block_m} block_n={block_n} pps={pps} bias={bias is not None}"
                assert all(same_bits(got, ref) for ref in refs), what
                assert same_bits(got[rows], alone[:len(rows)]), f"{what}: rows differ from AR"
        assert matmul_ordered.flags_for(x.device, 1).eq(0).all(), "flags left raised"


@gpu_only
def test_gpu_cuda_graph_replays(no_hang):
    """Captured in a CUDA graph (flags allocated before the capture), replayed several times on
    new inputs: each replay gives linear_triton's bits, the flags back at zero each time."""
    n, k = 4096, 4096  # 8B o_proj: 5 K groups
    x = torch.randn(128, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    out = torch.empty(128, n, device="cuda", dtype=torch.bfloat16)
    linear_ordered(x, w, out=out)  # allocates the flags, compiles
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        linear_ordered(x, w, out=out)
    for i in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert same_bits(out, linear_triton(x, w)), f"replay {i}"
        assert matmul_ordered.flags_for(x.device, 1).eq(0).all()

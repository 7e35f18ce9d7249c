"""The warp-specialized Gluon linear (kernels/matmul_ws.py): it must give bitwise the rows of the
engine's linear (kernels/matmul.py) for the same config, at every M, split or fused.

Gluon kernels do not run under the CPU interpreter, so on the CPU the kernel is compiled offline
for sm_90 (the MMA instruction per output element, the copy engine, the warp partitions, no
spills); the bitwise comparisons at the real shapes run on an sm_90 GPU.
"""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from sm90 import run_compile_script  # noqa: E402

from jetspec_chat.kernels import matmul, matmul_ws  # noqa: E402
from jetspec_chat.kernels.matmul import linear_partials_triton, linear_triton, linear_ws  # noqa: E402

gpu_only = pytest.mark.skipif(not torch.cuda.is_available() or not matmul_ws.available(torch.device("cuda")),
                              reason="needs an sm_90 GPU and Triton with Gluon")

# (N, K): Qwen2.5-1.5B, Qwen3-8B and Qwen3-30B-A3B dense linears (a few; the benchmark has all).
REAL_SHAPES = {
    "1.5b_qkv": (2048, 1536), "1.5b_down": (1536, 8960), "1.5b_gate_up": (17920, 1536),
    "8b_qkv": (6144, 4096), "8b_o": (4096, 4096), "8b_down": (4096, 12288), "30b_qkv": (5120, 2048),
}


def test_sm90_ws_kernel_compiles_to_partitions_and_the_linears_wgmma():
    """Offline sm_90 compiles of the split and fused (one K group or several) forms with 64- and
    128-row programs and 64-, 128- and 256-wide tiles: m64nBLOCK_Nk16 wgmma, the very
    instructions `_linear_kernel` compiles to for the same tile and launch (forms, shared-memory
    operands, scale and transpose flags, count), TMA loads, warp partitions (register
    reallocation), no spills."""
    pytest.importorskip("triton.experimental.gluon")
    pytest.importorskip("triton.backends.nvidia")
    variants = [(64, 64, 1, 1), (64, 64, 0, 0), (128, 64, 0, 0), (128, 128, 0, 1), (128, 128, 1, 1), (128, 256, 0, 1)]
    args = [f"{bm},{bn},64,{matmul.ws_stages(bm, bn, 64)},{split},{one}" for bm, bn, split, one in variants]
    out = run_compile_script("sm90_ws_compile.py", args)
    assert len(out) == len(args)
    for got in out:
        assert len(got["wgmma"]) == 1 and f"m64n{got['block_n']}k16" in got["wgmma"][0], got
        assert got["same_wgmma"] and got["tma"] and got["partitions"] and got["local"] == 0, got
        assert got["shared"] <= 227 * 1024, got


def test_ws_stages_fill_the_ring_budget():
    assert matmul.ws_stages(64, 64, 64) == matmul.WS_MAX_STAGES
    assert matmul.ws_stages(128, 128, 64) == 6  # 32 KB a slot in 192 KB
    assert matmul.ws_stages(128, 256, 64, programs_per_sm=2) == 2
    assert matmul_ws.max_registers(4) == 256 and matmul_ws.max_registers(8) == 168


@gpu_only
@pytest.mark.parametrize("name", list(REAL_SHAPES))
def test_gpu_ws_rows_match_the_linear_bitwise(name):
    """bf16, random data: linear_ws at M = 1, 16, 65, 128 and 256 (split and fused, 64- and
    128-row programs, 64- and 128-wide tiles, bias or none) equals linear_triton at the same M,
    and its rows equal the rows linear_triton computes alone (M = 1: the AR step)."""
    n, k = REAL_SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(256, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=gen)
    for bias in (None, b):
        alone = torch.cat([linear_triton(x[r:r + 1], w, bias) for r in range(0, 256, 17)])
        for m in (1, 16, 65, 128, 256):
            ref = linear_triton(x[:m], w, bias)
            rows = list(range(0, m, 17))
            for split in (False, True):
                for block_m, block_n in ((64, None), (128, None), (128, 128)):
                    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                    got = linear_ws(x[:m], w, bias, out=out, split=split, block_m=block_m, block_n=block_n)
                    what = f"{name} M={m} split={split} block_m={block_m} block_n={block_n} bias={bias is not None}"
                    assert torch.equal(got, ref), what
                    assert torch.equal(got[rows], alone[:len(rows)]), f"{what}: rows differ from AR"


@gpu_only
@pytest.mark.parametrize("name", ["1.5b_down", "8b_o", "8b_qkv"])
def test_gpu_ws_switch_keeps_the_engine_m_invariant_and_exact(monkeypatch, name):
    """With USE_WS on, the engine's entry points (linear_triton, linear_partials_triton) run the
    warp-specialized form at every M: the same bits as with it off, every row of M = 256 equal to
    the row alone (the AR step), and as close to fp32 arithmetic as cuBLAS."""
    n, k = REAL_SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(256, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    off = {m: linear_triton(x[:m], w) for m in (1, 16, 64, 128, 256)}
    monkeypatch.setattr(matmul, "USE_WS", True)
    for m, ref in off.items():
        assert torch.equal(linear_triton(x[:m], w), ref), m
        got = linear_partials_triton(x[:m], w)
        got = got.sum() if isinstance(got, matmul.Partials) else got
        assert torch.equal(got, ref), m
    full = linear_triton(x, w)
    alone = torch.cat([linear_triton(x[r:r + 1], w) for r in range(256)])
    assert torch.equal(full, alone)
    exact = matmul.linear_ref(x, w).float()
    cublas = torch.nn.functional.linear(x, w).float()
    assert (full.float() - exact).norm() <= 1.05 * (cublas - exact).norm()


@pytest.fixture
def recorded_launches(monkeypatch):
    """Host side, on the CPU: the linear's kernels replaced by recorders of (name, grid, args,
    kwargs), an sm_90 device with Gluon assumed."""
    pytest.importorskip("triton.experimental.gluon")
    launches = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((self.name, grid, args, kw))

    monkeypatch.setattr(matmul_ws, "_linear_ws_kernel", Recorder("ws"))
    monkeypatch.setattr(matmul, "_sum_groups_kernel", Recorder("sum"))
    monkeypatch.setattr(matmul, "_linear_kernel", Recorder("pointer"))
    monkeypatch.setattr(matmul, "ws_available", lambda device: True)
    return launches


def test_switch_routes_every_launch_through_the_ws_kernel(monkeypatch, recorded_launches):
    """Host side, on the CPU (the kernel replaced by a recorder): with USE_WS on and an sm_90
    device assumed, linear_triton launches the warp-specialized kernel with the linear's
    K groups and launch choice (split over the 8B o_proj's 5 groups at M = 1, then the group
    sums; fused at M = 256 in 64-row programs), and linear_partials_triton hands the split
    launch's group sums back unsummed."""
    launches = recorded_launches
    monkeypatch.setattr(matmul, "USE_WS", True)
    n, k = REAL_SHAPES["8b_o"]
    w = torch.zeros(n, k, dtype=torch.bfloat16)
    config = matmul.choose_config(n, k)
    assert config.num_groups(k) == 5

    linear_triton(torch.zeros(1, k, dtype=torch.bfloat16), w)
    (name, grid, args, kw), (sum_name, _, _, sum_kw) = launches
    assert name == "ws" and sum_name == "sum" and sum_kw["GROUPS"] == 5
    assert kw["SPLIT"] and kw["ONE_GROUP"] and kw["BLOCK_M"] == 64 and kw["num_warps"] == 4
    m_arg, group_blocks, k_blocks, items, programs = args[5], args[8], args[9], args[10], args[11]
    assert (m_arg, group_blocks, k_blocks) == (1, config.group_blocks(k), k // 64)
    assert items == 5 * n // 64 and programs == grid[0] == 132

    launches.clear()
    linear_triton(torch.zeros(256, k, dtype=torch.bfloat16), w)
    [(name, grid, args, kw)] = launches
    assert name == "ws" and not kw["SPLIT"] and not kw["ONE_GROUP"] and kw["BLOCK_M"] == 64
    assert args[10] == 4 * n // 64

    launches.clear()
    got = linear_partials_triton(torch.zeros(1, k, dtype=torch.bfloat16), w)
    assert isinstance(got, matmul.Partials) and got.groups.shape == (5, 1, n)
    assert [entry[0] for entry in launches] == ["ws"]


def test_ws_picks_name_linear_ws_options_and_row_ranges():
    """Every measured pick is a valid `linear_ws` launch for a row range, and `ws_pick` finds it
    only inside that range."""
    import inspect
    options = set(inspect.signature(linear_ws).parameters) - {"x", "weight", "bias", "out", "config", "partials"}
    for (n, k), picks in matmul.WS_PICKS.items():
        for pick in picks:
            assert 0 <= pick.after_rows < pick.up_to_rows and set(dict(pick.options)) <= options, (n, k, pick)
            assert matmul.ws_pick(pick.up_to_rows, n, k) == dict(pick.options)
            assert matmul.ws_pick(pick.after_rows, n, k) != dict(pick.options) or pick.after_rows == 0
    assert matmul.ws_pick(256, 1, 1) is None


def test_picks_route_their_rows_through_the_ws_kernel(recorded_launches):
    """Host side (kernels replaced by recorders, an sm_90 device assumed), USE_WS off: the 8B
    down projection at 256 rows takes its pick (split over its K groups in the ws kernel: the
    group sums summed by linear_triton, handed back by linear_partials_triton); at 64 rows it
    keeps the pointer kernel."""
    launches = recorded_launches
    assert not matmul.USE_WS
    n, k = REAL_SHAPES["8b_down"]
    w = torch.zeros(n, k, dtype=torch.bfloat16)
    assert matmul.ws_pick(256, n, k) == {"split": True}

    linear_triton(torch.zeros(256, k, dtype=torch.bfloat16), w)
    assert [launch[0] for launch in launches] == ["ws", "sum"] and launches[0][3]["SPLIT"]
    launches.clear()
    got = linear_partials_triton(torch.zeros(256, k, dtype=torch.bfloat16), w)
    assert isinstance(got, matmul.Partials) and [launch[0] for launch in launches] == ["ws"]
    launches.clear()
    linear_triton(torch.zeros(64, k, dtype=torch.bfloat16), w)
    assert launches and all(launch[0] != "ws" for launch in launches)


@gpu_only
def test_gpu_ws_picks_give_the_linears_bits(monkeypatch):
    """bf16: at every pick's row counts, the engine's entry points (with the pick) equal the
    same calls without picks bitwise, and their rows equal the rows computed alone (AR)."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    for (n, k), picks in matmul.WS_PICKS.items():
        x = torch.randn(256, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
        alone = torch.cat([linear_triton(x[r:r + 1], w) for r in range(0, 256, 37)])
        for pick in picks:
            for m in (pick.after_rows + 1, pick.up_to_rows):
                with_pick = linear_triton(x[:m], w)
                partials = linear_partials_triton(x[:m], w)
                partials = partials.sum() if isinstance(partials, matmul.Partials) else partials
                with monkeypatch.context() as patch:
                    patch.setattr(matmul, "WS_PICKS", {})
                    ref = linear_triton(x[:m], w)
                what = f"({n}, {k}) M={m} {pick.options}"
                assert torch.equal(with_pick, ref) and torch.equal(partials, ref), what
                rows = list(range(0, m, 37))
                assert torch.equal(with_pick[rows], alone[:len(rows)]), f"{what}: rows differ from AR"

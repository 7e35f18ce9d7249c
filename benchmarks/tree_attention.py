"""Paged tree attention alone (bf16, CUDA-graphed): this tree's kernel against a previous one, on
the Qwen2.5-1.5B (12/2 heads) and Qwen3-8B (32/8 heads) shapes, head_dim 128.

The previous kernel is a git revision's `kernels/tree_attention.py` (default main) or a saved
copy of that file (where the GPU machine has no .git: `git show main:kernels/tree_attention.py >
.stage/old_tree_attention.py` here, carried), timed in the same process. Random tree masks in
topological order, a cache of `--capacity` positions laid out as the engine's (blocks in logical
order): this tree's kernel reads it without a block table, and so does the previous one where it
can (block_table=None), else through the identity table (older kernels need one). Both take their split length from the capacity (split_len_for:
the engine's 33,792 gives 576, 8448 gives 256).

Each case is timed twice, per call, between timing events inside one CUDA graph of REPEAT calls:
"hot", the calls back to back (K/V, page table and q stay in L2), and "cold", each call after a
copy of a FLUSH_MB buffer that evicts L2, as in the engine, where each attention follows GEMMs
that stream weights through L2. Medians over 3 replays. "diff" is the largest |new - old| (bf16
outputs; where the split structures differ the bits may too; a broken kernel shows here) and
"same" whether the two outputs are equal bit for bit (a change of speed only must keep it True).

Beside them, cold: `torch.nn.functional.scaled_dot_product_attention` on the flash backend (not
batch-invariant) over the same prefix and new tokens without the tree mask (causal at ctx 0, else
every key visible: the work of a tree whose nodes all see the whole prefix, which is what the
prefix costs), its K/V contiguous [1, kv heads, keys, 128] and GQA through enable_gqa (or K/V
repeated per query head where flash refuses that, marked "x"); and the call's bound, the larger of
its bytes (K/V of prefix + new tokens, q, out) over the device's measured read bandwidth and its
FLOPs (4 * head_dim per visible query-key pair) over its measured bf16 matmul rate (an 8192^3
torch.matmul), both measured at the start of the run.

--sweep times this tree's kernel at MAX_SPLITS 16 / 32 / 64 / 128 on a subset, hot and cold, with
the geometric mean of new/old, and prints the best value (the split length is
max(256, capacity / MAX_SPLITS): at 8448, 576 / 320 / 256 / 256).

--tile-sweep (alone) times the AR call at 16-128 tile programs per KV head (`ar_tile_programs`).

--split-sweep (alone) times this tree's kernel at split lengths 64-576 and 2-4 pipeline stages (the
AR binary's AR_NUM_STAGES for T = 1, NUM_STAGES otherwise), cold, beside the previous kernel at
the same split length.

--merge-sweep (alone) times the AR call, cold, with its merge folding split after split
(AR_SERIAL_SPLITS past any row) and folding blocks of splits side by side at several block sizes
(AR_SPLITS_BLOCK) and warps (AR_MERGE_WARPS), beside the previous kernel; "same" says whether
every variant's output equals the serial merge's bit for bit.

--grid-sweep (alone) times verify calls (T = 16 / 64 / 128 at 512 / 2048 / 8192 keys) and causal
chunks, cold, at SPLIT_PROGRAMS_CAP 4 / 8 / 16 / uncapped (split programs a query tile), beside the
previous kernel; "same" says whether every cap's output equals the uncapped grid's bit for bit.

--verify-merge-sweep (alone) times verify calls (T = 16-256 at 512 / 2048 / 8192 keys), cold, with
their merge loading a row's split states one after another (VERIFY_SERIAL_SPLITS past any row) and
in blocks (VERIFY_SPLITS_BLOCK states, optionally VERIFY_MERGE_MAX_REGISTERS), then as the module
sets it ("default"); "same" says whether every variant's output equals the serial merge's bit
for bit. --shapes / --tokens narrow it.

--v-split-sweep (alone) times the AR call and verify calls (T = 16-256 at 512 / 2048 / 8192 keys),
cold, with V and the output's columns cut in V_SPLIT programs a query tile (each computing the
whole head's scores: half the accumulators, twice the programs) and pipeline depths; "same" says
whether every variant's output equals V_SPLIT 1's bit for bit.

--tail-sweep (alone) times the same calls with a TREE call's tile programs in a launch of their
own (SEPARATE_TAIL_PROGRAMS 0, TAIL_STAGES 1 / 2: a binary without the split programs' registers),
the module's default rule, and the AR binary at AR_NUM_STAGES 1; "same" against the one launch,
bit for bit.

--tma-sweep (alone) times the same calls with the whole prefix tiles loaded through pointers or
through TMA descriptors (TMA_LOADS); "same" against the pointer loads, bit for bit.

--shapes / --tokens keep only those rows of the table (e.g. --shapes 8b --tokens 1,16,64,128).

Runs from the repository root without installing the package.

    python3 benchmarks/tree_attention.py [--old main|FILE] [--capacity 33792] [--shapes 8b] [--tokens 1,64]
        [--sweep | --split-sweep | --tile-sweep | --merge-sweep | --grid-sweep | --verify-merge-sweep
         | --v-split-sweep | --tail-sweep | --tma-sweep] [--json-out FILE]
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import jetspec_chat  # noqa: E402  (the repo's jetspec_chat/; kernels/ joins its path: no install needed)

if str(REPO) not in jetspec_chat.__path__:
    jetspec_chat.__path__.append(str(REPO))

import torch  # noqa: E402

from jetspec_chat.kernels import paged_tree_attention_triton, tree_attention, visible_keys  # noqa: E402
HEADS = {"1.5b": (12, 2), "8b": (32, 8)}
BLOCK_SIZE, HEAD_DIM, REPEAT, REPLAYS, FLUSH_MB = 16, 128, 20, 3, 100
SWEEP_MAX_SPLITS = (16, 32, 64, 128)


@dataclass(frozen=True)
class Case:
    shape: str
    t: int
    context: int
    mask: str = "tree"


def cases() -> list[Case]:
    out = [Case(s, t, c) for s in HEADS for t in (1, 16, 64, 128, 256) for c in (512, 2048, 8192)]
    out += [Case(s, 64, 4090) for s in HEADS]  # rows straddle 4096 keys
    out += [Case(s, 512, c, "causal") for s in HEADS for c in (0, 3000)]
    return out


SWEEP_CASES = [Case(s, 1, c) for s in HEADS for c in (512, 2048, 8192)] + [
    Case(s, t, c) for s in HEADS for t, c in ((16, 512), (64, 512), (16, 4096), (256, 4096))]


def load_old(rev_or_file: str):
    """The previous kernel: a saved copy of its file, or a git revision (read with git show)."""
    if Path(rev_or_file).is_file():
        src = Path(rev_or_file).read_text()
    else:
        src = subprocess.run(["git", "show", f"{rev_or_file}:kernels/tree_attention.py"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "old_tree_attention.py"
    # Its relative imports (.reference, .launch, .key_order, ...) from this tree's package.
    path.write_text(re.sub(r"^from \.(\w+) import", r"from jetspec_chat.kernels.\1 import", src, flags=re.M))
    spec = importlib.util.spec_from_file_location("old_tree_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tree_mask(t: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    if kind == "causal":
        return torch.ones(t, t, dtype=torch.bool).tril()
    mask = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):  # random tree, topological order, depth grows like a real draft tree
        mask[i, i] = True
        if i:
            mask[i] |= mask[int(torch.randint(max(0, i - 8), i, (), generator=gen))]
    return mask


class Inputs:
    def __init__(self, case: Case, capacity: int, old, gen: torch.Generator):
        n_heads, n_kv = HEADS[case.shape]
        blocks = -(-max(capacity, case.context + case.t + BLOCK_SIZE) // BLOCK_SIZE)
        self.k = torch.randn(blocks, BLOCK_SIZE, n_kv, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        self.v = torch.randn_like(self.k)
        # The previous kernel reads the cache as this one does (no table) where it can, else through
        # the identity table (older kernels need one).
        takes_none = "block_table: torch.Tensor | None" in inspect.getsource(old.paged_tree_attention_triton)
        self.table = None if takes_none else torch.arange(blocks, device="cuda", dtype=torch.int32)
        self.q = torch.randn(case.t, n_heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        mask = tree_mask(case.t, case.mask, gen).cuda()
        self.keys = visible_keys(mask, shared=case.mask == "causal")  # as the engine passes them
        # The previous kernel's own mask form (its VisibleKeys class, or the older packed bits).
        if hasattr(old, "visible_keys") and "shared" in inspect.signature(old.visible_keys).parameters:
            self.old_keys = old.visible_keys(mask, shared=case.mask == "causal")
        else:
            self.old_keys = old.visible_keys(mask) if hasattr(old, "visible_keys") else old.pack_tree_mask(mask)
        self.prefix = torch.tensor([case.context], dtype=torch.int32, device="cuda")
        self.out = torch.empty_like(self.q)
        self.split_len = None  # None: both kernels derive it from the capacity

    def new(self) -> torch.Tensor:
        return paged_tree_attention_triton(self.q, self.k, self.v, None, self.prefix, self.keys,
                                           HEAD_DIM**-0.5, split_len=self.split_len, out=self.out)

    def old(self, module) -> torch.Tensor:
        return module.paged_tree_attention_triton(self.q, self.k, self.v, self.table, self.prefix, self.old_keys,
                                                  HEAD_DIM**-0.5, split_len=self.split_len, out=self.out)


class Sdpa:
    """The vendor reference at a case's shape: flash SDPA over the prefix and the new tokens (no
    tree mask; causal at ctx 0), q [1, heads, T, 128], K/V [1, kv heads, keys, 128] contiguous."""

    def __init__(self, case: Case, x: Inputs):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        n_heads, n_kv = HEADS[case.shape]
        keys = case.context + case.t
        self.q = x.q.transpose(0, 1).unsqueeze(0).contiguous()
        self.k, self.v = (p.view(-1, n_kv, HEAD_DIM)[:keys].permute(1, 0, 2).unsqueeze(0).contiguous()
                          for p in (x.k, x.v))
        self.causal = case.context == 0
        self.context = lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)
        self.gqa = True
        try:
            self()
        except RuntimeError:  # flash without GQA here: K/V repeated per query head
            self.k, self.v = (t.repeat_interleave(n_heads // n_kv, dim=1) for t in (self.k, self.v))
            self.gqa = False
            self()

    def __call__(self) -> torch.Tensor:
        with self.context():
            return torch.nn.functional.scaled_dot_product_attention(
                self.q, self.k, self.v, is_causal=self.causal, enable_gqa=self.gqa and self.k.shape[1] != self.q.shape[1])


@dataclass(frozen=True)
class Ceilings:
    read_bytes_per_s: float
    matmul_flop_per_s: float

    @staticmethod
    def measure() -> "Ceilings":
        """A 1 GiB bf16 sum (read bandwidth) and an 8192^3 bf16 matmul (FLOP rate), this device."""
        src = torch.randn(1 << 29, device="cuda", dtype=torch.bfloat16)
        read = src.numel() * 2 / (per_call_us(lambda: torch.sum(src, dtype=torch.float32), None) * 1e-6)
        del src
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn_like(a)
        rate = 2 * 8192**3 / (per_call_us(lambda: a @ b, None) * 1e-6)
        return Ceilings(read, rate)

    def bound_us(self, case: Case, x: Inputs) -> float:
        """max(bytes / read bandwidth, FLOPs / matmul rate) of one call, µs."""
        n_heads, n_kv = HEADS[case.shape]
        kv_bytes = (case.context + case.t) * n_kv * HEAD_DIM * 2 * 2
        qo_bytes = case.t * n_heads * HEAD_DIM * 2 * 2
        pairs = case.t * case.context + int(x.keys.count.sum())  # visible (query token, key) pairs
        flops = 4 * HEAD_DIM * n_heads * pairs
        return max((kv_bytes + qo_bytes) / self.read_bytes_per_s, flops / self.matmul_flop_per_s) * 1e6


class Flush:
    """A FLUSH_MB device-to-device copy: more than the L2 (H100 50 MB, H200 60 MB), so it evicts it."""

    def __init__(self):
        self.src = torch.ones(FLUSH_MB << 20, dtype=torch.uint8, device="cuda")
        self.dst = torch.empty_like(self.src)

    def __call__(self) -> None:
        self.dst.copy_(self.src)


def per_call_us(fn, flush: Flush | None) -> float:
    """Median µs of one call of fn, from timing events around each of REPEAT calls captured in one
    CUDA graph (a flush before each call, outside its events, when given), over REPLAYS replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile, allocator pools
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    starts = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(REPEAT)]
    ends = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(REPEAT)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for start, end in zip(starts, ends):
            if flush is not None:
                flush()
            start.record()
            fn()
            end.record()
    graph.replay()
    samples = []
    for _ in range(REPLAYS):
        graph.replay()
        torch.cuda.synchronize()
        samples += [start.elapsed_time(end) * 1e3 for start, end in zip(starts, ends)]
    return statistics.median(samples)


def hot_cold(fn, flush: Flush) -> tuple[float, float]:
    return per_call_us(fn, None), per_call_us(fn, flush)


def compiled_info() -> str:
    """Registers / spills of the compiled attention kernels (Triton internals: best effort)."""
    try:
        lines = []
        for entry in tree_attention._tree_attn_kernel.device_caches.values():
            for kernel in entry[0].values():
                md = kernel.metadata
                lines.append(f"  stages {md.num_stages} warps {md.num_warps}: {kernel.n_regs} regs, "
                             f"{kernel.n_spills} spills, {md.shared} B smem")
        return "\n".join(sorted(set(lines)))
    except Exception as exc:  # noqa: BLE001 - diagnostics only
        return f"  (no compile info: {exc!r})"


def run_table(old, capacity: int, flush: Flush, json_rows: list, shapes: list[str], tokens: list[int] | None) -> None:
    gen = torch.Generator().manual_seed(0)
    ceil = Ceilings.measure()
    print(f"ceilings: read {ceil.read_bytes_per_s / 1e12:.2f} TB/s, bf16 matmul {ceil.matmul_flop_per_s / 1e12:.0f} TFLOP/s")
    print(f"µs per call (events around each of {REPEAT} calls in a CUDA graph, median of {REPLAYS} replays); "
          f"hot: back to back, cold: after a {FLUSH_MB} MB copy; sdpa: flash, cold; bound: see the docstring")
    print(f"{'shape':>5} {'T':>4} {'ctx':>6} {'mask':>6} {'old hot':>8} {'new hot':>8} {'new/old':>7}"
          f" {'old cold':>8} {'new cold':>8} {'new/old':>7} {'sdpa':>8} {'bound':>7} {'new/bnd':>7} {'sdpa/bnd':>8}"
          f" {'diff':>8} {'same':>5}")
    for case in cases():
        if case.shape not in shapes or (tokens is not None and case.t not in tokens):
            continue
        x = Inputs(case, capacity, old, gen)
        new_out = x.new().clone()
        old_out = x.old(old)
        diff = (new_out.float() - old_out.float()).abs().max().item()
        same = torch.equal(new_out, old_out)
        old_hot, old_cold = hot_cold(lambda: x.old(old), flush)
        new_hot, new_cold = hot_cold(x.new, flush)
        sdpa = Sdpa(case, x)
        sdpa_cold = per_call_us(sdpa, flush)
        bound = ceil.bound_us(case, x)
        print(f"{case.shape:>5} {case.t:>4} {case.context:>6} {case.mask:>6} {old_hot:8.1f} {new_hot:8.1f} "
              f"{new_hot / old_hot:7.2f} {old_cold:8.1f} {new_cold:8.1f} {new_cold / old_cold:7.2f} "
              f"{sdpa_cold:7.1f}{' ' if sdpa.gqa else 'x'} {bound:7.1f} {new_cold / bound:7.2f} {sdpa_cold / bound:8.2f}"
              f" {diff:8.1e} {str(same):>5}", flush=True)
        json_rows.append({**asdict(case), "old_hot_us": old_hot, "new_hot_us": new_hot, "old_cold_us": old_cold,
                          "new_cold_us": new_cold, "sdpa_cold_us": sdpa_cold, "sdpa_gqa": sdpa.gqa,
                          "bound_us": bound, "max_abs_diff": diff, "same_bits": same})
        del sdpa, x


@contextmanager
def knobs(**values):
    """The kernel module's constants (speed knobs) set to `values` inside the block, restored after."""
    saved = {name: getattr(tree_attention, name) for name in values}
    for name, value in values.items():
        setattr(tree_attention, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(tree_attention, name, value)


def geomean(ratios: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(r) for r in ratios))


def run_sweep(old, capacity: int, flush: Flush) -> dict:
    gen = torch.Generator().manual_seed(1)
    inputs = [(c, Inputs(c, capacity, old, gen)) for c in SWEEP_CASES]
    old_us = [hot_cold(lambda x=x: x.old(old), flush) for _, x in inputs]
    default = tree_attention.MAX_SPLITS
    results = []
    print(f"\nsweep of MAX_SPLITS: geometric mean of new/old (hot, cold), then µs hot/cold per case\n  cases: "
          + ", ".join(f"{c.shape} T={c.t} ctx={c.context}" for c, _ in inputs))
    for max_splits in SWEEP_MAX_SPLITS:
        with knobs(MAX_SPLITS=max_splits):
            us = [hot_cold(x.new, flush) for _, x in inputs]
        hot = geomean([u[0] / o[0] for u, o in zip(us, old_us)])
        cold = geomean([u[1] / o[1] for u, o in zip(us, old_us)])
        results.append({"max_splits": max_splits, "hot": hot, "cold": cold, "us": us})
        print(f"  MAX_SPLITS {max_splits:>3}: {hot:.3f} {cold:.3f}  " + " ".join(f"{h:.1f}/{c:.1f}" for h, c in us))
    print("  old kernel:     1.000 1.000  " + " ".join(f"{h:.1f}/{c:.1f}" for h, c in old_us))
    best = min(results, key=lambda r: r["cold"])
    print(f"best cold (new/old {best['cold']:.3f}; now {default}): MAX_SPLITS = {best['max_splits']}")
    return {"old_us": old_us, "results": results}


SPLIT_SWEEP_LENS = (64, 128, 256, 576)
SPLIT_SWEEP_STAGES = (2, 3, 4)


def run_split_sweep(old, capacity: int, flush: Flush) -> list:
    """Split length x pipeline stages: the AR call (T = 1) at short and long contexts, and verify
    calls, cold (µs), this tree's kernel beside the previous one at the same split length."""
    gen = torch.Generator().manual_seed(2)
    rows = []
    print(f"\nsplit sweep (capacity {capacity}): cold µs; "
          "old = the previous kernel at the same split length")
    ar = [Case(s, 1, c) for s in HEADS for c in (0, 256, 512, 1024, 2048, 8192)]
    verify = [Case(s, t, c) for s in HEADS for t in (16, 64, 128) for c in (512, 2048, 4096)]
    for case in ar + verify:
        x = Inputs(case, capacity, old, gen)
        line = []
        for split_len in SPLIT_SWEEP_LENS:
            x.split_len = split_len
            knob = "AR_NUM_STAGES" if case.t == 1 else "NUM_STAGES"  # the one this call's binary uses
            new = {}
            for st in SPLIT_SWEEP_STAGES:
                with knobs(**{knob: st}):
                    new[st] = per_call_us(x.new, flush)
            old_us = per_call_us(lambda: x.old(old), flush)
            rows.append({**asdict(case), "split_len": split_len, "new_cold_us": new, "old_cold_us": old_us})
            line.append(f"{split_len}: " + "/".join(f"{u:.1f}" for u in new.values()) + f" (old {old_us:.1f})")
        print(f"{case.shape:>5} T={case.t:<4} ctx={case.context:<5} " + "  ".join(line), flush=True)
    return rows


TILE_SWEEP = (16, 32, 48, 64, 96, 128)


def run_tile_sweep(old, capacity: int, flush: Flush) -> list:
    """The AR call's tile programs per KV head (`ar_tile_programs`, speed only), cold µs, beside the
    previous kernel."""
    gen = torch.Generator().manual_seed(3)
    rows = []
    print(f"\nAR tile programs sweep (capacity {capacity}): cold µs at {', '.join(map(str, TILE_SWEEP))} a KV head")
    for case in [Case(s, 1, c) for s in HEADS for c in (0, 512, 2048, 4096, 8192)]:
        x = Inputs(case, capacity, old, gen)
        new = {}
        for programs in TILE_SWEEP:
            with knobs(AR_TILE_PROGRAMS_TOTAL=0, AR_TILE_PROGRAMS_MIN=programs):
                new[programs] = per_call_us(x.new, flush)
        old_us = per_call_us(lambda: x.old(old), flush)
        rows.append({**asdict(case), "new_cold_us": new, "old_cold_us": old_us})
        print(f"{case.shape:>5} ctx={case.context:<5} " + " ".join(f"{p}: {u:.1f}" for p, u in new.items())
              + f"  (old {old_us:.1f})", flush=True)
    return rows


MERGE_SWEEP = ((8, 4), (16, 4), (16, 8), (32, 8))  # (AR_SPLITS_BLOCK, AR_MERGE_WARPS)


def run_merge_sweep(old, capacity: int, flush: Flush) -> list:
    """The AR call with its merge serial or folding splits side by side (speed only), cold µs,
    beside the previous kernel; whether each variant's output is the serial merge's, bitwise."""
    gen = torch.Generator().manual_seed(4)
    rows = []
    names = ["serial"] + [f"{b}x{w}w" for b, w in MERGE_SWEEP]
    print(f"\nAR merge sweep (capacity {capacity}, split {tree_attention.split_len_for(capacity)} keys): cold µs, "
          f"serial merge, then splits side by side (splits a block x warps); default block "
          f"{tree_attention.AR_SPLITS_BLOCK}, {tree_attention.AR_MERGE_WARPS} warps, serial up to "
          f"{tree_attention.AR_SERIAL_SPLITS} splits")
    variants = {"serial": {"AR_SERIAL_SPLITS": 1 << 30}} | {
        name: {"AR_SERIAL_SPLITS": 0, "AR_SPLITS_BLOCK": block, "AR_SPLITS_BLOCK_ELEMS": block * HEAD_DIM,
               "AR_MERGE_WARPS": warps} for name, (block, warps) in zip(names[1:], MERGE_SWEEP)}
    for case in [Case(s, 1, c) for s in HEADS for c in (512, 2048, 4096, 8192, 32000)]:
        x = Inputs(case, capacity, old, gen)
        us, outs = {}, {}
        for name, values in variants.items():
            with knobs(**values):
                outs[name] = x.new().clone()
                us[name] = per_call_us(x.new, flush)
        default = per_call_us(x.new, flush)
        same = all(torch.equal(o, outs["serial"]) for o in outs.values())
        old_us = per_call_us(lambda: x.old(old), flush)
        rows.append({**asdict(case), "new_cold_us": us, "default_cold_us": default, "old_cold_us": old_us,
                     "same_bits": same})
        print(f"{case.shape:>5} ctx={case.context:<6}" + " ".join(f"{n}: {u:.1f}" for n, u in us.items())
              + f"  default: {default:.1f}  (old {old_us:.1f})  same: {same}", flush=True)
    return rows


GRID_SWEEP_CAPS = (4, 8, 16, None)  # SPLIT_PROGRAMS_CAP; None: a program per split (uncapped)
GRID_SWEEP_CASES = [Case(s, t, c) for s in HEADS for t in (16, 64, 128) for c in (512, 2048, 8192)] + [
    Case(s, t, c, "causal") for s in HEADS for t, c in ((16, 512), (512, 0), (512, 3000))]


def run_grid_sweep(old, capacity: int, flush: Flush) -> list:
    """Verify calls and causal chunks at SPLIT_PROGRAMS_CAP 4 / 8 / 16 / uncapped (speed only),
    cold µs, beside the previous kernel; whether each cap's output equals the uncapped one's, bitwise."""
    gen = torch.Generator().manual_seed(5)
    rows = []
    splits = -(-capacity // tree_attention.split_len_for(capacity))
    names = [f"cap {c}" if c else "uncapped" for c in GRID_SWEEP_CAPS]
    print(f"\nsplit programs grid sweep (capacity {capacity}: {splits} splits of "
          f"{tree_attention.split_len_for(capacity)} keys): cold µs at " + ", ".join(names)
          + f"; default cap {tree_attention.SPLIT_PROGRAMS_CAP}")
    for case in GRID_SWEEP_CASES:
        x = Inputs(case, capacity, old, gen)
        us, outs = {}, {}
        for name, cap in zip(names, GRID_SWEEP_CAPS):
            with knobs(SPLIT_PROGRAMS_CAP=cap or (1 << 30)):
                outs[name] = x.new().clone()
                us[name] = per_call_us(x.new, flush)
        same = all(torch.equal(o, outs["uncapped"]) for o in outs.values())
        old_us = per_call_us(lambda: x.old(old), flush)
        rows.append({**asdict(case), "new_cold_us": us, "old_cold_us": old_us, "same_bits": same})
        print(f"{case.shape:>5} T={case.t:<4} ctx={case.context:<5} {case.mask:>6} "
              + " ".join(f"{n}: {u:.1f}" for n, u in us.items())
              + f"  (old {old_us:.1f})  same: {same}", flush=True)
    return rows


def time_variants(x: Inputs, variants: dict, flush: Flush) -> tuple[dict, dict]:
    """This tree's kernel on x under each variant's module constants: cold µs and the output."""
    us, outs = {}, {}
    for name, values in variants.items():
        try:
            with knobs(**values):
                outs[name] = x.new().clone()
                us[name] = per_call_us(x.new, flush)
        except Exception as exc:  # noqa: BLE001 - a variant this Triton cannot build: say so, go on
            print(f"  {name} failed: {exc!r}"[:300], flush=True)
    return us, outs


VERIFY_MERGE_SWEEP = ((4, None), (8, None), (16, None), (16, 128))  # (VERIFY_SPLITS_BLOCK, VERIFY_MERGE_MAX_REGISTERS)


def run_verify_merge_sweep(capacity: int, flush: Flush, shapes: list[str], tokens: list[int] | None) -> list:
    """Verify calls (random trees) with their merge loading one split state after another
    (VERIFY_SERIAL_SPLITS past any row) or blocks of states (speed only), cold µs; whether each
    variant's output is the serial merge's, bitwise."""
    gen = torch.Generator().manual_seed(5)
    rows = []
    names = ["serial"] + [f"{b}" + (f"/{r}r" if r else "") for b, r in VERIFY_MERGE_SWEEP]
    print(f"\nverify merge sweep (capacity {capacity}, split {tree_attention.split_len_for(capacity)} keys): cold µs, "
          f"serial merge, then blocks of split states (states a block[/registers a thread]); default block "
          f"{tree_attention.VERIFY_SPLITS_BLOCK}, registers {tree_attention.VERIFY_MERGE_MAX_REGISTERS}, serial up to "
          f"{tree_attention.VERIFY_SERIAL_SPLITS} splits")
    variants = {"serial": {"VERIFY_SERIAL_SPLITS": 1 << 30}} | {
        name: {"VERIFY_SPLITS_BLOCK": block, "VERIFY_SPLITS_BLOCK_ELEMS": block * HEAD_DIM,
               "VERIFY_MERGE_MAX_REGISTERS": registers}
        for name, (block, registers) in zip(names[1:], VERIFY_MERGE_SWEEP)}
    for case in [Case(s, t, c) for s in HEADS for t in (16, 64, 128, 256) for c in (512, 2048, 8192)]:
        if case.shape not in shapes or (tokens is not None and case.t not in tokens):
            continue
        x = Inputs(case, capacity, tree_attention, gen)
        us, outs = time_variants(x, variants, flush)
        default = per_call_us(x.new, flush)
        same = all(torch.equal(o, outs["serial"]) for o in outs.values()) and torch.equal(x.new(), outs["serial"])
        rows.append({**asdict(case), "new_cold_us": us, "default_cold_us": default, "same_bits": same})
        print(f"{case.shape:>5} T={case.t:<4} ctx={case.context:<5} " + " ".join(f"{n}: {u:.1f}" for n, u in us.items())
              + f"  default: {default:.1f} ({default / us['serial']:.2f}x serial)  same: {same}", flush=True)
    return rows


V_SPLIT_SWEEP = {"v1": {"V_SPLIT": 1}, "v2": {"V_SPLIT": 2}, "v2 s2": {"V_SPLIT": 2, "NUM_STAGES": 2},
                 "v2 s4": {"V_SPLIT": 2, "NUM_STAGES": 4}, "v4": {"V_SPLIT": 4}}
TMA_SWEEP = {"pointer": {"TMA_LOADS": False}, "tma": {"TMA_LOADS": True}}
MERGE_BLOCKS_SWEEP = {"one at a time": {"MERGE_LOADS_A_THREAD": 0, "AR_MERGE_PARTS": 1},
                      "blocks": {"AR_MERGE_PARTS": 1}, "blocks p2": {"AR_MERGE_PARTS": 2},
                      "blocks p4": {"AR_MERGE_PARTS": 4}, "blocks p8": {"AR_MERGE_PARTS": 8},
                      "p4 w2": {"AR_MERGE_PARTS": 4, "AR_MERGE_WARPS": 2}}
FLAT_SWEEP = {"chains": {"FLAT_MAX_CHAINS": 0}, "flat to 16": {"FLAT_MAX_CHAINS": 16},
              "flat to 64": {"FLAT_MAX_CHAINS": 64}, "flat to 256": {"FLAT_MAX_CHAINS": 256}}
TAIL_SWEEP = {"one launch": {"SEPARATE_TAIL_PROGRAMS": 1 << 30, "AR_NUM_STAGES": 2},
              "tail s1": {"SEPARATE_TAIL_PROGRAMS": 0, "TAIL_STAGES": 1, "AR_NUM_STAGES": 2},
              "tail s2": {"SEPARATE_TAIL_PROGRAMS": 0, "TAIL_STAGES": 2, "AR_NUM_STAGES": 2},
              "default": {}, "AR s1": {"SEPARATE_TAIL_PROGRAMS": 1 << 30, "AR_NUM_STAGES": 1}}


# The sweeps of module constants alone (--NAME-sweep): their titles, what each varies (the flag's
# help: "only the AR call and verify calls with ..."), and variants.
KNOB_SWEEPS = {
    "v_split": ("V_SPLIT sweep: vN, V's columns in N programs a query tile; sN, N pipeline stages",
                "V's columns split over programs", V_SPLIT_SWEEP),
    "tail": ("tail sweep: a TREE call's tile programs in the split programs' launch or in one of their own "
             "(TAIL_STAGES sN); the AR binary at AR_NUM_STAGES 1",
             "the tree's tile programs launched apart", TAIL_SWEEP),
    "tma": ("TMA sweep: whole prefix tiles through pointer loads or TMA descriptors (TMA_LOADS)",
            "whole prefix tiles through pointers or TMA", TMA_SWEEP),
    "merge_blocks": ("merge blocks sweep: the merge's tile partials loaded one at a time or in blocks "
                     "(MERGE_LOADS_A_THREAD), an AR row's columns in pN programs (AR_MERGE_PARTS)",
                     "the merge's partials loaded one at a time or in blocks, an AR row's columns over programs",
                     MERGE_BLOCKS_SWEEP),
    "flat": ("flat sweep: a short prefix's tiles folded in chains by the split programs, or each stored by a "
             "program of its own where query tiles x KV heads are at most FLAT_MAX_CHAINS",
             "a short prefix's tiles in chains or flat programs (FLAT_MAX_CHAINS)", FLAT_SWEEP),
}


def run_knob_sweep(title: str, variants: dict, capacity: int, flush: Flush, shapes: list[str],
                   tokens: list[int] | None) -> list:
    """The AR call and verify calls (random trees, T = 16-256 at 512 / 2048 / 8192 keys) under each
    variant's module constants (speed knobs), cold µs; whether each variant's output is the first
    variant's, bitwise."""
    gen = torch.Generator().manual_seed(6)
    rows = []
    first = next(iter(variants))
    print(f"\n{title} (capacity {capacity}, split {tree_attention.split_len_for(capacity)} keys): cold µs; "
          f"same: bitwise equal to {first!r}")
    for case in [Case(s, t, c) for s in HEADS for t in (1, 16, 64, 128, 256) for c in (512, 2048, 8192)]:
        if case.shape not in shapes or (tokens is not None and case.t not in tokens):
            continue
        x = Inputs(case, capacity, tree_attention, gen)
        us, outs = time_variants(x, variants, flush)
        same = {name: torch.equal(o, outs[first]) for name, o in outs.items()}
        rows.append({**asdict(case), "new_cold_us": us, "same_bits": same})
        print(f"{case.shape:>5} T={case.t:<4} ctx={case.context:<5} " + " ".join(f"{n}: {u:.1f}" for n, u in us.items())
              + "  same: " + " ".join(f"{n}={int(v)}" for n, v in same.items() if n != first), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", default="main", help="the previous kernel: a git revision, or its saved file (no .git)")
    ap.add_argument("--capacity", type=int, default=33792,
                    help="cache positions (the kernels' split length; the engine's default cache: 576)")
    ap.add_argument("--sweep", action="store_true", help="also sweep MAX_SPLITS")
    ap.add_argument("--split-sweep", action="store_true",
                    help="only the split length x stages sweep (T = 1 and verify calls, cold)")
    ap.add_argument("--tile-sweep", action="store_true",
                    help="only the AR call at 16 to 128 tile programs a KV head (cold)")
    ap.add_argument("--merge-sweep", action="store_true",
                    help="only the AR call with its merge serial or splits side by side (cold)")
    ap.add_argument("--grid-sweep", action="store_true",
                    help="only verify calls and causal chunks at SPLIT_PROGRAMS_CAP 4 / 8 / 16 / uncapped (cold)")
    ap.add_argument("--verify-merge-sweep", action="store_true",
                    help="only verify calls with their merge serial or loading blocks of split states (cold)")
    for name, (_, varies, _) in KNOB_SWEEPS.items():
        ap.add_argument(f"--{name.replace('_', '-')}-sweep", action="store_true",
                        help=f"only the AR call and verify calls with {varies} (cold)")
    ap.add_argument("--shapes", default=",".join(HEADS), help="the table's shapes (comma-separated: 1.5b, 8b)")
    ap.add_argument("--tokens", default=None, help="the table's new-token counts T (comma-separated; default all)")
    ap.add_argument("--json-out", default=os.path.join(os.environ.get("OUT", "."), "attention_bench.json"))
    args = ap.parse_args()
    old = load_old(args.old)
    flush = Flush()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, previous kernel {args.old}, "
          f"capacity {args.capacity}, MAX_SPLITS {tree_attention.MAX_SPLITS}")
    rows: list = []
    if args.tile_sweep:
        rows = run_tile_sweep(old, args.capacity, flush)
        Path(args.json_out).write_text(json.dumps({"old": args.old, "capacity": args.capacity, "tile_sweep": rows}))
        return
    if args.merge_sweep:
        rows = run_merge_sweep(old, args.capacity, flush)
        Path(args.json_out).write_text(json.dumps({"old": args.old, "capacity": args.capacity, "merge_sweep": rows}))
        return
    if args.grid_sweep:
        rows = run_grid_sweep(old, args.capacity, flush)
        Path(args.json_out).write_text(json.dumps({"old": args.old, "capacity": args.capacity, "grid_sweep": rows}))
        return
    if args.verify_merge_sweep:
        tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else None
        rows = run_verify_merge_sweep(args.capacity, flush, args.shapes.split(","), tokens)
        Path(args.json_out).write_text(json.dumps({"capacity": args.capacity, "verify_merge_sweep": rows}))
        return
    for name, (title, _, variants) in KNOB_SWEEPS.items():
        if getattr(args, f"{name}_sweep"):
            tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else None
            rows = run_knob_sweep(title, variants, args.capacity, flush, args.shapes.split(","), tokens)
            Path(args.json_out).write_text(json.dumps({"capacity": args.capacity, f"{name}_sweep": rows}))
            return
    if args.split_sweep:
        rows = run_split_sweep(old, args.capacity, flush)
        Path(args.json_out).write_text(json.dumps({"old": args.old, "capacity": args.capacity, "split_sweep": rows}))
        return
    shapes = args.shapes.split(",")
    if unknown := [s for s in shapes if s not in HEADS]:
        ap.error(f"unknown shape {unknown[0]!r}: the shapes are {', '.join(HEADS)}")
    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else None
    run_table(old, args.capacity, flush, rows, shapes, tokens)
    print("compiled:\n" + compiled_info())
    sweep = run_sweep(old, args.capacity, flush) if args.sweep else None
    Path(args.json_out).write_text(json.dumps({"old": args.old, "capacity": args.capacity, "rows": rows,
                                               "sweep": sweep}, indent=1))


if __name__ == "__main__":
    main()

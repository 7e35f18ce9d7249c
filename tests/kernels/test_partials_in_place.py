"""`Partials` whose parts live at their own addresses, loaded through a table of those addresses
(the tensor-parallel ranks' slots read in place: engine/parallel.py `SymmetricExchange`), give
the consumers bitwise what the same parts stacked into one [G, M, N] buffer give: the same adds
in the same order, only the addresses differ.

The "peers" are separate tensors, each the first rows of a slot of its own buffer (as a rank's
slot is), whose addresses go in the table. On the CPU the kernels run under TRITON_INTERPRET=1
(conftest.py), which casts the loaded int64 to a pointer as the GPU does; the pointer checker
holds every load to the parts' own rows. On a GPU the same tests run the compiled kernels."""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from jetspec_chat.kernels import Partials, add_rms_norm, add_rms_norm_triton, qkv_rope_write_triton  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6


def rand(*shape, seed, dtype, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(device=DEVICE, dtype=dtype)


def both_forms(groups, t, n, dtype, part_dtype, bias, seed):
    """(stacked, in place) Partials of the same G parts [t, n]: part g is rows [0, t) of slot 1
    of its own [2, t + 3, n] buffer."""
    parts = tuple(rand(2, t + 3, n, seed=seed + g, dtype=part_dtype, scale=2.0)[1, :t] for g in range(groups))
    b = rand(n, seed=seed + 100, dtype=dtype) if bias else None
    table = torch.tensor([p.data_ptr() for p in parts], dtype=torch.int64, device=DEVICE)
    return Partials(torch.stack(parts), b, dtype), Partials(parts, b, dtype, group_ptrs=table)


CASES = [  # (groups, rows, hidden, block): block 32 over 80 columns is the two-pass loop, ragged
    (2, 1, 64, None),
    (2, 7, 80, None),
    (3, 5, 80, 32),
    (4, 3, 48, None),
]


@pytest.mark.parametrize("groups,t,n,block", CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
def test_add_rms_norm_reads_parts_in_place_bitwise(groups, t, n, block, dtype, bias, poisoned_alloc, checked_pointers):
    stacked, in_place = both_forms(groups, t, n, dtype, dtype, bias, seed=10 * groups + t)
    if checked_pointers is not None:
        checked_pointers.reachable = list(in_place.groups)
    resid, w = rand(t, n, seed=1, dtype=dtype, scale=3.0), 1.0 + 0.3 * rand(n, seed=2, dtype=dtype)
    y, h = add_rms_norm_triton(in_place, resid, w, EPS, block=block)
    y2, h2 = add_rms_norm_triton(stacked, resid, w, EPS, block=block)
    assert torch.equal(h, h2) and torch.equal(y, y2)
    assert in_place.shape == (t, n) and in_place.num_groups == groups
    assert torch.equal(in_place.stacked(), stacked.groups) and torch.equal(in_place.sum(), stacked.sum())
    # The dispatcher (Triton on CUDA, else the reference on sum()) takes either form alike.
    assert all(torch.equal(a, b) for a, b in zip(add_rms_norm(in_place, resid, w, EPS), add_rms_norm(stacked, resid, w, EPS)))


def test_fp32_parts_in_place_bitwise(checked_pointers):
    """Parts of another dtype than the output (a split GEMM's fp32 group sums) read in place."""
    stacked, in_place = both_forms(3, 4, 80, torch.bfloat16, torch.float32, True, seed=7)
    if checked_pointers is not None:
        checked_pointers.reachable = list(in_place.groups)
    resid, w = rand(4, 80, seed=3, dtype=torch.bfloat16), rand(80, seed=4, dtype=torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(add_rms_norm_triton(in_place, resid, w, EPS),
                                                 add_rms_norm_triton(stacked, resid, w, EPS)))


def test_qkv_rope_write_reads_parts_in_place_bitwise(checked_pointers):
    heads, kv, d, t = 2, 1, 16, 3
    n = (heads + 2 * kv) * d
    stacked, in_place = both_forms(2, t, n, torch.bfloat16, torch.bfloat16, True, seed=20)
    if checked_pointers is not None:
        checked_pointers.reachable = list(in_place.groups)
    from jetspec_chat.engine.layers import Rotary

    cos, sin = Rotary(d, 1e6).to(DEVICE).cos_sin(torch.arange(5, 5 + t, device=DEVICE), torch.bfloat16)
    qn, kn = 1.0 + 0.3 * rand(d, seed=5, dtype=torch.bfloat16), 1.0 + 0.3 * rand(d, seed=6, dtype=torch.bfloat16)
    slots = torch.tensor([4, 0, 9], device=DEVICE)
    out = []
    for p in (in_place, stacked):
        k_pool = torch.zeros(1, 16, kv, d, device=DEVICE, dtype=torch.bfloat16)
        v_pool = torch.zeros_like(k_pool)
        out.append((qkv_rope_write_triton(p, heads, kv, qn, kn, cos, sin, EPS, k_pool, v_pool, slots), k_pool, v_pool))
    assert all(torch.equal(a, b) for a, b in zip(*out))
    assert out[0][2].abs().sum() > 0  # v was written


def test_a_misaligned_part_is_refused():
    """The kernels load the parts in 16-byte vectors: a part off that alignment is refused."""
    base = rand(40, seed=3, dtype=torch.bfloat16)
    parts = (base[16:32].view(2, 8), base[1:17].view(2, 8))  # the second 2 bytes off
    table = torch.tensor([p.data_ptr() for p in parts], dtype=torch.int64, device=DEVICE)
    with pytest.raises(AssertionError, match="16-byte aligned"):
        add_rms_norm_triton(Partials(parts, None, torch.bfloat16, group_ptrs=table),
                            rand(2, 8, seed=4, dtype=torch.bfloat16), rand(8, seed=5, dtype=torch.bfloat16), EPS)

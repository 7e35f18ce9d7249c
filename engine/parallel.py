"""Tensor parallelism: the target's and the draft head's layers split over N ranks, and the two
exchanges they need.

Every rank holds the embedding, the final norm, and the draft head's fc, hidden_norm and norms;
of the lm_head it holds 1/N of the vocabulary (rows [r V/N, (r+1) V/N); a tied lm_head is that
view of the whole embedding), and the target's and the draft's logits are one all-gather of the
ranks' slices (`VocabSplit`: values moved, none added, so every logit keeps the bits its rank's
GEMM gave it). The vocabulary must divide by N, as the heads must. Inside each layer, the
target's and the draft head's alike (`shard_attention`, `shard_mlp`), a rank holds 1/N of the
attention heads (q/k/v rows of `qkv_proj`, the matching columns of `o_proj`, its KV heads of
the paged cache or of the draft's context cache) and 1/N of the MLP's intermediate columns
(rows of `gate_up_proj`, columns of `down_proj`; for a MoE layer the same 1/N of every expert's
columns, the router whole). The two row-parallel products per layer (o_proj, down_proj / the
MoE experts) leave each rank a partial sum of the layer's output; the ranks exchange them (every
rank gets all N partials, `gather_partials`) and every rank adds the N partials in rank order in
fp32 (the add is fused into the next residual add + norm). That sum is the same bits on every
rank (so every rank computes the same hidden states and draft logits, hence after the logits'
gather the same draft tree and accepted tokens) and the same bits for a row whether it runs
alone (an AR step) or among many (a verify tree): speculative decoding stays token-identical to
AR under TP in bf16 as well. An all-reduce gives neither guarantee (NCCL picks its ring/tree
order by message size). The draft's context append (K/V of the accepted rows: fc, hidden_norm,
then each layer's k/v rows) needs no exchange: fc is whole and each rank projects its own KV
heads. A draft head whose heads or MLP width do not divide by N runs whole on every rank
(`head_shard`).

MoE by columns, not by experts: with top-8 of 128 experts a single token's experts fall unevenly
on N expert-owners (the slowest rank sets every layer's pace), whereas a column split gives each
rank exactly 1/N of the work of every token, keeps the router and routing whole and identical on
every rank, and needs no token exchange (all-to-all) at all.

The exchange: on CUDA through symmetric memory where every pair of GPUs can reach each other
(`SymmetricExchange`: the row-parallel GEMM writes its partial into this rank's slot of a
symmetric buffer, a device-side barrier, then the consumer reads the N ranks' slots in place by
unicast peer loads as it sums them; 1 launch beside the GEMM, no copy, no NCCL, no host sync,
capturable in a CUDA graph), else (the CPU with gloo, no peer access, a batch larger than
the buffer, JETSPEC_TP_EXCHANGE=nccl) one NCCL/gloo all-gather. Both hand the consumer the same
N partials [T, H], so the choice never changes a bit of the output.
"""
from __future__ import annotations

import dataclasses
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from ..kernels import Partials
from .layers import Linear, SparseMoeBlock, linear
from .model import TargetModel

# NVLink multicast (NVLS, symmetric-memory multicast) stays off in every rank: it has taken a
# shared host's GPUs down. Set before the process group (and NCCL) starts.
RANK_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


@dataclasses.dataclass(frozen=True)
class Ranks:
    """This process's place in the tensor-parallel group. `data` carries the activations (NCCL on
    CUDA, gloo on the CPU; None = the default group); `control` rank 0's commands (always gloo, so
    a command never waits behind GPU work)."""

    rank: int
    world: int
    control: object | None = None


# "nccl": every exchange is the NCCL all-gather (the symmetric-memory exchange stays closed).
EXCHANGE_ENV = "JETSPEC_TP_EXCHANGE"


class SymmetricExchange:
    """Every rank's partial [T, H] (T <= rows) to every rank through symmetric memory, unicast
    only (NVLink multicast stays off). Each rank holds SLOTS buffers [rows, H]. A rank's partial
    goes into its slot (the row-parallel GEMM writes it there directly: `out_for`; anything else
    is copied in) and the ranks meet at a device-side barrier (signal pads: release/acquire at
    system scope, no host sync, capturable in a CUDA graph). Nothing is copied after it: the
    `Partials` handed on name slot `slot` of all N ranks' buffers in place (a table of their
    addresses, in rank order), and the consumer (add_rms_norm) reads the peers' slots by unicast
    loads as it sums them. Beside the GEMM, one launch an exchange (the barrier).

    Two slots make one barrier per exchange enough: a rank writes a slot again only after the
    next exchange's barrier, which every other rank enters only after its consumer of this
    exchange has read that slot (the consumer runs before the next barrier on the rank's
    stream, and a kernel starts only once the one before it has finished, with PDL too: every
    kernel here waits for its predecessor before its first load). So a Partials from `gather`
    must be consumed before the rank's next exchange, as the forward does (the next residual
    add + norm, or `sum()`). That holds while consecutive exchanges use different slots: the
    attention's o_proj uses slot 0 and the MLP / MoE block slot 1, and every forward, the
    target's and the draft head's alike, runs its layers in order (o, mlp, o, ..., mlp), so it
    starts on slot 0 and ends on slot 1 (the draft's context append makes no exchange)."""

    SLOTS = 2

    def __init__(self, rows: int, hidden: int, dtype: torch.dtype, device: torch.device, group_name: str):
        import torch.distributed._symmetric_memory as symm_mem

        self.rows, self.hidden, self.dtype = rows, hidden, dtype
        self.buffer = symm_mem.empty(self.SLOTS, rows, hidden, dtype=dtype, device=device)
        self.handle = symm_mem.rendezvous(self.buffer, group_name)
        self.rank, self.world = self.handle.rank, self.handle.world_size
        self._views: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}
        # Per slot, the N ranks' slot addresses in this process (int64, on the device), made
        # once here: a CUDA graph then replays its reads from the same table.
        self._slot_ptrs = [
            torch.tensor([v.data_ptr() for v in self._peer_views(slot, rows)], dtype=torch.int64, device=device)
            for slot in range(self.SLOTS)
        ]

    def fits(self, partial: torch.Tensor) -> bool:
        return partial.dim() == 2 and self._takes(partial.shape[0], partial.shape[1], partial.dtype, partial.device)

    def _takes(self, t: int, n: int, dtype: torch.dtype, device: torch.device) -> bool:
        """Whether a partial [t, n] of `dtype` on `device` goes through this exchange."""
        return t <= self.rows and n == self.hidden and dtype == self.dtype and device == self.buffer.device

    def out(self, t: int, slot: int) -> torch.Tensor:
        """Where this rank's partial of T rows goes in `slot` ([T, H], contiguous): a GEMM that
        writes it there saves the exchange's copy."""
        return self.buffer[slot, :t]

    def out_for(self, x: torch.Tensor, n: int, slot: int) -> torch.Tensor | None:
        """`out` for the product of x [T, K] with an [n, K] weight, or None where that partial
        would not fit (too many rows, another width, dtype or device)."""
        fits = x.dim() == 2 and self._takes(x.shape[0], n, x.dtype, x.device)
        return self.out(x.shape[0], slot) if fits else None

    def gather(self, partial: torch.Tensor, slot: int) -> Partials:
        """Every rank's `partial`, as `Partials` of N parts [T, H] (rank r's is part r), read in
        place from the ranks' slots (the address-table form); every rank calls it with the same
        shape and slot, and consumes the result before its next exchange (class docstring)."""
        t = partial.shape[0]
        mine = self.out(t, slot)
        if partial.data_ptr() != mine.data_ptr():
            mine.copy_(partial)
        self.handle.barrier(channel=0)
        return Partials(self._peer_views(slot, t), None, partial.dtype, group_ptrs=self._slot_ptrs[slot])

    def _peer_views(self, slot: int, t: int) -> tuple[torch.Tensor, ...]:
        """The first t rows of slot `slot` of every rank's buffer, in rank order (dense [t, H])."""
        views = self._views.get((slot, t))
        if views is None:
            offset = slot * self.rows * self.hidden
            views = tuple(self.handle.get_buffer(r, (t, self.hidden), self.dtype, offset) for r in range(self.world))
            self._views[(slot, t)] = views
        return views


def open_exchange(model: TargetModel, ranks: Ranks, rows: int, dtype: torch.dtype,
                  head: nn.Module | None = None) -> SymmetricExchange | None:
    """Every rank at once, after the load: a SymmetricExchange for batches of up to `rows` rows,
    given to every row-parallel module of `model` and of the draft `head` (split like the
    target's layers, of the same hidden size); or None (every rank keeps the NCCL all-gather)
    where it cannot open on every rank (the CPU, a GPU pair without peer access, a torch without
    symmetric memory, EXCHANGE_ENV=nccl). The ranks agree on the outcome over the control group."""
    device = model.model.embed_tokens.weight.device
    if ranks.world == 1 or device.type != "cuda" or os.environ.get(EXCHANGE_ENV) == "nccl":
        return None
    peers = all(torch.cuda.can_device_access_peer(device.index, d) for d in range(ranks.world) if d != device.index)
    if not _all_ranks(peers, ranks):
        return None
    try:
        exchange = SymmetricExchange(rows, model.cfg.hidden_size, dtype, device, dist.group.WORLD.group_name)
    except Exception as err:  # noqa: BLE001 - any failure to open leaves the NCCL path, which always works
        print(f"note: tensor-parallel rank {ranks.rank} exchanges through NCCL ({type(err).__name__}: {err})",
              file=sys.stderr, flush=True)
        exchange = None
    if not _all_ranks(exchange is not None, ranks):
        return None
    for part in (model, head):
        for module in part.modules() if part is not None else ():
            if isinstance(module, (RowParallelLinear, RowParallelMoe)):
                module.exchange = exchange
    return exchange


def _all_ranks(ok: bool, ranks: Ranks) -> bool:
    flag = torch.tensor([int(ok)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=ranks.control)
    return bool(flag.item())


def gather_partials(partial: torch.Tensor, world: int, exchange: SymmetricExchange | None = None,
                    slot: int = 0) -> Partials:
    """Every rank's `partial` [T, H], as one `Partials` of N parts (rank r's is part r): its value is
    their sum added in rank order onto a zero fp32 total, rounded once to partial's dtype, the
    same on every rank. Elementwise, so a row's sum does not depend on the other rows. The
    consumer (add_rms_norm) adds the parts as it loads them: no extra launch for the sum.
    Through `exchange` (its `slot`: the parts read in place from the ranks' symmetric buffers)
    where it fits, else one all-gather into one [N, T, H] buffer; both are capturable in a CUDA
    graph and give the consumer the same values."""
    if exchange is not None and exchange.fits(partial):
        return exchange.gather(partial, slot)
    partial = partial.contiguous()
    parts = partial.new_empty((world * partial.shape[0], *partial.shape[1:]))
    _all_gather_single(parts, partial)
    return Partials(parts.view(world, *partial.shape), None, partial.dtype)


# all_gather_into_tensor was renamed all_gather_single (torch 2.13); older torch has only the former.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclasses.dataclass(frozen=True)
class VocabSplit:
    """The lm_head split by vocabulary: rank r computes the logits of rows [r * rows, (r + 1) *
    rows), then `gather` puts the N slices side by side in rank order. The gather only moves
    values, so each logit is the bits the rank's GEMM gave it; the batch-invariant GEMM sums a
    row-slice of a weight in the same order as the whole weight wherever both have the same
    K blocks and groups (kernels.matmul.choose_config: the lm_head's N tiles fill the SMs, so one
    group), which tests/engine/test_parallel.py checks for every shipped vocabulary."""

    rank: int
    world: int
    rows: int  # vocabulary rows per rank (the vocabulary divides: check_splits)

    def gather(self, part: torch.Tensor) -> torch.Tensor:
        """This rank's logits [..., rows] -> every rank's, fp32 [..., world * rows]: one
        all-gather of the [M, rows] slices (capturable in a CUDA graph), then one copy that puts
        rank r's slice at columns r * rows.. of each row and converts to fp32 (the copy the
        whole lm_head's `.float()` makes anyway)."""
        lead = part.shape[:-1]
        part = part.reshape(-1, self.rows).contiguous()
        m = part.shape[0]
        parts = part.new_empty((self.world * m, self.rows))
        _all_gather_single(parts, part)
        out = torch.empty((m, self.world, self.rows), dtype=torch.float32, device=part.device)
        out.copy_(parts.view(self.world, m, self.rows).transpose(0, 1))
        return out.view(*lead, self.world * self.rows)


class RowParallelLinear(Linear):
    """A Linear holding 1/N of the input columns: the local product, then `gather_partials`
    (through `exchange` where one is open, in its slot `slot`: 0 for o_proj, 1 for down_proj)."""

    world: int
    slot: int
    exchange: SymmetricExchange | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_partials(x).sum()

    def forward_partials(self, x: torch.Tensor) -> Partials:
        # The GEMM writes its partial straight into the exchange's buffer where one is open.
        out = self.exchange.out_for(x, self.weight.shape[0], self.slot) if self.exchange is not None else None
        return gather_partials(linear(x, self.weight, self.bias, out=out), self.world, self.exchange, self.slot)


class RowParallelMoe(SparseMoeBlock):
    """A SparseMoeBlock whose experts hold 1/N of their columns: the local block, then
    `gather_partials`. A shard's block becomes one by a class change (`as_row_parallel`), which
    keeps its parameters' names (the checkpoint's). Its exchanges use slot 1, as down_proj's."""

    world: int
    exchange: SymmetricExchange | None = None

    @classmethod
    def as_row_parallel(cls, block: SparseMoeBlock, world: int) -> RowParallelMoe:
        block.__class__ = cls
        block.world = world
        return block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_partials(x).sum()

    def forward_partials(self, x: torch.Tensor) -> Partials:
        return gather_partials(super().forward(x), self.world, self.exchange, slot=1)


def _share(n: int, world: int, what: str) -> int:
    if n % world:
        raise ValueError(f"{what} ({n}) does not split over {world} ranks")
    return n // world


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.contiguous().clone(), requires_grad=False)


def _row_parallel(weight: torch.Tensor, world: int, slot: int) -> RowParallelLinear:
    with torch.device("meta"):
        m = RowParallelLinear(weight.shape[1], weight.shape[0], bias=False)
    m.weight = _param(weight)
    m.world, m.slot = world, slot
    return m


def check_splits(cfg, world: int) -> None:
    """Raise ValueError naming the first dimension that does not split over `world` ranks, or
    the first part of the architecture that has no split yet."""
    if world > 1:  # one rank splits nothing, so every architecture runs at --tp 1
        if cfg.moe_kind == "gpt_oss":  # shard_target splits neither its sinks, biases nor experts' layout
            raise ValueError("gpt-oss is not split over several ranks yet; run it with --tp 1")
        if cfg.gemma4 is not None:
            raise ValueError("Gemma 4 has no tensor-parallel split yet")
        if cfg.hybrid is not None:
            raise ValueError("its linear-attention layers have no tensor-parallel split yet")
        if cfg.attention_sinks or cfg.o_proj_bias or cfg.moe_kind != "qwen3":
            raise ValueError("its attention sinks, o_proj bias or MoE kind have no tensor-parallel split yet")
    _share(cfg.vocab_size, world, "the vocabulary")  # every shipped one divides by 8
    _share(cfg.num_kv_heads, world, "the KV heads")
    _share(cfg.num_heads, world, "the attention heads")
    if any(not cfg.is_moe_layer(i) for i in range(cfg.num_layers)):
        _share(cfg.intermediate_size, world, "the MLP width")
    if cfg.moe_layers:
        _share(cfg.moe_intermediate_size, world, "the experts' width")


@dataclasses.dataclass(frozen=True)
class Shard:
    """Rank `rank` of `world`: which part of each checkpoint tensor it holds (module docstring).
    Every split is `world` equal consecutive parts along one dimension, so `take` names the
    dimension; the rank holds part `rank`."""

    rank: int
    world: int

    # checkpoint name suffix -> the dimension split (0: output rows, 1: input columns)
    SPLIT_DIMS = (
        (".self_attn.q_proj.weight", 0), (".self_attn.q_proj.bias", 0),
        (".self_attn.k_proj.weight", 0), (".self_attn.k_proj.bias", 0),
        (".self_attn.v_proj.weight", 0), (".self_attn.v_proj.bias", 0),
        (".self_attn.o_proj.weight", 1),
        (".gate_proj.weight", 0), (".up_proj.weight", 0), (".down_proj.weight", 1),  # MLP and every expert
    )
    LM_HEAD = "lm_head.weight"  # split by vocabulary rows (an untied lm_head; a tied one is the embedding's)

    def take(self, name: str) -> int | None:
        """The dimension along which this rank holds 1/world of checkpoint tensor `name` (the
        target's `model.layers.*` or a draft head's `layers.*`), or None: the rank holds all of
        it (embedding, norms, router, a draft head's fc)."""
        if name == self.LM_HEAD:
            return 0
        if not (name.startswith("layers.") or ".layers." in name):
            return None
        return next((dim for suffix, dim in self.SPLIT_DIMS if name.endswith(suffix)), None)

    def part(self, full: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's part of `full` along `dim` (a view)."""
        n = _share(full.shape[dim], self.world, f"a dimension of {tuple(full.shape)}")
        return full.narrow(dim, self.rank * n, n)


def shard_attention(attn, rank: int, world: int) -> None:
    """Keep this rank's 1/N of an attention layer's heads, in place: its q, k and v rows of
    `qkv_proj` (query heads [r nh, (r+1) nh), KV heads [r nkv, (r+1) nkv): each rank's query
    heads read its own KV heads, as GQA groups are consecutive) and the matching input columns
    of `o_proj`, which becomes row-parallel (slot 0)."""
    hd, heads, kv_heads = attn.head_dim, attn.n_heads, attn.n_kv
    nh, nkv = _share(heads, world, "the attention heads"), _share(kv_heads, world, "the KV heads")
    qkv = attn.qkv_proj
    # Indices made on the CPU and moved (a meta arange would import torch._dynamo: seconds of a start).
    q_rows = torch.arange(rank * nh * hd, (rank + 1) * nh * hd)
    k_rows = heads * hd + torch.arange(rank * nkv * hd, (rank + 1) * nkv * hd)
    v_rows = k_rows + kv_heads * hd
    rows = torch.cat([q_rows, k_rows, v_rows]).to(qkv.weight.device)
    qkv.weight = _param(qkv.weight[rows])
    if qkv.bias is not None:
        qkv.bias = _param(qkv.bias[rows])
    qkv.parts = {"q_proj": nh * hd, "k_proj": nkv * hd, "v_proj": nkv * hd}
    qkv.out_features = qkv.weight.shape[0]
    attn.n_heads, attn.n_kv = nh, nkv
    attn.o_proj = _row_parallel(attn.o_proj.weight[:, q_rows.to(attn.o_proj.weight.device)], world, slot=0)


def shard_mlp(mlp, rank: int, world: int) -> None:
    """Keep this rank's 1/N of a dense MLP's intermediate width, in place: its gate and up rows
    of `gate_up_proj` and the matching columns of `down_proj`, which becomes row-parallel (slot 1)."""
    n = _share(mlp.down_proj.weight.shape[1], world, "the MLP width")
    cols = slice(rank * n, (rank + 1) * n)
    gate, up = mlp.gate_up_proj.weight.chunk(2, dim=0)
    mlp.gate_up_proj.weight = _param(torch.cat([gate[cols], up[cols]]))
    mlp.gate_up_proj.parts = {"gate_proj": n, "up_proj": n}
    mlp.gate_up_proj.out_features = 2 * n
    mlp.down_proj = _row_parallel(mlp.down_proj.weight[:, cols], world, slot=1)


def shard_target(model: TargetModel, rank: int, world: int) -> None:
    """Keep this rank's share of every decoder layer and of the lm_head's vocabulary (module
    docstring), in place; `model.cfg` becomes the rank's view (its heads and widths, the whole
    vocabulary), from which the KV cache is sized."""
    cfg = model.cfg
    check_splits(cfg, world)
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            shard_attention(layer.self_attn, rank, world)
            if cfg.is_moe_layer(i):
                experts = layer.mlp.experts
                n = cfg.moe_intermediate_size // world
                cols = slice(rank * n, (rank + 1) * n)
                gate, up = experts.gate_up_proj.chunk(2, dim=1)
                experts.gate_up_proj = _param(torch.cat([gate[:, cols], up[:, cols]], dim=1))
                experts.down_proj = _param(experts.down_proj[:, :, cols])
                experts.intermediate = n
                RowParallelMoe.as_row_parallel(layer.mlp, world)
            else:
                shard_mlp(layer.mlp, rank, world)
        if world > 1:  # the lm_head's vocabulary rows (a tied one's are a view of the whole embedding)
            vocab_rows = cfg.vocab_size // world
            model.vocab_split = VocabSplit(rank, world, vocab_rows)
            if model.lm_head is not None:
                model.lm_head.weight = _param(model.lm_head.weight[rank * vocab_rows : (rank + 1) * vocab_rows])
                model.lm_head.out_features = vocab_rows
    model.cfg = dataclasses.replace(
        cfg, num_heads=cfg.num_heads // world, num_kv_heads=cfg.num_kv_heads // world,
        intermediate_size=cfg.intermediate_size // world if any(not cfg.is_moe_layer(i) for i in range(cfg.num_layers))
        else cfg.intermediate_size,
        moe_intermediate_size=cfg.moe_intermediate_size // world if cfg.moe_layers else 0,
    )


def head_shard(cfg, shard: Shard) -> Shard | None:
    """How a draft head of config `cfg` (a DraftHeadConfig) is held by rank `shard`: split like
    the target's layers (`shard`) where its attention heads, KV heads and MLP width all divide by
    the ranks, else None: the whole head on every rank, with no exchange in its layers. A head is
    optional speed, not the answer, so one that does not split still runs; every head shaped
    like its target splits wherever the target does."""
    dims = (cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size)
    return shard if all(n % shard.world == 0 for n in dims) else None


def shard_head(head, rank: int, world: int) -> None:
    """Keep this rank's share of every layer of a draft head (a DraftHead), in place, split as
    the target's layers are (`shard_attention`, `shard_mlp`); fc, the norms and the rotary stay
    whole. `head.cfg` becomes the rank's view (its heads and MLP width), from which the draft's
    KV cache is sized. The caller checks that it splits (`head_shard`)."""
    cfg = head.cfg
    with torch.no_grad():
        for layer in head.layers:
            shard_attention(layer.self_attn, rank, world)
            shard_mlp(layer.mlp, rank, world)
    head.cfg = dataclasses.replace(cfg, num_heads=cfg.num_heads // world, num_kv_heads=cfg.num_kv_heads // world,
                                   intermediate_size=cfg.intermediate_size // world)


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank r's device: cuda:r on CUDA (one GPU per rank), the CPU for every rank otherwise."""
    return torch.device("cuda", rank) if device.type == "cuda" else device


def init_ranks(rank: int, world: int, port: int, device: torch.device) -> Ranks:
    """Join the group at tcp://127.0.0.1:port (NCCL on CUDA, gloo on the CPU) and open the
    control group (gloo)."""
    import os

    os.environ.update(RANK_ENV)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=device if device.type == "cuda" else None)
    control = dist.new_group(backend="gloo") if backend != "gloo" else None
    return Ranks(rank, world, control)

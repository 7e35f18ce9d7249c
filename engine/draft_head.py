"""The JetSpec/DFlash draft head: config, published-format load/save, forward, static draft KV.

Format (docs/DESIGN.md §4): a directory with `config.json` and `model.safetensors`; weights without
prefix (`layers.{i}.self_attn.q_proj.weight`, `fc.weight`, `hidden_norm.weight`, `norm.weight`);
no embedding or lm_head (the target's are used). Published heads also ship `dflash.py` for
remote code: we never execute it. In memory q/k/v and gate/up are fused (layers.FusedLinear);
load and save go through `hf_parameters`, i.e. the published names.

Quantized storage (our extension, so a head file holds twice the parameters): config.json carries
`"quantization": {"method": "int8", "granularity": "per_output_channel"}`; then every 2-D weight
`X.weight` is stored as int8 [out, in] plus `X.weight_scale`, fp32 [out], with
weight = int8 * scale (symmetric, scale = max |row| / 127). 1-D weights (norms) stay in
`torch_dtype`. The loader dequantizes to the run dtype; files without the field load as before.

Forward: ctx = hidden_norm(fc(concat of target taps)); per draft layer, Q from the block
`[anchor, MASK x D]`, K/V from projections of [ctx ; block] (q/k RMSNorm, RoPE); context
fully visible, block lower-triangular when the head is causal. The context K/V of each layer
depend only on ctx, so they live in a static cache: each round projects only the new rows.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..kernels import add_rms_norm, paged_tree_attention, prefix_tensor, visible_keys, write_kv
from .errors import DraftHeadError
from .kv_cache import BLOCK_SIZE as KV_BLOCK
from .kv_cache import TrackedLength
from .layers import MLP, AttentionWeights, Linear, RMSNorm, Rotary, hf_parameters, init_random_, lm_head_logits
from .model_config import ModelConfig

CAUSAL_KEYS = ("causal_head", "causal", "is_causal")  # JetSpec, vLLM, SGLang spellings
INT8 = {"method": "int8", "granularity": "per_output_channel"}  # config.json's "quantization"
SCALE_SUFFIX = "_scale"  # X.weight -> X.weight_scale
ROPE_TYPES = ("default", "llama3", "yarn")  # what layers.Rotary implements


def default_target_layer_ids(num_target_layers: int, num_taps: int) -> tuple[int, ...]:
    """Taps spread evenly from layer 1 to layer num_layers - 3 (the published heads' spacing).
    The reference takes one tap per draft layer when a config names none (`from_json`)."""
    if num_taps == 1:
        return (num_target_layers // 2,)
    start, end = 1, num_target_layers - 3
    return tuple(int(round(start + i * (end - start) / (num_taps - 1))) for i in range(num_taps))


@dataclass(frozen=True)
class DraftHeadConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    block_size: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    causal: bool
    vocab_size: int | None = None
    max_position_embeddings: int = 32768
    rope_scaling: dict | None = None  # llama3 scaling as the target's (layers.Rotary); None: plain RoPE

    @property
    def max_depth(self) -> int:
        return self.block_size - 1

    @classmethod
    def from_json(cls, cfg: dict) -> "DraftHeadConfig":
        try:
            dflash = cfg.get("dflash_config") or {}
            causal = next((bool(dflash[k]) for k in CAUSAL_KEYS if k in dflash), None)
            if causal is None:  # some exports put the flag at the top level
                causal = next((bool(cfg[k]) for k in CAUSAL_KEYS if k in cfg), False)
            num_target_layers = cfg["num_target_layers"]
            n_heads = cfg["num_attention_heads"]
            ids = dflash.get("target_layer_ids") or cfg.get("target_layer_ids")
            if ids is None:  # the reference's default: one tap per draft layer, evenly spaced
                ids = default_target_layer_ids(num_target_layers, cfg["num_hidden_layers"])
            mask = dflash.get("mask_token_id", cfg.get("mask_token_id"))
            if mask is None:
                raise KeyError("dflash_config.mask_token_id")
            rope_theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 1e6)
            return cls(
                hidden_size=cfg["hidden_size"],
                num_layers=cfg["num_hidden_layers"],
                num_heads=n_heads,
                num_kv_heads=cfg.get("num_key_value_heads") or n_heads,
                head_dim=cfg.get("head_dim") or cfg["hidden_size"] // n_heads,
                intermediate_size=cfg["intermediate_size"],
                rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
                rope_theta=float(rope_theta),
                block_size=cfg["block_size"],
                num_target_layers=num_target_layers,
                target_layer_ids=tuple(int(i) for i in ids),
                mask_token_id=int(mask),
                causal=causal,
                vocab_size=cfg.get("vocab_size"),
                max_position_embeddings=cfg.get("max_position_embeddings", 32768),
                rope_scaling=_rope_scaling(cfg),
            )
        except KeyError as e:
            raise DraftHeadError(f"draft head config.json lacks the field {e.args[0]}") from None

    def to_json(self) -> dict:
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "hidden_act": "silu",
            "attention_bias": False,
            "tie_word_embeddings": False,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": {
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
                "causal_head": self.causal,
            },
            "torch_dtype": "bfloat16",
            # (omitted when None, so plain heads keep the published format byte for byte)
            **({"rope_scaling": dict(self.rope_scaling)} if self.rope_scaling else {}),
        }

    @classmethod
    def for_target(
        cls, target: ModelConfig, num_layers: int = 1, block_size: int = 16, num_taps: int | None = None,
        mask_token_id: int | None = None,
    ) -> "DraftHeadConfig":
        """A head shaped like the published ones for this target (used for random heads and training)."""
        taps = num_taps or min(5, max(1, target.num_layers - 3))
        return cls(
            hidden_size=target.hidden_size,
            num_layers=num_layers,
            num_heads=target.num_heads,
            num_kv_heads=target.num_kv_heads,
            head_dim=target.head_dim,
            intermediate_size=target.intermediate_size,
            rms_norm_eps=target.rms_norm_eps,
            rope_theta=target.rope_theta,
            block_size=block_size,
            num_target_layers=target.num_layers,
            target_layer_ids=default_target_layer_ids(target.num_layers, taps),
            mask_token_id=target.vocab_size - 1 if mask_token_id is None else mask_token_id,
            causal=True,
            vocab_size=target.vocab_size,
            max_position_embeddings=target.max_position_embeddings,
            rope_scaling=target.rope_scaling,
        )

    def check_against(self, target: ModelConfig, name: str) -> None:
        """Clear errors for a head that does not belong to this target."""
        problems = []
        if self.hidden_size != target.hidden_size:
            problems.append(f"hidden size {self.hidden_size} vs the model's {target.hidden_size}")
        if self.num_target_layers != target.num_layers:
            problems.append(f"made for a {self.num_target_layers}-layer target, the model has {target.num_layers}")
        bad = [i for i in self.target_layer_ids if not 0 <= i < target.num_layers]
        if bad:
            problems.append(f"target_layer_ids {bad} out of range for {target.num_layers} layers")
        if self.vocab_size is not None and self.vocab_size != target.vocab_size:
            problems.append(f"vocab {self.vocab_size} vs the model's {target.vocab_size}")
        if not 0 <= self.mask_token_id < target.vocab_size:
            problems.append(f"mask token {self.mask_token_id} outside the vocabulary ({target.vocab_size})")
        if self.block_size < 2:
            problems.append(f"block_size {self.block_size} drafts nothing")
        if problems:
            raise DraftHeadError(f"draft head {name} does not match the model: " + "; ".join(problems))


def _rope_scaling(cfg: dict) -> dict | None:
    """The head's RoPE scaling as layers.Rotary takes it (None for plain RoPE); a DraftHeadError for
    a kind it does not implement (the reference would apply it: ignoring it would draft with the
    wrong positions)."""
    scaling = cfg.get("rope_scaling") or None
    params = cfg.get("rope_parameters") or {}
    if scaling is None and params.get("rope_type", "default") != "default":  # transformers 5 spelling
        scaling = params
    if scaling is None:
        return None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in ROPE_TYPES:
        raise DraftHeadError(f"draft head rope_scaling of type {kind!r} is not supported "
                             f"(only {', '.join(ROPE_TYPES)})")
    if kind == "default":
        return None
    need = [k for k in ("factor", "original_max_position_embeddings") if k not in scaling]
    if need:
        raise DraftHeadError(f"draft head rope_scaling ({kind}) lacks {', '.join(need)}")
    return dict(scaling)


class DraftLayer(nn.Module):
    def __init__(self, cfg: DraftHeadConfig):
        super().__init__()
        self.self_attn = AttentionWeights(
            cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, False, True, cfg.rms_norm_eps
        )
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DraftKVCache(TrackedLength):
    """Per draft layer K/V of the projected context, [capacity, n_kv, head_dim]; rows append only.
    The length lives on the host and on the device (TrackedLength): the verify step appends the
    accepted rows and advances `device_length` inside its graph.

    Contiguous, but also viewed as a pool of blocks in logical order (no block table) so the
    draft's attention runs on the same paged tree kernel as the target's. Rows past the length are
    scratch: the draft block's own K/V and the fixed-size appends' surplus rows land there, so
    the capacity must exceed the longest context by a block (block_size rows).

    Held rows: a graphed AR round (no draft forward) does not append its accepted row; it keeps
    the row's taps in `held_taps` (`hold`), at index (committed length - draft length), and one
    later append projects all held rows at once (graphs.VerifyRunner.append_held): before the
    next draft forward or prefill append, and whenever `held_rows` rows are held. `held` counts
    them on the host as rounds are launched (an AR round holds exactly one row). held_rows is
    the block size, the longest append a drafting round makes (its path): the scratch rows past
    the context already take an append that long, and AR decoding pays one such append every
    block_size tokens instead of one a token."""

    def __init__(self, cfg: DraftHeadConfig, capacity: int, device: torch.device, dtype: torch.dtype):
        capacity = -(-capacity // KV_BLOCK) * KV_BLOCK
        self.k = torch.empty(cfg.num_layers, capacity, cfg.num_kv_heads, cfg.head_dim, device=device, dtype=dtype)
        self.v = torch.empty_like(self.k)
        self.device_length = torch.zeros((), dtype=torch.long, device=device)
        self._length = 0
        self.held_rows = cfg.block_size
        # zeros: the rows past the held count are projected into scratch rows too, never read
        self.held_taps = torch.zeros(self.held_rows, len(cfg.target_layer_ids) * cfg.hidden_size,
                                     device=device, dtype=dtype)
        self.held = 0

    @TrackedLength.length.setter
    def length(self, n: int) -> None:
        """A length the host decides (prefill, rollback, the bench) makes the context exactly the
        first n rows: nothing is held (a rollback sets `held` again after it)."""
        TrackedLength.length.fset(self, n)
        self.held = 0

    def hold(self, committed: torch.Tensor, taps: torch.Tensor, count: torch.Tensor) -> None:
        """An AR round's draft-context step (finish_round's `draft_append` for it, inside the verify
        graph): keep the accepted row's taps (taps[0]; count is 1) at index committed - length,
        `committed` being the target cache's device length before the round advances it."""
        index = (committed - self.device_length).reshape(1)
        self.held_taps.index_copy_(0, index, taps[:1])

    def pools(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (-1, KV_BLOCK, *self.k.shape[2:])
        return self.k[layer].view(shape), self.v[layer].view(shape)

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


@dataclass(frozen=True)
class _DraftBlock:
    """What a draft block of b positions reads besides the anchor and the context length."""

    masks: torch.Tensor  # [b - 1] the mask token's id, the block's positions after the anchor
    offsets: torch.Tensor  # [b] 0..b-1: the block's positions after the context
    mask: torch.Tensor  # [b, b] bool: causal (lower-triangular) or full
    keys: object  # kernels.VisibleKeys of `mask` on CUDA, None elsewhere


class DraftHead(nn.Module):
    def __init__(self, cfg: DraftHeadConfig):
        super().__init__()
        self.cfg = cfg
        n_taps = len(cfg.target_layer_ids)
        self.fc = Linear(n_taps * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings)
        self._blocks: dict[tuple[int, torch.device], _DraftBlock] = {}

    def _block(self, b: int, device: torch.device) -> "_DraftBlock":
        """The draft block's inputs that depend on its length alone, made once (outside any
        graph) rather than by ~15 small kernels in every draft forward."""
        block = self._blocks.get((b, device))
        if block is None:
            mask = torch.ones(b, b, dtype=torch.bool, device=device)
            mask = mask.tril() if self.cfg.causal else mask
            block = self._blocks[(b, device)] = _DraftBlock(
                masks=torch.full((b - 1,), self.cfg.mask_token_id, dtype=torch.long, device=device),
                offsets=torch.arange(b, device=device),
                mask=mask,
                keys=visible_keys(mask, shared=True) if device.type == "cuda" else None,  # causal or full: shared
            )
        return block

    def context_kv(self, taps: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (K, V) of context rows: [N, n_kv, head_dim] each, RoPE applied."""
        ctx = self.hidden_norm(self.fc(taps))
        cos, sin = self.rotary.cos_sin(positions, ctx.dtype)
        return [layer.self_attn.k_rope(ctx, cos, sin) for layer in self.layers]

    def _write_context(self, cache: DraftKVCache, taps: torch.Tensor, start: int | torch.Tensor) -> None:
        """Project taps into cache rows start.. (positions start..)."""
        rows = start + self._block(taps.shape[0], taps.device).offsets
        for i, (k, v) in enumerate(self.context_kv(taps, rows)):
            write_kv(*cache.pools(i), rows, k, v)  # identity block table: rows are slots

    def append_context(self, cache: DraftKVCache, taps: torch.Tensor) -> None:
        """Project newly committed tokens' taps into the cache (positions continue the cache).
        Any number of rows, eagerly: the prefill's path (once per chunk)."""
        n = taps.shape[0]
        if n == 0:
            return
        self._write_context(cache, taps, cache.length)
        cache.length = cache.length + n

    def append_accepted(self, cache: DraftKVCache, taps: torch.Tensor, count: torch.Tensor) -> None:
        """The round's append, with fixed shapes and no host values (inside the verify graph):
        project all P rows of `taps` (the accepted path's, padded to the path's fixed length) at
        the device length, then advance it by `count` (0-d, <= P). Rows past count are written
        but never read (attention reads `length` rows; the next append overwrites them)."""
        self._write_context(cache, taps, cache.device_length)
        cache.device_length.add_(count)

    def draft_logits(
        self, cache: DraftKVCache, anchor: torch.Tensor, depth: int, embed: nn.Embedding, lm_head_weight: torch.Tensor,
        length: int | torch.Tensor | None = None, vocab_split=None, upcast: bool = True,
    ) -> torch.Tensor:
        """fp32 logits for depths 1..depth: [depth, vocab]. `anchor` is a 0-d token id tensor.
        `lm_head_weight`, `vocab_split`: the target's (TargetModel.lm_head_weight, .vocab_split).
        `upcast=False`: the lm_head's own dtype where it can (layers.lm_head_logits).

        The block [anchor, MASK x D] sits at positions length.. and sees the first `length`
        context rows (default: the cache's length; a device scalar inside a CUDA graph). Its own
        K/V go to the cache rows right after the context, which are scratch until the next
        append overwrites them, so attention is the same paged tree kernel as the target's:
        context fully visible, block lower-triangular (causal) or full, cost flat in the length.
        """
        # A causal head's first depth+1 positions do not depend on later ones: run only those.
        b = depth + 1 if self.cfg.causal else self.cfg.block_size
        block = self._block(b, anchor.device)
        ids = torch.cat([anchor.reshape(1).long(), block.masks])
        length = cache.length if length is None else length
        rows = length + block.offsets
        h = embed(ids)
        cos, sin = self.rotary.cos_sin(rows, h.dtype)
        mask, keys = block.mask, block.keys
        prefix = prefix_tensor(length, h.device) if h.is_cuda else length
        eps = self.cfg.rms_norm_eps
        x = self.layers[0].input_layernorm(h)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            k_pool, v_pool = cache.pools(i)
            q = attn.qkv_rope_write(x, cos, sin, k_pool, v_pool, rows)
            # the cache's blocks are in logical order: no block table
            o = paged_tree_attention(q, k_pool, v_pool, None, prefix, mask, attn.head_dim**-0.5, keys)
            # Residual adds fused with the following norm, as in the target model.
            x, h = add_rms_norm(attn.o_proj.forward_partials(o.reshape(b, -1)), h, layer.post_attention_layernorm.weight, eps)
            next_norm = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.norm
            x, h = add_rms_norm(layer.mlp.forward_partials(x), h, next_norm.weight, eps)
        return lm_head_logits(x[1 : depth + 1], lm_head_weight, vocab_split, upcast)  # x is the final-normed block

    # -- weights ---------------------------------------------------------------------------
    def init_random(self, seed: int, std: float = 0.02, shard=None) -> None:
        """`shard`: see init_random_ (the whole head's numbers, this rank's part kept)."""
        init_random_(self, seed, std, shard)

    def save(self, directory: str | Path, int8: bool = False) -> None:
        """Write the published format: config.json + model.safetensors in the weights' dtype; with
        `int8`, the 2-D weights quantized per output channel (the module docstring's format)."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        # Published names; fused weights are split into copies (safetensors refuses shared storage).
        state = {k: v.detach().to("cpu", copy=True) for k, v in hf_parameters(self)}
        dtype = next(iter(state.values())).dtype
        if int8:
            for name in [k for k, v in state.items() if v.dim() == 2]:
                state[name], state[name + SCALE_SUFFIX] = quantize_int8(state[name])
        tmp = directory / "model.safetensors.tmp"
        save_file(state, str(tmp), metadata={"format": "pt"})
        tmp.replace(directory / "model.safetensors")
        cfg = self.cfg.to_json()
        cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
        if int8:
            cfg["quantization"] = dict(INT8)
        (directory / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row: (int8 [out, in], fp32 scale [out]), w ~ q * scale[:, None]."""
    w = w.float()
    scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.float()[:, None]


def build_head(cfg: DraftHeadConfig, device: torch.device, dtype: torch.dtype, shard=None) -> DraftHead:
    """An empty head on `device` in `dtype`. `shard` (a parallel.Shard, from parallel.head_shard):
    the unallocated head is cut to that tensor-parallel rank's part (parallel.shard_head)
    before anything is allocated."""
    with torch.device("meta"):
        head = DraftHead(cfg)
    if shard is not None:
        from .parallel import shard_head

        shard_head(head, shard.rank, shard.world)
    head = head.to_empty(device=device).to(dtype)
    head.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings).to(device)
    return head.eval().requires_grad_(False)


def load_head_dir(directory: Path, device: torch.device, dtype: torch.dtype, shard=None) -> DraftHead:
    """Load a head directory in the published format (our own module; remote code is ignored).
    `shard` (a parallel.Shard): keep only that tensor-parallel rank's part of each layer, where
    the head splits (parallel.head_shard); each tensor is read (and dequantized) whole, one at a
    time, and cut, so the rank holds exactly its part of the unsplit head."""
    from safetensors import safe_open

    directory = Path(directory)
    cfg_path, weights = directory / "config.json", directory / "model.safetensors"
    if not cfg_path.is_file():
        raise DraftHeadError(f"draft head {directory} has no config.json")
    try:
        raw = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise DraftHeadError(f"draft head config {cfg_path} is not valid JSON ({e})") from None
    if not weights.is_file():
        raise DraftHeadError(f"draft head {directory} has no model.safetensors")
    cfg = DraftHeadConfig.from_json(raw)
    quantized = raw.get("quantization")
    if quantized is not None and quantized != INT8:
        raise DraftHeadError(f"draft head {directory} has an unsupported quantization {quantized!r} "
                             f"(this version reads {INT8!r})")
    if shard is not None:
        from .parallel import head_shard

        shard = head_shard(cfg, shard)
    head = build_head(cfg, device, dtype, shard)
    params = dict(hf_parameters(head))  # published name -> parameter (or rows of a fused one)
    seen = set()
    with safe_open(str(weights), framework="pt", device="cpu") as st:
        tensors = {key.removeprefix("model."): key for key in st.keys()}  # some exports keep a `model.` prefix
        for name, key in tensors.items():
            base = name.removesuffix(SCALE_SUFFIX)
            if name != base and quantized and base in params and params[base].dim() == 2:
                continue  # read with its weight
            if name not in params:
                raise DraftHeadError(f"draft head {directory} has an unexpected weight {key}")
            t = st.get_tensor(key)
            dim = shard.take(name) if shard is not None else None
            expected = list(params[name].shape)
            if dim is not None:
                expected[dim] *= shard.world
            if list(t.shape) != expected:
                raise DraftHeadError(
                    f"draft head weight {key} has shape {tuple(t.shape)}, expected {tuple(expected)}"
                )
            if t.dtype == torch.int8 or (quantized and t.dim() == 2):
                t = _dequantized(directory, name, t, tensors, st, quantized is not None)
            if dim is not None:
                t = shard.part(t, dim)
            with torch.no_grad():
                params[name].copy_(t.to(device=device, dtype=dtype))
            seen.add(name)
    missing = sorted(set(params) - seen)
    if missing:
        raise DraftHeadError(f"draft head {directory} lacks weights: {', '.join(missing[:4])}")
    return head


def _dequantized(directory: Path, name: str, q: torch.Tensor, tensors: dict, st, quantized: bool) -> torch.Tensor:
    """An int8 weight of a quantized head file, dequantized with its scale (fp32); clear errors
    for anything that does not follow the format."""
    where = f"draft head {directory}"
    if q.dim() != 2:
        raise DraftHeadError(f"{where}: weight {name} is int8, but only 2-D weights may be quantized")
    if not quantized:
        raise DraftHeadError(f"{where}: weight {name} is int8 but config.json names no quantization")
    if q.dtype != torch.int8:
        raise DraftHeadError(f"{where}: weight {name} is {str(q.dtype).removeprefix('torch.')}, "
                             "but config.json says its 2-D weights are int8")
    key = tensors.get(name + SCALE_SUFFIX)
    if key is None:
        raise DraftHeadError(f"{where}: int8 weight {name} has no scale {name + SCALE_SUFFIX}")
    scale = st.get_tensor(key)
    if scale.shape != (q.shape[0],) or not scale.is_floating_point():
        raise DraftHeadError(f"{where}: scale {name + SCALE_SUFFIX} must be a float vector of {q.shape[0]} "
                             f"(one per output channel), got {str(scale.dtype).removeprefix('torch.')} "
                             f"{tuple(scale.shape)}")
    if not torch.isfinite(scale).all():
        raise DraftHeadError(f"{where}: scale {name + SCALE_SUFFIX} holds non-finite values")
    return dequantize_int8(q, scale)

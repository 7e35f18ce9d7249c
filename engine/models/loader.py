"""load_engine: from a MODEL argument and a --draft-head argument to a ready SpecEngine."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch

from ..draft_head import DraftHead, DraftHeadConfig, build_head, load_head_dir
from ..engine import SpecEngine
from ..errors import ConfigError, DeviceMemoryError, DraftHeadError, ModelNotFoundError
from ..gemma4 import Gemma4TargetModel, build_gemma4_target
from ..hybrid_model import HybridTargetModel, build_hybrid_target
from ..model import TargetModel, build_target
from ...kernels.tree_attention import MAX_FP32_HEAD_DIM, MAX_HEAD_DIM
from ..model_config import ModelConfig
from ..params import check_head_depth
from .model_sources import HEAD_NOTES, ModelSource, as_model_source, download_hub_dir, load_tokenizer

ProgressFn = Callable[[str, float | None], None]

DEFAULT_MAX_CONTEXT_CPU = 8192
DEFAULT_MAX_CONTEXT_GPU = 32768


def default_max_context(device: torch.device) -> int:
    """The context the engine is sized for when the caller names none (the app's chats)."""
    return DEFAULT_MAX_CONTEXT_GPU if device.type == "cuda" else DEFAULT_MAX_CONTEXT_CPU
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {device} asked for, but torch sees no CUDA device")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; choose auto, float32, bfloat16 or float16")
    return DTYPES[dtype]


# `--tp` left unset: one GPU while the target's weights take at most this share of its memory
# (the rest holds the KV cache, the draft head, activations and graphs), else the fewest GPUs
# over which the weights split to that share. Measured: the 235B at --tp 4 holds 111.3 GiB of
# weights a rank and peaked at 115.6 GiB of an H200's ~140 (docs/performance.md).
TP_WEIGHT_SHARE = 0.85


def target_kind(cfg: ModelConfig) -> tuple[type[TargetModel], Callable[..., TargetModel]]:
    """The target's model class for this config and the function that builds it on a device."""
    if cfg.hybrid is not None:
        return HybridTargetModel, build_hybrid_target
    if cfg.gemma4 is not None:
        return Gemma4TargetModel, build_gemma4_target
    return TargetModel, build_target


def target_weight_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """The bytes of the target's weights in `dtype`, counted on a model built on the meta device
    (nothing allocated; a tied lm_head counted once)."""
    cls, _ = target_kind(cfg)
    with torch.device("meta"):
        model = cls(cfg)
    return sum(p.numel() for p in model.parameters()) * dtype.itemsize


def choose_tp(cfg: ModelConfig, weight_bytes: int, gpu_bytes: int, gpus: int, name: str) -> int:
    """The tensor-parallel ranks for `--tp` left unset: 1 where the weights fit one GPU
    (TP_WEIGHT_SHARE of `gpu_bytes`), else the fewest of the `gpus` GPUs over which the model
    splits (parallel.check_splits) and each rank's share fits; DeviceMemoryError where none does."""
    from ..parallel import check_splits

    room = TP_WEIGHT_SHARE * gpu_bytes
    if weight_bytes <= room:
        return 1
    why = ""
    for n in range(2, gpus + 1):
        try:
            check_splits(cfg, n)
        except ValueError as err:
            why = f" ({n} GPUs: {err})"  # the widest split's reason
            continue
        if weight_bytes / n <= room:
            return n
    raise DeviceMemoryError(
        f"{name}'s weights take {weight_bytes / 1e9:.1f} GB, more than {TP_WEIGHT_SHARE:.0%} of "
        f"{'each' if gpus > 1 else 'the'} GPU's {gpu_bytes / 1e9:.1f} GB, and no split over the {gpus} GPU"
        f"{'s' if gpus > 1 else ''} here holds them{why}; use a machine with more GPU memory, or pass --tp to try anyway")


def auto_tp(model: str | ModelSource | None, device: str = "auto", dtype: str = "auto",
            progress: ProgressFn | None = None) -> int:
    """`--tp` left unset: 1 on a CPU (the model not read), else `choose_tp` for this model's
    weights and the GPUs torch sees."""
    dev = resolve_device(device)
    if dev.type != "cuda":
        return 1
    source = as_model_source(model, progress)
    cfg = ModelConfig.from_hf(source.hf_config)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    gpu_bytes = torch.cuda.get_device_properties(index).total_memory
    return choose_tp(cfg, target_weight_bytes(cfg, resolve_dtype(dtype, dev)), gpu_bytes, torch.cuda.device_count(),
                     source.name)


def unreadable_safetensors(files: list[Path]) -> tuple[Path, str] | None:
    """The first file whose safetensors header cannot be read (truncated, corrupt), with the reason."""
    from safetensors import SafetensorError, safe_open

    for f in files:
        try:
            with safe_open(str(f), framework="pt", device="cpu"):
                pass
        except (SafetensorError, OSError) as err:
            return f, str(err).splitlines()[0] if str(err) else type(err).__name__
    return None


def refetch_hint(source: ModelSource) -> str:
    """What to do about damaged files of `source`, as the end of a sentence."""
    if source.kind in ("embedded", "gguf") and source.path is not None:
        return (f"remove the converted copy with `jetspec-chat cache remove {source.path.name}` and start again "
                f"to convert it anew")
    if source.kind == "hub":
        return f"download it again with `hf download {source.name} --force-download`"
    return "copy or export the model again"


def load_target(source: ModelSource, device: torch.device, dtype: torch.dtype, shard=None) -> TargetModel:
    """`shard` (a parallel.Shard): build and fill only that rank's part of the decoder layers
    (its memory alone is ever allocated; safetensors are read slice by slice)."""
    from safetensors import SafetensorError

    cfg = ModelConfig.from_hf(source.hf_config)
    widest = max(cfg.head_dim, cfg.gemma4.global_head_dim if cfg.gemma4 is not None else 0)
    if device.type == "cuda" and widest > MAX_HEAD_DIM:
        raise ModelNotFoundError(
            f"{source.name} runs on the CPU only: its {widest}-wide attention heads are wider than the GPU "
            f"tree attention takes (at most {MAX_HEAD_DIM}); use --device cpu.")
    if device.type == "cuda" and dtype == torch.float32 and widest > MAX_FP32_HEAD_DIM:
        raise ModelNotFoundError(
            f"{source.name} runs in float32 on the CPU only: its {widest}-wide attention heads are wider than the "
            f"GPU tree attention takes in float32 (at most {MAX_FP32_HEAD_DIM}); use --dtype bfloat16 or --device cpu.")
    try:
        if shard is None:
            _, build = target_kind(cfg)
            model = build(cfg, device, dtype)
        else:
            from ..parallel import shard_target

            model = build_target(cfg, device, dtype, split=lambda m: shard_target(m, shard.rank, shard.world))
        part = {} if shard is None else {"shard": shard}  # only decoder-only Qwen/Llama targets shard
        if source.path is None:
            model.init_random(source.seed, **part)
        else:
            model.load_safetensors(source.path, **part)
    except torch.OutOfMemoryError:
        raise DeviceMemoryError(
            f"out of device memory loading {source.name}; use a smaller model or --dtype bfloat16"
        ) from None
    except (SafetensorError, OSError) as err:  # a truncated or corrupt weight file
        bad = unreadable_safetensors(sorted(source.path.glob("*.safetensors")))
        what = f"{bad[0]} is truncated or corrupt ({bad[1]})" if bad else f"the weights of {source.name} are unreadable ({err})"
        raise ModelNotFoundError(f"{what}; {refetch_hint(source)}.") from None
    except ValueError as err:  # a weight missing, unexpected or of the wrong shape
        raise ModelNotFoundError(f"{source.path} does not hold {source.name}'s weights ({err}); "
                                 f"{refetch_hint(source)}.") from None
    return model


def load_draft_head(
    head_arg: str | None, source: ModelSource, target_cfg: ModelConfig, device: torch.device, dtype: torch.dtype,
    shard=None,
) -> tuple[DraftHead | None, str | None]:
    """Resolve the head: the given argument, else the model's default. Returns (head, display name).

    Argument forms: a directory in the published format, a hub id, `random` / `random:LAYERS`
    (a random head shaped for this target), or `none` (plain AR only). `shard` (a
    parallel.Shard): hold only that tensor-parallel rank's part of the head's layers where the
    head splits (parallel.head_shard; random weights drawn whole and cut).
    """
    from safetensors import SafetensorError

    if head_arg is None:
        if source.random_head is not None:
            shape = source.random_head
            cfg = DraftHeadConfig.for_target(
                target_cfg, num_layers=shape.get("num_hidden_layers", 1), block_size=shape.get("block_size", 16)
            )
            return _random_head(cfg, source.seed + 1, device, dtype, shard), random_head_name(cfg)
        head_arg = source.default_draft_head
        if head_arg is None:
            return None, None
    if head_arg == "none":
        return None, None
    if head_arg == "random" or head_arg.startswith("random:"):
        layers = int(head_arg.split(":", 1)[1]) if ":" in head_arg else 1
        cfg = DraftHeadConfig.for_target(target_cfg, num_layers=layers, block_size=16)
        return _random_head(cfg, 1, device, dtype, shard), random_head_name(cfg)
    path = Path(head_arg).expanduser()
    if not path.exists():
        if head_arg.count("/") != 1 or head_arg.startswith((".", "/", "~")):
            raise DraftHeadError(f"draft head {head_arg} not found (no such directory)")
        path = download_hub_dir(head_arg, ["config.json", "model.safetensors"])
    try:
        head = load_head_dir(path, device, dtype, shard)
    except (SafetensorError, OSError) as err:  # a truncated or corrupt model.safetensors
        what = "reinstall jetspec-chat" if head_arg == source.default_draft_head else "download or copy the head again"
        raise DraftHeadError(
            f"The draft head's {path / 'model.safetensors'} is truncated or corrupt ({str(err).splitlines()[0]}); "
            f"{what}, or start with --draft-head none."
        ) from None
    head.cfg.check_against(target_cfg, head_arg)
    if source.kind == "embedded" and head_arg == source.default_draft_head:
        return head, f"{source.name} head (shipped)"  # a short name for the header, not the install path
    return head, head_arg


def _random_head(cfg: DraftHeadConfig, seed: int, device: torch.device, dtype: torch.dtype, shard) -> DraftHead:
    if shard is not None:
        from ..parallel import head_shard

        shard = head_shard(cfg, shard)
    head = build_head(cfg, device, dtype, shard)
    head.init_random(seed, shard=shard)
    return head


def stop_token_ids(tokenizer, source: ModelSource) -> tuple[int, ...]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if source.path is not None and (source.path / "generation_config.json").is_file():
        eos = json.loads((source.path / "generation_config.json").read_text()).get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    return tuple(sorted(ids))


def random_head_name(cfg: DraftHeadConfig) -> str:
    """How a random head is named to the user, e.g. 'random (1 layer, block 16)'."""
    return f"random ({cfg.num_layers} layer{'' if cfg.num_layers == 1 else 's'}, block {cfg.block_size})"


def load_engine(
    model: str | ModelSource | None,
    draft_head: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    max_context: int | None = None,
    progress: ProgressFn | None = None,
    depth: int | None = None,
    shard=None,
) -> SpecEngine:
    """`model`: a MODEL argument, or the `ModelSource` the caller resolved already (then it is
    not resolved again). `depth`: the tree depth the caller will ask for, checked against the
    draft head before the target's weights load (the head is small and loads first), so a wrong
    depth costs no load.
    `shard` (a parallel.Shard): load only that tensor-parallel rank's part of the target and of
    the draft head's layers."""
    report = progress or (lambda what, frac: None)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    source = as_model_source(model, progress)
    target_cfg = ModelConfig.from_hf(source.hf_config)
    report("Loading the draft head", None)
    head, head_name = load_draft_head(draft_head, source, target_cfg, dev, dt, shard)
    if head is None and draft_head is None and source.name.lower() in HEAD_NOTES:
        report(HEAD_NOTES[source.name.lower()], None)
    check_head_depth(depth, head.cfg.max_depth if head is not None else None)
    size = "" if source.path is None else f" ({sum(f.stat().st_size for f in source.path.glob('*.safetensors')) / 1e9:.1f} GB)"
    report(f"Loading {source.name}{size} on {dev} ({str(dt).removeprefix('torch.')})", None)
    target = load_target(source, dev, dt, shard)
    report(f"Reading the {source.name} tokenizer", None)
    tokenizer = load_tokenizer(source)
    if max_context is None:
        max_context = default_max_context(dev)
    engine = SpecEngine(
        target, tokenizer, head, model_name=source.name, head_name=head_name, max_context=max_context,
        stop_token_ids=stop_token_ids(tokenizer, source), source=source,
    )
    report("ready", 1.0)
    return engine

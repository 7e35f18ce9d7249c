"""Head construction (shape from the target and the config, MASK token), initialization
(random, from the target's last layers, or from a trained head) and export to the published format."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch

from ..engine.draft_head import DraftHead, DraftHeadConfig, build_head, default_target_layer_ids
from ..engine.errors import ConfigError
from ..engine.layers import hf_parameters
from .config import TrainConfig


def head_config_for(target_cfg, cfg: TrainConfig, vocab_embed: torch.Tensor | None = None,
                    fallback_mask: int | None = None) -> DraftHeadConfig:
    taps = cfg.taps or default_target_layer_ids(target_cfg.num_layers, min(5, max(1, target_cfg.num_layers - 3)))
    bad = [i for i in taps if not 0 <= i < target_cfg.num_layers]
    if bad:
        raise ConfigError(f"--taps {bad} out of range: the target has layers 0..{target_cfg.num_layers - 1}")
    head_cfg = DraftHeadConfig.for_target(target_cfg, cfg.draft_layers, cfg.block_size, num_taps=len(taps),
                                          mask_token_id=cfg.mask_token_id)
    head_cfg = dataclasses.replace(head_cfg, target_layer_ids=tuple(taps))
    if cfg.intermediate_size is not None:
        head_cfg = dataclasses.replace(head_cfg, intermediate_size=cfg.intermediate_size)
    if cfg.attention_heads is not None:
        if cfg.attention_heads % head_cfg.num_kv_heads:
            raise ConfigError(f"--attention-heads must be a multiple of the target's {head_cfg.num_kv_heads} KV heads, "
                              f"got {cfg.attention_heads}")
        head_cfg = dataclasses.replace(head_cfg, num_heads=cfg.attention_heads)
    if cfg.mask_token_id is None and vocab_embed is not None and fallback_mask is not None:
        head_cfg = dataclasses.replace(head_cfg, mask_token_id=pick_mask_token(vocab_embed, head_cfg.mask_token_id,
                                                                               fallback_mask))
    return head_cfg


def pick_mask_token(embed: torch.Tensor, default: int, fallback: int) -> int:
    """The unused last vocabulary row is the usual MASK, unless its embedding is (near) zero:
    a zero MASK embedding gives all MASK rows identical, norm-free inputs, which starves the
    head of depth information. Then use `fallback` (e.g. the pad token), a trained row."""
    norms = embed[:: max(1, embed.shape[0] // 4096)].float().norm(dim=-1)
    return default if float(embed[default].float().norm()) > 0.1 * float(norms.median()) else fallback


def init_head(head: DraftHead, how: str, seed: int, hf_model=None) -> None:
    """random; target (the target's last layers into the draft layers); or a trained head's
    directory (published format) to continue training it with fresh data and a new schedule.
    A directory must hold a head of this shape, or one with fewer layers or a narrower MLP
    (same widths, block, taps, MASK otherwise): it is then grown (`load_grown`)."""
    head.init_random(seed)
    if how == "random":
        return
    if how != "target":
        from ..engine.draft_head import load_head_dir

        trained = load_head_dir(Path(how), next(head.parameters()).device, torch.float32)
        want, got = head.cfg.to_json(), trained.cfg.to_json()
        diff = [k for k in set(want) | set(got) if k not in GROWABLE and not _same(want.get(k), got.get(k))]
        diff += [k for k in GROWABLE if got[k] > want[k]]  # a head grows, never shrinks
        if diff:
            raise ConfigError(f"--init {how} holds a head of another shape ({', '.join(sorted(diff))} differ); "
                              "pass the same --attention-heads, --block-size and --taps, and at least its "
                              "--draft-layers and --intermediate-size")
        with torch.no_grad():
            load_grown(head, trained)
        return
    # Copy the target's last layers (same widths by construction); fc stays random.
    src_layers = hf_model.model.layers
    first = len(src_layers) - len(head.layers)
    with torch.no_grad():
        for i, layer in enumerate(head.layers):
            src = dict(src_layers[first + i].named_parameters())
            for name, p in hf_parameters(layer):  # transformers names (fused weights: their rows)
                if name in src and src[name].shape == p.shape:
                    p.copy_(src[name].float())
        head.norm.weight.copy_(hf_model.model.norm.weight.float())


# What --init may grow: a head with more layers or a wider MLP than the one it continues.
GROWABLE = ("num_hidden_layers", "intermediate_size")


def load_grown(head: DraftHead, trained: DraftHead) -> None:
    """`trained`'s weights into `head`, which has as many or more layers and an MLP as wide or
    wider, such that `head` drafts exactly as `trained` does (function-preserving growth): each
    extra layer's o_proj and down_proj are zero, so the residual stream passes through it, and
    the extra MLP columns meet zero columns of down_proj. Their other weights stay random, so
    they learn as soon as those projections move off zero; the trained part keeps training."""
    src = trained.state_dict()
    old_i, new_i = trained.cfg.intermediate_size, head.cfg.intermediate_size
    for name, p in head.state_dict().items():
        layer = int(name.split(".")[1]) if name.startswith("layers.") else -1
        if layer >= trained.cfg.num_layers:  # a new layer: adds nothing yet
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.zero_()
        elif name.endswith("mlp.gate_up_proj.weight"):  # [gate rows; up rows], old rows first in each
            p[:old_i].copy_(src[name][:old_i])
            p[new_i : new_i + old_i].copy_(src[name][old_i:])
        elif name.endswith("mlp.down_proj.weight"):
            p[:, :old_i].copy_(src[name])
            p[:, old_i:].zero_()
        else:
            p.copy_(src[name])


def _same(a, b) -> bool:
    """Config values equal (floats up to fp32 rounding: a saved rms_norm_eps comes back as 9.99e-07)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6)
    return a == b


def export_head(head: DraftHead, directory: Path, dtype: torch.dtype, info: dict | None = None,
                int8: bool = False) -> Path:
    """Write the published format (loadable by load_head_dir) in `dtype`; with `int8`, its 2-D
    weights quantized per output channel (draft_head's format; the norms stay in `dtype`)."""
    out = build_head(head.cfg, torch.device("cpu"), dtype)
    out.load_state_dict({k: v.detach().cpu() for k, v in head.state_dict().items()})
    out.save(directory, int8=int8)
    if info is not None:
        (Path(directory) / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    return Path(directory)


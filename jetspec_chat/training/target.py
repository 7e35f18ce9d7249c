"""The target side of training: features from the frozen transformers model of the target's
weights, computed on the fly per batch (caching taps to disk would be far too big)."""
from __future__ import annotations

import torch


@torch.no_grad()
def target_features(hf_model, input_ids: torch.Tensor, taps: tuple[int, ...]):
    """(taps [B, T, n_taps*H], final normed hidden [B, T, H]) from one frozen forward.

    Batches are right padded, so plain causal attention already keeps the pads out of every
    real position: no attention mask is passed, which keeps SDPA on its fused causal kernels.

    Taps are captured with hooks on the decoder layers: tap L = output of decoder layer L. (In
    transformers 5, output_hidden_states' last entry is the *normed* final state, not the last
    layer's raw output, so hooks are the unambiguous way.)"""
    layers = hf_model.model.layers
    captured: dict[int, torch.Tensor] = {}

    def hook(idx):
        def fn(_module, _inputs, output):
            captured[idx] = output[0] if isinstance(output, tuple) else output
        return fn

    handles = [layers[i].register_forward_hook(hook(i)) for i in sorted(set(taps))]
    try:
        out = hf_model.model(input_ids=input_ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return torch.cat([captured[i] for i in taps], dim=-1), out.last_hidden_state


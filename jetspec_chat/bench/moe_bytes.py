"""Weight bytes a target forward over N rows must read: the bandwidth floor of an AR step (N = 1)
and of a verify over N tree nodes.

A dense model reads every weight once whatever N is. A MoE layer reads only the experts its rows
route to: one row picks k of E experts, so an AR step reads k experts per layer, but N rows read
the union of their picks. Under uniform routing (each row a uniformly random k-subset,
independent rows) an expert is missed by one row with probability 1 - k/E, so the expected
number of distinct experts is E * (1 - (1 - k/E)^N). For Qwen3-30B-A3B (E 128, k 8) that is
8, 82.4, 125.9, 128.0 and 128.0 experts per layer at N = 1, 16, 64, 128, 256: a 16-node tree
already reads 10x the experts of an AR step. For gpt-oss-20b (E 32, k 4): 4, 28.2, 32.0, 32.0 and
32.0; its active floor (attention, 4 of 32 experts with their biases, routers, one embedding row,
lm_head: 3.6 B parameters, bf16 with the MXFP4 experts dequantized at load) is 7.2 GB a step.
"""
from __future__ import annotations

from torch import nn

from ..engine.gemma4 import Gemma4Experts
from ..engine.layers import GptOssExperts, MoEExperts

EXPERT_STACKS = (MoEExperts, GptOssExperts, Gemma4Experts)  # one MoE layer's experts, stacked on dim 0


def expected_distinct_experts(num_experts: int, top_k: int, rows: int) -> float:
    """Expected distinct experts N rows touch in one layer, each row routed to a uniformly random
    set of top_k of num_experts experts."""
    if rows < 1:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** rows)


def _bytes(t) -> int:
    return t.numel() * t.element_size()


def expected_weight_bytes(target: nn.Module, rows: int) -> float:
    """Expected weight bytes a forward over `rows` tokens reads: every non-expert weight once
    (attention, norms, routers, dense MLPs, lm_head: this rank's rows under tensor parallelism),
    `rows` rows of the input embedding (a whole tied lm_head reads the whole matrix anyway), and per MoE layer its expected distinct experts
    (uniform routing) times one expert's bytes (its weights and, for gpt-oss, its biases). Equals all the weights for a dense model."""
    cfg = target.cfg
    embed = target.model.embed_tokens.weight
    experts = [m for m in target.modules() if isinstance(m, EXPERT_STACKS)]
    expert_params = {id(p) for m in experts for p in m.parameters()}
    dense = sum(_bytes(p) for p in target.parameters() if p is not embed and id(p) not in expert_params)
    lookups = min(rows, embed.shape[0]) * embed.shape[1] * embed.element_size()
    lm_head = target.lm_head_weight()
    if target.lm_head is not None:  # untied: its weight is among `dense`
        embed_bytes = lookups
    elif lm_head.shape[0] == embed.shape[0]:  # tied and whole: the lookups fall inside it
        embed_bytes = _bytes(embed)
    else:  # tied, this rank's vocabulary rows (tensor parallelism): they and the lookups
        embed_bytes = _bytes(lm_head) + lookups
    moe = 0.0
    for m in experts:
        one_expert = sum(_bytes(p) for p in m.parameters()) // m.gate_up_proj.shape[0]  # gpt-oss: biases too
        moe += expected_distinct_experts(cfg.num_experts, cfg.num_experts_per_tok, rows) * one_expert
    return dense + embed_bytes + moe

"""τ replayed on fixed greedy answers: the tree decoder's acceptance without its verify forward.

Greedy decoding is fixed by the committed prefix, and on the target's own greedy answer every
round's committed prefix is a prefix of that answer: the round anchored at position a accepts
the deepest tree path that spells answer[a+1], answer[a+2], ... So one target forward over
prompt + answer (the head's context features), one batched head forward (the draft at every
possible anchor, top-K per depth kept) and then one tree build per round replay the decoder
exactly, up to floating-point near-ties (a test compares with the real engine, round by round).

What it is for: the real decoder costs one verify forward per round and per setting; here the
forwards are paid once and every (budget, width, tree temperature) setting costs only tree
builds. That makes it cheap, also on a CPU with the 1.5B target, to ask where τ is lost: in the
head (the answer's token is not among the top-K at that depth at all) or in the tree (it was,
but the budget went elsewhere). The reported τ of a head stays the real decoder's (evaluate.py's
Evaluator); this is the analysis tool behind `jetspec-chat train-head --stage replay`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..kernels import accum_tree
from ..engine.draft_head import DraftHead
from ..engine.params import DEFAULT_WIDTH, MAX_WIDTH
from ..engine.tree import static_tree_size
from .batch_decode import BatchDecoder
from .forward import block_attention_mask, block_ids, context_len, head_forward
from .target import target_features


@dataclass(frozen=True)
class TreeSetting:
    budget: int
    width: int = DEFAULT_WIDTH
    temperature: float = 1.0  # the tree is built from softmax(logits / T): < 1 deeper, > 1 bushier


@dataclass
class Drafts:
    """The head's draft at every anchor of one greedy answer."""

    ids: torch.Tensor  # [L] prompt + answer (+ the stop token when the answer ended on one)
    first_anchor: int  # index of the answer's first token: the anchor of round 0
    logits: torch.Tensor  # [A, D, K] fp32 top-K draft logits per depth, descending; row i = anchor first_anchor+i
    tokens: torch.Tensor  # [A, D, K] int64
    lse: dict[float, torch.Tensor]  # temperature -> [A, D] logsumexp over the vocab of logits / T

    def log_probs(self, i: int, depth: int, width: int, temperature: float) -> torch.Tensor:
        """[depth, width] draft log-probs at temperature T of the block anchored at row i."""
        return self.logits[i, :depth, :width] / temperature - self.lse[temperature][i, :depth, None]


@torch.no_grad()
def draft_all(head: DraftHead, hf_model, ids: torch.Tensor, first_anchor: int, top_k: int,
              temperatures: tuple[float, ...] = (1.0,), chunk: int = 16) -> Drafts:
    """Draft at every anchor first_anchor .. len(ids)-2 of `ids` with the training forward
    (the same arithmetic as the engine's draft, batched over blocks)."""
    cfg = head.cfg
    dev = next(head.parameters()).device
    ids = ids.to(dev).long()
    taps, _ = target_features(hf_model, ids[None], cfg.target_layer_ids)
    taps = taps.to(next(head.parameters()).dtype)
    embed, lm_head = hf_model.get_input_embeddings(), hf_model.get_output_embeddings().weight
    anchors = torch.arange(first_anchor, len(ids) - 1, device=dev)
    depth, k = cfg.block_size - 1, min(top_k, lm_head.shape[0])
    parts_l, parts_t, parts_lse = [], [], {t: [] for t in temperatures}
    for s in range(0, anchors.shape[0], chunk):
        a = anchors[s : s + chunk][None]
        q_len = a.shape[1] * cfg.block_size
        c = context_len(a, torch.ones_like(a, dtype=torch.bool), q_len)
        t = F.pad(taps, (0, 0, 0, max(0, c - taps.shape[1])))[:, :c]
        embeds = embed(block_ids(ids[None], a, cfg.block_size, cfg.mask_token_id)).to(taps.dtype)
        visible = block_attention_mask(a, c, cfg.block_size, cfg.causal)
        h = head_forward(head, t, a, embeds, visible).view(a.shape[1], cfg.block_size, -1)[:, 1:]
        logits = (h.to(lm_head.dtype) @ lm_head.t()).float()  # [M, D, V]
        top = logits.topk(k, dim=-1)
        parts_l.append(top.values.cpu())
        parts_t.append(top.indices.cpu())
        for temp in temperatures:
            parts_lse[temp].append(torch.logsumexp(logits / temp, dim=-1).cpu())
    empty = torch.zeros(0, depth, k)
    return Drafts(
        ids=ids.cpu(), first_anchor=first_anchor,
        logits=torch.cat(parts_l) if parts_l else empty,
        tokens=torch.cat(parts_t) if parts_t else empty.long(),
        lse={temp: torch.cat(v) if v else torch.zeros(0, depth) for temp, v in parts_lse.items()},
    )


def accepted_depth(tokens: torch.Tensor, depths: torch.Tensor, ancestors: torch.Tensor, truth: torch.Tensor) -> int:
    """Depth of the deepest tree node whose whole path spells truth[1..] (truth[0] is the root's
    token; truth is -1 past the answer's end, which no node matches)."""
    ok = tokens == truth[depths]
    accepted = ~(ancestors & ~ok[None, :]).any(dim=1)
    return int(depths[accepted].max())


def replay(d: Drafts, s: TreeSetting) -> list[int]:
    """Tokens each round adds to the answer (the engine's accept_lengths) when decoding d.ids
    with tree setting s: round 0 anchors at the answer's first token (the prefill's), each round
    keeps its accepted path plus the target's token after it."""
    end = len(d.ids) - 1  # the last token never anchors a round
    depth = min(d.logits.shape[1], max(s.budget - 1, 1))  # as the engine: no deeper than budget - 1
    width = min(s.width, d.logits.shape[2])
    n = static_tree_size(s.budget, width, depth)
    pad = torch.full((depth + 1,), -1, dtype=torch.long)
    out: list[int] = []
    a = d.first_anchor
    while a < end:
        k = 0
        if n > 1:
            i = a - d.first_anchor
            tokens, _parents, depths, _scores, ancestors = accum_tree(
                d.log_probs(i, depth, width, s.temperature), d.tokens[i, :depth, :width], d.ids[a], n)
            truth = torch.cat([d.ids[a : a + depth + 1].long(), pad])[: depth + 1]
            k = accepted_depth(tokens, depths, ancestors, truth)
        keep = min(k + 1, end - a)
        out.append(keep)
        a += keep
    return out


@dataclass
class TopKReach:
    """Where the head's draft stands at each depth, over every anchor of the answers: how often
    the answer's token is the top-1, and how often it is within the top-K at all (no tree of
    width K can accept it otherwise)."""

    top1: list[float]  # [D] fraction of anchors whose depth-d draft top-1 is the answer's token
    in_top_k: list[float]  # [D]
    anchors: int


def top_k_reach(drafts: list[Drafts], width: int) -> TopKReach:
    hits1 = hitsk = count = 0  # become [D] tensors at the first answer with an anchor
    for d in drafts:
        a_n, depth, _ = d.logits.shape
        if a_n == 0:
            continue
        idx = d.first_anchor + torch.arange(a_n)[:, None] + torch.arange(1, depth + 1)[None, :]  # [A, D]
        valid = idx < len(d.ids)
        truth = d.ids.long()[idx.clamp(max=len(d.ids) - 1)]
        hits1 = hits1 + ((d.tokens[:, :, 0] == truth) & valid).sum(0).double()
        hitsk = hitsk + ((d.tokens[:, :, :width] == truth[:, :, None]).any(-1) & valid).sum(0).double()
        count = count + valid.sum(0).double()
    if isinstance(count, int):
        return TopKReach([], [], 0)
    n = count.clamp(min=1)
    return TopKReach((hits1 / n).tolist(), (hitsk / n).tolist(), int(count[0]))


# ---------------------------------------------------------------------------------------------
# `train-head --stage replay`: the report


def replay_widths(width: int) -> tuple[int, ...]:
    """The evaluation width and two wider ones: does a bushier tree pay at this budget?"""
    return tuple(sorted({min(w, MAX_WIDTH) for w in (width, 2 * width, 4 * width)}))


def greedy_answers(ws, prompts: list[str], max_new_tokens: int, batch_size: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, the target's greedy answer ids incl. a final stop token) per prompt."""
    ids = [ws.prompt_ids(p) for p in prompts]
    if not ids:
        return []
    decoder = BatchDecoder(ws.engine.target, batch_size, max(len(i) for i in ids), max_new_tokens,
                           ws.engine.stop_token_ids, ws.pad_id)
    out: list[tuple[list[int], list[int]]] = []
    for s in range(0, len(ids), batch_size):
        out += [(p, a) for p, (a, _) in zip(ids[s : s + batch_size], decoder.decode(ids[s : s + batch_size]))]
    return out


def replay_report(ws, head: DraftHead, sets: dict[str, list[str]], budgets: tuple[int, ...], width: int,
                  max_new_tokens: int, batch_size: int, log) -> dict:
    """Per prompt set: how often the answer's token is the draft's top-1 / within the top-W at
    each depth, and the replayed τ at every budget for the widths `replay_widths(width)`."""
    widths = replay_widths(width)
    report: dict = {"widths": list(widths), "budgets": list(budgets), "sets": {}}
    for name, prompts in sets.items():
        t0 = time.perf_counter()
        log(f"replay {name}: answering {len(prompts)} prompts, then drafting at every answer token")
        answers = greedy_answers(ws, prompts, max_new_tokens, batch_size)
        drafts = [draft_all(head, ws.hf, torch.tensor(p + a), len(p), max(widths)) for p, a in answers]
        row: dict = {"prompts": len(prompts), "answer_tokens": sum(len(a) for _, a in answers)}
        reach = {w: top_k_reach(drafts, w) for w in widths}
        row["anchors"] = reach[widths[0]].anchors
        row["top1"] = [round(x, 4) for x in reach[widths[0]].top1]
        row["in_top"] = {str(w): [round(x, 4) for x in r.in_top_k] for w, r in reach.items()}
        row["tau"] = {}
        for w in widths:
            row["tau"][str(w)] = {}
            for b in budgets:
                kept = [k for d in drafts for k in replay(d, TreeSetting(b, w))]
                row["tau"][str(w)][str(b)] = round(sum(kept) / len(kept), 4) if kept else 0.0
        row["seconds"] = round(time.perf_counter() - t0, 1)
        log(f"replay {name}: done, {row['anchors']} anchors in {row['seconds']} s")
        report["sets"][name] = row
    return report


def format_report(report: dict) -> list[str]:
    """The report as text lines: per set the reach by depth, then τ per width and budget."""
    lines: list[str] = []
    for name, row in report["sets"].items():
        depth = len(row["top1"])
        lines.append(f"{name}: {row['prompts']} prompts, {row['anchors']} anchors (answer tokens {row['answer_tokens']})")
        lines.append("  depth        " + " ".join(f"{d:>4}" for d in range(1, depth + 1)))
        lines.append("  top-1 %      " + " ".join(f"{100 * x:>4.0f}" for x in row["top1"]))
        for w, vals in row["in_top"].items():
            lines.append(f"  in top-{w:<3} % " + " ".join(f"{100 * x:>4.0f}" for x in vals))
        lines.append("  τ  budget    " + " ".join(f"{b:>6}" for b in report["budgets"]))
        for w, taus in row["tau"].items():
            lines.append(f"     width {w:<3}" + " ".join(f"{taus[str(b)]:>6.2f}" for b in report["budgets"]))
    return lines

"""Batched decoding for training data (the data stage of `train-head`).

The chat engine decodes one stream; the data stage answers tens of thousands of prompts. Here B
prompts run at once through our TargetModel's weights with a contiguous KV cache per layer
[B, kv_heads, T, head_dim]: a left-padded prefill (in row chunks, to bound activation memory),
then one token per row per step. transformers `generate` was launch-bound on the H100 (~40 ms a
step at any batch size, 5-10k tokens/s); on CUDA each of our decode steps is one graph replay:
the tokens, the write column, the finished flags and the outputs live in static device buffers
that the graph advances itself, and the host only asks "all finished?" every CHECK_EVERY steps.

Attention reads the columns [0, T) of the cache with a boolean mask (a row sees its own prompt,
from its first real column, and its answer so far), where T = the batch's prompt width + max new
tokens, rounded up to COLUMN_BUCKET: one captured graph per bucket, all sharing one cache.
Grouped-query heads are folded into the query rows ([B, kv_heads, group * S, D]), so K and V are
never repeated. Rows are independent, so the answers equal single-stream greedy decoding up to
floating-point rounding (tests compare with transformers on a tiny target).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels import add_rms_norm
from ..engine.graphs import capture
from ..engine.model import TargetModel

COLUMN_BUCKET = 128
CHECK_EVERY = 8
PREFILL_TOKENS = 16384  # rows x width per prefill chunk


class BatchDecoder:
    """Decodes batches of up to `batch_size` prompts of at most `max_prompt` tokens. Reuse one
    decoder for many batches: the cache and the captured graphs are kept."""

    def __init__(self, model: TargetModel, batch_size: int, max_prompt: int, max_new_tokens: int,
                 stop_ids: set[int] | frozenset[int], pad_id: int, temperature: float = 0.0):
        cfg = model.cfg
        self.model, self.cfg = model, cfg
        self.b, self.max_new, self.temperature, self.pad_id = batch_size, max_new_tokens, temperature, pad_id
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.cap = _round_up(max_prompt + max_new_tokens, COLUMN_BUCKET)
        # A hybrid target decodes through its own cache (_decode_recurrent): no batched KV.
        shape = (cfg.num_layers if cfg.hybrid is None else 0, batch_size, cfg.num_kv_heads, self.cap, cfg.head_dim)
        self.k_cache = torch.zeros(shape, device=self.device, dtype=self.dtype)
        self.v_cache = torch.zeros(shape, device=self.device, dtype=self.dtype)
        self.stop_ids = torch.tensor(sorted(stop_ids) or [-1], device=self.device)
        dev = self.device
        self.start = torch.zeros(batch_size, dtype=torch.long, device=dev)  # first real column per row
        self.tok = torch.zeros(batch_size, dtype=torch.long, device=dev)  # the token to feed next
        self.col = torch.zeros((), dtype=torch.long, device=dev)  # the column it is written at
        self.step = torch.zeros(1, dtype=torch.long, device=dev)  # the output index it produces
        self.done = torch.zeros(batch_size, dtype=torch.bool, device=dev)
        self.out = torch.zeros(batch_size, max_new_tokens, dtype=torch.long, device=dev)
        self.use_graphs = self.device.type == "cuda"
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None

    @property
    def cache_bytes(self) -> int:
        return 2 * self.k_cache.numel() * self.k_cache.element_size()

    # -- the forward ------------------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, rows: slice, col: int | torch.Tensor, width: int) -> torch.Tensor:
        """ids [R, S] at columns col..col+S-1 of cache rows `rows`; attention over columns
        [0, width). Returns the final-normed hidden state of the last column [R, hidden]."""
        m, cfg = self.model, self.cfg
        r, s = ids.shape
        nkv, hd = cfg.num_kv_heads, cfg.head_dim
        group = cfg.num_heads // nkv
        start = self.start[rows]
        qcols = col + torch.arange(s, device=self.device)  # [S]
        positions = (qcols[None, :] - start[:, None]).clamp(min=0)  # pad columns: any position
        cos, sin = m.rotary.cos_sin(positions.reshape(-1), self.dtype)
        keys = torch.arange(width, device=self.device)
        # A row sees its real columns up to the query; a pad column sees itself (never empty).
        visible = ((keys >= start[:, None, None]) & (keys <= qcols[None, :, None])) | (keys == qcols[None, :, None])
        mask = visible.repeat(1, group, 1)[:, None]  # [R, 1, group*S, width], rows ordered (g, s)
        h = m.model.embed_tokens(ids.reshape(-1))
        layers = m.model.layers
        eps = cfg.rms_norm_eps
        x = layers[0].input_layernorm(h)
        for i, layer in enumerate(layers):
            attn = layer.self_attn
            q, k, v = attn.qkv_rope(x, cos, sin)  # [R*S, heads, D]
            kc, vc = self.k_cache[i, rows], self.v_cache[i, rows]  # [R, kv, cap, D]
            kc.index_copy_(2, qcols, k.view(r, s, nkv, hd).transpose(1, 2))
            vc.index_copy_(2, qcols, v.view(r, s, nkv, hd).transpose(1, 2))
            q = q.view(r, s, nkv, group, hd).permute(0, 2, 3, 1, 4).reshape(r, nkv, group * s, hd)
            o = F.scaled_dot_product_attention(q, kc[:, :, :width], vc[:, :, :width], attn_mask=mask, scale=m.scale)
            o = o.view(r, nkv, group, s, hd).permute(0, 3, 1, 2, 4).reshape(r * s, nkv * group * hd)
            x, h = add_rms_norm(attn.o_proj(o), h, layer.post_attention_layernorm.weight, eps)
            next_norm = layers[i + 1].input_layernorm if i + 1 < len(layers) else m.model.norm
            x, h = add_rms_norm(layer.mlp(x), h, next_norm.weight, eps)
        return x.view(r, s, -1)[:, -1]

    def _pick(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.model.logits(hidden)  # fp32
        if self.temperature > 0:  # Gumbel-max: a sample of softmax(logits / T), graph-safe
            u = torch.rand_like(logits).clamp_(min=1e-20)
            logits = logits / self.temperature - torch.log(-torch.log(u))
        return logits.argmax(-1)

    def _decode_step(self, width: int) -> None:
        """One token per row, everything on the device (the body of the captured graph)."""
        nxt = self._pick(self._forward(self.tok[:, None], slice(None), self.col, width))
        nxt = torch.where(self.done, self.pad_id, nxt)
        self.out.index_copy_(1, self.step, nxt[:, None])
        self.done |= torch.isin(nxt, self.stop_ids)
        self.tok.copy_(nxt)
        self.col += 1
        self.step += 1

    def _run_step(self, width: int) -> None:
        if not self.use_graphs:
            self._decode_step(width)
            return
        graph = self._graphs.get(width)
        if graph is None:
            keep = (self.tok, self.col, self.step, self.done, self.out)
            graph, _ = capture(lambda: self._decode_step(width), self.device, self._pool, keep=keep)
            self._graphs[width] = graph
        graph.replay()

    # -- a batch ----------------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, prompts: list[list[int]]) -> list[tuple[list[int], str]]:
        """(answer ids, "eos" | "length") per prompt; an answer keeps its stop token."""
        n = len(prompts)
        if not 0 < n <= self.b:
            raise ValueError(f"a batch holds 1..{self.b} prompts, got {n}")
        if self.cfg.hybrid is not None:  # recurrent layers: one stream at a time through their own cache
            return [self._decode_recurrent(p) for p in prompts]
        wide = max(len(p) for p in prompts)
        if wide + self.max_new > self.cap or min(len(p) for p in prompts) == 0:
            raise ValueError(f"prompts must have 1..{self.cap - self.max_new} tokens")
        width = _round_up(wide + self.max_new, COLUMN_BUCKET)
        # Unused rows get a one-token prompt and start finished.
        padded = prompts + [[self.pad_id]] * (self.b - n)
        ids = torch.full((self.b, wide), self.pad_id, dtype=torch.long)
        for i, p in enumerate(padded):
            ids[i, wide - len(p):] = torch.tensor(p)
        ids = ids.to(self.device)
        self.start.copy_(torch.tensor([wide - len(p) for p in padded]))
        self.done.copy_(torch.arange(self.b) >= n)
        self.out.zero_()
        chunk = max(1, PREFILL_TOKENS // wide)
        first = torch.empty(self.b, dtype=torch.long, device=self.device)
        for r0 in range(0, self.b, chunk):
            rows = slice(r0, min(self.b, r0 + chunk))
            first[rows] = self._pick(self._forward(ids[rows], rows, 0, wide))
        first = torch.where(self.done, self.pad_id, first)
        self.out[:, 0] = first
        self.done |= torch.isin(first, self.stop_ids)
        self.tok.copy_(first)
        self.col.fill_(wide)
        self.step.fill_(1)
        for i in range(1, self.max_new):
            if i % CHECK_EVERY == 1 and bool(self.done.all()):
                break
            self._run_step(width)
        rows_out = self.out[:n].tolist()
        stops = set(self.stop_ids.tolist())
        results = []
        for row in rows_out:
            end = next((j for j, t in enumerate(row) if t in stops), None)
            results.append((row[: end + 1], "eos") if end is not None else (row, "length"))
        return results


    def _decode_recurrent(self, prompt: list[int]) -> tuple[list[int], str]:
        """A hybrid target's answer, one token per step through its HybridCache (the batched
        cache above holds attention layers only). Slower, same answers as the engine's AR."""
        from ..engine.model import ForwardBatch

        dev = self.device
        kv = self.model.make_cache(len(prompt) + self.max_new, dev, self.dtype)
        ids, out = prompt, []
        stops = set(self.stop_ids.tolist())
        while len(out) < self.max_new:
            n, start = len(ids), kv.length
            batch = ForwardBatch(torch.tensor(ids, device=dev), torch.arange(start, start + n, device=dev),
                                 torch.ones(n, n, dtype=torch.bool, device=dev).tril(), start, causal=True)
            hidden = self.model(batch, kv)[0]
            kv.commit_path(list(range(n)))  # the whole chunk (no turn-boundary copy: one stream, no reuse)
            kv.length = start + n
            tok = int(self._pick(hidden[-1:])[0])
            out.append(tok)
            if tok in stops:
                return out, "eos"
            ids = [tok]
        return out, "length"


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m

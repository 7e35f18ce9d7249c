"""Stages 1 and 2: the prompts (built-in, proposed by the target, or a file; split train/dev)
and the data (the target's own answers through the chat template, one shard per batch)."""
from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Iterable, Iterator

import torch

from ..engine.errors import ConfigError
from . import prompts as P
from ..engine.eval_sets import EVAL_SETS
from .batch_decode import BatchDecoder
from .config import LogFn, TrainConfig
from .loss import Sequence
from .outputs import atomic_write, progress_bar, sha
from .prompts import Prompt
from .sharegpt import sharegpt_prompts
from .workspace import Workspace

DATA_FORMAT = 1


def prepare_prompts(cfg: TrainConfig, log: LogFn, ws: "Workspace | None" = None) -> tuple[list[Prompt], list[str]]:
    """(train, dev) prompts. The generated or read ones are written once to DIR/prompts.jsonl and
    reused while settings match; the --self-prompts share of the built-in ones, which the target
    proposes itself, follow them (DIR/proposals.jsonl, made by the first stage that has the target:
    `make_proposals`). ShareGPT: multi-turn contexts of real chats (sharegpt.py). The dev prompts are
    always built-in ones, so dev τ stays comparable across runs."""
    path = cfg.out / "prompts.jsonl"
    num_dev = max(cfg.eval_prompts, 16)
    # Evaluation alone needs only dev prompts: no proposals, and an earlier stage's file as it is.
    evaluating = cfg.stage in ("eval", "replay")
    n_self = proposal_count(cfg)
    key = {"file": cfg.prompts_file, "num_prompts": cfg.num_prompts, "num_dev": num_dev, "seed": cfg.seed,
           "self_prompts": n_self}
    if cfg.prompt_source != "builtin":  # (builtin runs keep the key their directories already hold)
        key.update(source=cfg.prompt_source, max_chars=sharegpt_max_chars(cfg))
    meta = cfg.out / "prompts.meta.json"
    train: list[Prompt] | None = None
    if path.is_file() and meta.is_file():
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        old_train, dev = [r["prompt"] for r in rows if r["split"] == "train"], [r["prompt"] for r in rows if r["split"] == "dev"]
        if evaluating and len(dev) >= num_dev:
            return old_train, dev
        if json.loads(meta.read_text()) == key:
            train = old_train
    if train is None:
        if evaluating and cfg.prompt_source != "builtin":  # the (built-in) dev prompts are all it needs
            return [], P.builtin_prompts(0, num_dev, seed=cfg.seed)[1]
        train, dev = _generated_prompts(cfg, num_dev, n_self, log)
        cfg.out.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps({"prompt": p, "split": "train"}) for p in train]
        lines += [json.dumps({"prompt": p, "split": "dev"}) for p in dev]
        atomic_write(path, "\n".join(lines) + "\n")
        atomic_write(meta, json.dumps(key) + "\n")
    if evaluating or not n_self:
        return train, dev
    proposed = read_proposals(cfg.out, n_self, cfg.proposals_seed)
    if proposed is None and ws is not None:
        proposed = make_proposals(ws, cfg, n_self, P.proposal_examples(train),
                                  set(map(P.prompt_key, train)) | set(dev) | held_out_sets(), log)
    return train + (proposed or []), dev


def proposal_count(cfg: TrainConfig) -> int:
    """Prompts the target proposes itself: --self-prompts of the built-in ones (of all prompts for
    the built-in source, of the built-in half for mixed); none from a file or ShareGPT alone."""
    if cfg.prompts_file or cfg.prompt_source == "sharegpt":
        return 0
    builtin = cfg.num_prompts if cfg.prompt_source == "builtin" else cfg.num_prompts - cfg.num_prompts // 2
    return round(builtin * cfg.self_prompts)


def _generated_prompts(cfg: TrainConfig, num_dev: int, n_self: int, log: LogFn) -> tuple[list[Prompt], list[str]]:
    """The training prompts of prompts.jsonl (all but the proposals) and the dev prompts."""
    if cfg.prompts_file:
        try:
            given = P.load_prompts_file(cfg.prompts_file)
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read --prompts {cfg.prompts_file}: {e}") from None
        train, dev = P.split_prompts(P.distinct(given))
        train = train[: cfg.num_prompts]
        if len(dev) < num_dev:  # a small file may have no held-out prompt: add built-in dev prompts
            dev += P.builtin_prompts(0, num_dev - len(dev), seed=cfg.seed)[1]
        return train, dev[:num_dev]
    if cfg.prompt_source in ("sharegpt", "mixed"):
        # mixed: half real chats, half built-in (generator prompts and the target's proposals: the
        # head keeps the templates' styles while it learns real ones), shuffled together.
        n_chats = cfg.num_prompts if cfg.prompt_source == "sharegpt" else cfg.num_prompts // 2
        builtin_train, dev = P.builtin_prompts(cfg.num_prompts - n_chats - n_self, num_dev, seed=cfg.seed)
        chats, stats = sharegpt_prompts(n_chats, cfg.seed, set(dev) | held_out_sets(), sharegpt_max_chars(cfg))
        log(f"ShareGPT: {stats.conversations} conversations read, {stats.held_out} held out (dev side or eval "
            f"sets), {stats.contexts} distinct contexts; {len(chats)} sampled"
            + (f", with {len(builtin_train)} built-in prompts" if builtin_train else ""))
        train = chats + builtin_train
        random.Random(cfg.seed).shuffle(train)
        return train, dev
    log(f"generating {cfg.num_prompts - n_self} training prompts (+{num_dev} held out)")
    return P.builtin_prompts(cfg.num_prompts - n_self, num_dev, seed=cfg.seed)


def read_proposals(out: Path, n: int | None = None, seed: int | None = None) -> list[str] | None:
    """DIR/proposals.jsonl's prompts, or None when there are none (or they were asked for with
    another count or seed, when those are given)."""
    path, meta = out / "proposals.jsonl", out / "proposals.meta.json"
    if not (path.is_file() and meta.is_file()):
        return None
    if n is not None and json.loads(meta.read_text()) != {"n": n, "seed": seed}:
        return None
    return [json.loads(line)["prompt"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def held_out_sets() -> set[str]:
    """Every prompt of the built-in eval sets: never trained on."""
    return {p for prompts in EVAL_SETS.values() for p in prompts}


def sharegpt_max_chars(cfg: TrainConfig) -> int:
    """Characters a ShareGPT context may hold: ~3 per token of --max-prompt-tokens (text runs ~4 per
    token, code fewer), so few contexts are still too long for the data stage, which skips those."""
    return 3 * cfg.max_prompt_tokens


def collect_proposals(texts: Iterable[str], n: int, exclude: set[str]) -> list[str]:
    """Up to n distinct cleaned proposals, none in `exclude` and none on the dev side of the split.
    Stops reading `texts` at the n-th (so a lazy source makes no more than it needs)."""
    out: list[str] = []
    seen = set(exclude)
    for text in texts:
        q = P.clean_proposal(text)
        if q is None or q in seen or P.is_dev(q):
            continue
        seen.add(q)
        out.append(q)
        if len(out) == n:
            break
    return out


@torch.no_grad()
def make_proposals(ws: "Workspace", cfg: TrainConfig, n: int, examples: tuple[str, ...], exclude: set[str],
                   log: LogFn) -> list[str]:
    """n training prompts the target writes itself, written to DIR/proposals.jsonl: it answers
    `propose_requests` (from the templates and the real user messages `examples`; sampled at
    temperature 0.8 with our batched decoder) and `collect_proposals` keeps the usable ones. Twice
    as many requests as needed are made, since some answers are rejected or repeat."""
    requests = P.propose_requests(2 * n, cfg.proposals_seed, examples)
    ids = [ws.prompt_ids(r) for r in requests]
    bs = gen_batch_size(ws, cfg, len(ids))
    torch.manual_seed(cfg.proposals_seed)
    decoder = BatchDecoder(ws.engine.target, bs, max(len(i) for i in ids), 96, ws.engine.stop_token_ids,
                           ws.pad_id, temperature=0.8)
    stops = ws.engine.stop_token_ids
    asked = 0

    def answers() -> Iterator[str]:  # one batch at a time, only as far as collect_proposals reads
        nonlocal asked
        for i in range(0, len(ids), bs):
            for answer, _ in decoder.decode(ids[i : i + bs]):
                asked += 1
                yield ws.tokenizer.decode([t for t in answer if t not in stops], skip_special_tokens=True)

    t0 = time.perf_counter()
    kept = collect_proposals(answers(), n, exclude)  # the decoder's cache goes with this function
    log(f"the target proposed {len(kept)} prompts ({asked} asked, {time.perf_counter() - t0:.0f} s)")
    cfg.out.mkdir(parents=True, exist_ok=True)
    atomic_write(cfg.out / "proposals.jsonl", "".join(json.dumps({"prompt": q}) + "\n" for q in kept))
    atomic_write(cfg.out / "proposals.meta.json", json.dumps({"n": n, "seed": cfg.proposals_seed}) + "\n")
    return kept


def gen_batch_size(ws: "Workspace", cfg: TrainConfig, prompts: int) -> int:
    """Prompts decoded together: --gen-batch-size (default 256 on CUDA, 8 on CPU), at most `prompts`."""
    return max(1, min(cfg.gen_batch_size or (256 if ws.device.type == "cuda" else 8), prompts))


def data_settings(ws: Workspace, cfg: TrainConfig) -> dict:
    """What the data depends on; a resumed run must match it."""
    template = getattr(ws.tokenizer, "chat_template", None) or ""
    return {"format": DATA_FORMAT, "target": cfg.target, "max_new_tokens": cfg.max_new_tokens,
            "temperature": cfg.temperature, "template": sha(str(template)), "vocab": ws.engine.target.cfg.vocab_size}


def prompt_sha(prompt: Prompt) -> str:
    """The key a context's answer is stored under (a shard's `prompt_sha`)."""
    return sha(P.prompt_key(prompt))


def data_shards(out: Path) -> list[Path]:
    return sorted((out / "data").glob("shard-*.pt"))


def done_prompts(out: Path) -> set[str]:
    done: set[str] = set()
    for shard in data_shards(out):
        done.update(torch.load(shard, weights_only=True)["prompt_sha"])
    return done


def generate_data(ws: Workspace, cfg: TrainConfig, train_prompts: list[Prompt], deadline: float | None,
                  log: LogFn, first: frozenset[str] = frozenset()) -> dict:
    """Answer every training prompt not answered yet; one shard per generation batch. The prompts
    whose key is in `first` (the target's proposals: what a run adds to a carried prompt set) are
    answered before the others, so a time-bounded stage keeps them all."""
    data_dir = cfg.out / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    settings = data_settings(ws, cfg)
    meta = data_dir / "meta.json"
    if meta.is_file():
        old = json.loads(meta.read_text())
        if old != settings:
            changed = sorted(k for k in settings if old.get(k) != settings[k])
            raise ConfigError(f"{data_dir} holds data made with other settings ({', '.join(changed)}); "
                              "use another --out, or delete that directory")
    else:
        atomic_write(meta, json.dumps(settings) + "\n")
    done = done_prompts(cfg.out)
    todo, skipped = [], 0
    for p in train_prompts:
        if prompt_sha(p) in done:
            continue
        ids = ws.prompt_ids(p)
        if len(ids) > cfg.max_prompt_tokens:
            skipped += 1
            continue
        todo.append((p, ids))
    if skipped:
        log(f"skipped {skipped} prompts longer than --max-prompt-tokens {cfg.max_prompt_tokens}")
    bs = gen_batch_size(ws, cfg, len(todo))
    # Similar lengths per batch (little padding); batches in a seeded random order, so a
    # time-bounded run still covers all prompt kinds and lengths (within each group).
    batches: list = []
    for group in ([x for x in todo if P.prompt_key(x[0]) in first], [x for x in todo if P.prompt_key(x[0]) not in first]):
        group.sort(key=lambda x: len(x[1]))
        grouped = [group[i : i + bs] for i in range(0, len(group), bs)]
        order = torch.randperm(len(grouped), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
        batches += [grouped[i] for i in order]
    next_shard = len(data_shards(cfg.out))
    stats = {"sequences": 0, "answer_tokens": 0, "finished_eos": 0, "stopped_by_time": False, "skipped": skipped}
    t0 = time.perf_counter()
    bar = progress_bar(cfg.progress, total=len(todo), desc="data", unit="prompt")
    decoder = None
    if todo:
        decoder = BatchDecoder(ws.engine.target, bs, max(len(ids) for _, ids in todo), cfg.max_new_tokens,
                               ws.engine.stop_token_ids, ws.pad_id, cfg.temperature)
        log(f"data: batches of {bs}, KV cache {decoder.cache_bytes / 2**30:.2f} GiB")
    try:
        for batch in batches:
            if deadline is not None and time.time() > deadline:
                stats["stopped_by_time"] = True
                log("data: time budget reached, keeping what is done")
                break
            answers = decoder.decode([ids for _, ids in batch])
            shard = {"ids": [], "prompt_len": [], "prompt_sha": [], "finish": []}
            for (p, ids), (ans, finish) in zip(batch, answers):
                shard["ids"].append(torch.tensor(ids + ans, dtype=torch.int32))
                shard["prompt_len"].append(len(ids))
                shard["prompt_sha"].append(prompt_sha(p))
                shard["finish"].append(finish)
                stats["answer_tokens"] += len(ans)
                stats["finished_eos"] += finish == "eos"
            stats["sequences"] += len(batch)
            path = data_dir / f"shard-{next_shard:05d}.pt"
            torch.save(shard, path.with_name(path.name + ".tmp"))
            path.with_name(path.name + ".tmp").replace(path)
            next_shard += 1
            bar.update(len(batch))
            bar.set_postfix(tok_s=f"{stats['answer_tokens'] / (time.perf_counter() - t0):.0f}")
    finally:
        bar.close()
        del decoder  # its KV cache: training needs the memory
        if ws.device.type == "cuda":
            torch.cuda.empty_cache()
    stats["seconds"] = round(time.perf_counter() - t0, 2)
    stats["total_sequences"] = len(done) + stats["sequences"]
    return stats


def load_sequences(out: Path, max_seq_len: int, exclude: frozenset[str] = frozenset()) -> list[Sequence]:
    """All generated sequences, truncated to max_seq_len; those without an answer token dropped, and
    those whose `prompt_sha` is in `exclude` (the dev prompts: answers carried from an earlier prompt
    set may hold this set's dev prompts)."""
    seqs = []
    for shard in data_shards(out):
        data = torch.load(shard, weights_only=True)
        for ids, plen, key in zip(data["ids"], data["prompt_len"], data["prompt_sha"]):
            if key in exclude:
                continue
            ids = ids[:max_seq_len]
            if len(ids) - plen >= 1 and len(ids) >= 2:
                seqs.append(Sequence(ids, plen))
    return seqs


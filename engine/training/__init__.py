"""Training draft heads (train-head): prompts, the target's answers, the training loop, evaluation, export."""

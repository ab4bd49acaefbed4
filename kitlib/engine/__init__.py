"""The training engine: the optimizer step, fit's loop and its policies, evaluation, checkpoints."""

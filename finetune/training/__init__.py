"""Training: the loop, evaluation, the best model, checkpoints, the step plan."""

"""The failure of a run whose loss became NaN or inf: the step, the last good checkpoint, and what this
run can change."""

from __future__ import annotations

from finetune.config.train_config import TrainConfig
from finetune.errors import TrainingFailed
from finetune.training.checkpoint import complete_checkpoints


def diverged(step: int, config: TrainConfig, precision: str) -> TrainingFailed:
    """The step was skipped on the device, and nothing is saved once the flag is set, so no NaN
    reaches the weights or a checkpoint. The advice is what this run can change: a lower clipping
    threshold only where clipping is on (--max_grad_norm 0 clips nothing, so lowering it does nothing),
    bf16 only where it ran fp16 (whose range overflows)."""
    latest = complete_checkpoints(config.output_dir)
    last_good = latest[-1] if latest else "none (set --checkpointing_steps)"
    if config.max_grad_norm:
        advice = [f"lower --learning_rate or --max_grad_norm (now {config.max_grad_norm:g})"]
    else:
        advice = ["lower --learning_rate", "clip the gradients with --max_grad_norm 1.0 (clipping is off)"]
    if precision == "fp16":
        advice.append("use bf16 instead of fp16")
    said = ", or ".join(advice) if len(advice) < 3 else f"{advice[0]}, {advice[1]}, or {advice[2]}"
    return TrainingFailed(
        f"the loss became NaN or inf at step {step}; the last good checkpoint is {last_good}; {said}"
    )

"""Step arithmetic: how many optimizer updates a run makes, for any accumulation and world size."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class StepPlan:
    micro_batches_per_epoch: int
    """Micro-batches each process sees per epoch (every process sees the same number; each row is in
    one of them)."""
    updates_per_epoch: int
    """Optimizer steps per epoch; the last accumulation window of an epoch may be partial."""
    total_updates: int
    """Optimizer steps of the whole run; the LR schedule is sized in these."""
    warmup_updates: int
    """Optimizer steps of linear warmup."""
    num_epochs: int
    """Epochs the run starts (the last one may stop early at total_updates)."""
    global_batch_size: int
    """Pairs per optimizer step over all processes (the last window of an epoch may hold fewer)."""


def plan_steps(
    num_train_samples: int,
    per_device_batch_size: int,
    gradient_accumulation_steps: int,
    world_size: int,
    num_train_epochs: float,
    max_train_steps: int | None = None,
    warmup_ratio: float = 0.0,
    warmup_steps: float = 0,
) -> StepPlan:
    """`warmup_steps` above 0 overrides `warmup_ratio`, as in HF Trainer (below 1: a fraction of the
    updates, HF Trainer 5's form). Fractional epochs (0.5, 1.5)
    are HF Trainer's too: ceil(updates_per_epoch * epochs) updates, over ceil(epochs) epochs of which
    the last stops part-way, as with max_train_steps."""
    # Every process gets one micro-batch of each global batch of b*w rows (data/batching.py
    # RankBatches: the last one cut as evenly as its rows allow, a placeholder where none is left).
    micro = math.ceil(num_train_samples / (per_device_batch_size * world_size))
    # accelerator.accumulate also steps at the end of the dataloader, so a partial window counts.
    updates_per_epoch = math.ceil(micro / gradient_accumulation_steps)
    if max_train_steps is None:
        # Rounded first: 10 updates x 1.1 epochs is 11.000000000000002 in floats, not 12 updates.
        # At least one update when there is data, however few epochs.
        total = max(math.ceil(round(updates_per_epoch * num_train_epochs, 9)), min(updates_per_epoch, 1))
        epochs = math.ceil(num_train_epochs)
    else:
        total = max_train_steps
        epochs = math.ceil(max_train_steps / updates_per_epoch)
    return StepPlan(
        micro_batches_per_epoch=micro,
        updates_per_epoch=updates_per_epoch,
        total_updates=total,
        warmup_updates=int(warmup_steps)
        if warmup_steps >= 1
        else math.ceil((warmup_steps or warmup_ratio) * total),
        num_epochs=epochs,
        global_batch_size=per_device_batch_size * gradient_accumulation_steps * world_size,
    )

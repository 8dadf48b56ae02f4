import math

import pytest
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from finetune.training.steps import plan_steps


@pytest.mark.parametrize(
    ("samples", "batch", "accum", "world", "epochs", "micro", "per_epoch", "total"),
    [
        (1000, 32, 1, 1, 3, 32, 32, 96),  # 31 full batches + one of 8
        (1000, 32, 4, 1, 3, 32, 8, 24),  # windows divide evenly
        (1000, 32, 5, 1, 2, 32, 7, 14),  # 6 windows of 5 + a partial window of 2
        (1000, 16, 2, 4, 1, 16, 8, 8),  # 4 ranks: 63 batches of 16 -> 16 per rank
        (9888, 32, 1, 2, 3, 155, 155, 465),  # shared MNLI rows, 2 processes
        (10, 4, 3, 1, 1, 3, 1, 1),  # fewer micro-batches than one window: one partial update
        (7, 8, 1, 8, 1, 1, 1, 1),  # fewer rows than ranks x batch
    ],
)
def test_plan_counts_updates(samples, batch, accum, world, epochs, micro, per_epoch, total):
    plan = plan_steps(samples, batch, accum, world, epochs)
    assert (plan.micro_batches_per_epoch, plan.updates_per_epoch, plan.total_updates) == (
        micro,
        per_epoch,
        total,
    )
    assert plan.num_epochs == epochs
    assert plan.global_batch_size == batch * accum * world


def test_max_train_steps_overrides_epochs_and_sizes_warmup():
    plan = plan_steps(1000, 32, 4, 1, num_train_epochs=3, max_train_steps=20, warmup_ratio=0.1)
    assert plan.total_updates == 20
    assert plan.num_epochs == 3  # 8 updates per epoch: the third epoch stops after 4
    assert plan.warmup_updates == 2
    assert plan_steps(1000, 32, 1, 1, 1, warmup_ratio=0.06).warmup_updates == 2  # ceil(0.06 * 32)
    # HF Trainer's rule: warmup_steps above 0 wins over the ratio.
    assert plan_steps(1000, 32, 1, 1, 1, warmup_ratio=0.06, warmup_steps=5).warmup_updates == 5
    assert plan_steps(1000, 32, 1, 1, 1, warmup_ratio=0.06, warmup_steps=0.25).warmup_updates == 8  # of 32


@pytest.mark.parametrize(("samples", "batch", "accum"), [(103, 8, 3), (96, 8, 4), (20, 8, 5)])
def test_plan_matches_what_accelerate_really_does(samples, batch, accum):
    """Count the micro-batches and synchronised (optimizer) steps of a real prepared dataloader."""
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accum)
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    loader = accelerator.prepare(DataLoader(torch.zeros(samples, 1), batch_size=batch))
    micro = updates = 0
    for _ in loader:
        with accelerator.accumulate(model):
            micro += 1
            updates += accelerator.sync_gradients
    plan = plan_steps(samples, batch, accum, accelerator.num_processes, 1)
    assert (plan.micro_batches_per_epoch, plan.updates_per_epoch) == (micro, updates)


@pytest.mark.parametrize(
    ("samples", "batch", "accum", "epochs", "per_epoch", "total", "started"),
    [
        (1000, 32, 1, 0.5, 32, 16, 1),  # half of one epoch
        (1000, 32, 1, 1.5, 32, 48, 2),  # the second epoch stops half-way
        (1000, 32, 5, 0.5, 7, 4, 1),  # 3.5 updates: rounded up, as HF Trainer does
        (1000, 32, 5, 1.5, 7, 11, 2),  # 10.5 -> 11
        (100, 10, 1, 1.1, 10, 11, 2),  # 10 x 1.1 is 11.000000000000002 in floats: still 11
        (10, 4, 1, 0.01, 3, 1, 1),  # a sliver of an epoch is still one update
    ],
)
def test_fractional_epochs_plan(samples, batch, accum, epochs, per_epoch, total, started):
    plan = plan_steps(samples, batch, accum, 1, epochs, warmup_ratio=0.1)
    assert (plan.updates_per_epoch, plan.total_updates, plan.num_epochs) == (per_epoch, total, started)
    assert plan.warmup_updates == math.ceil(0.1 * total)  # the schedule is sized to the updates made

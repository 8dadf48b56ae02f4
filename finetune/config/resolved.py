"""What the run resolved: every `auto` and derived choice, made once per run in `run.setup` from the
flags (never changed), this machine and the data. train_config.json records it beside the flags
(`args`) and the identity; `TrainConfig.with_resolved` gives the configuration the run trains with.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune.config.train_config import TrainConfig


@dataclass(frozen=True)
class Resolved:
    metric_for_best_model: str | None
    """--metric_for_best_model, or the task's first metric (None: nothing is evaluated)."""
    greater_is_better: bool | None
    """--greater_is_better, or false for a loss, ECE and Brier, and true for any other metric."""
    attn_implementation: str | None
    """transformers' choice of attention kernel for the model, unless --attn_implementation named one."""
    dropout_kernel: str
    """packed or torch (auto: packed on CPU where the architecture takes it)."""
    padding_free: str
    """true, false or varlen (auto: see --padding_free)."""
    pad_to_multiple_of: str
    """A number of tokens; 1: each batch as long as its longest row."""
    keep_freed_memory: str
    """true or false (auto: see --keep_freed_memory)."""
    cuda_graphs: str
    """true or false (auto: see --cuda_graphs)."""
    per_device_train_batch_size: int
    """The flag's batch, or what --auto_find_batch_size fitted (the global batch stays)."""
    gradient_accumulation_steps: int
    """The flag's steps, doubled for each halving of the batch by --auto_find_batch_size."""
    per_device_eval_batch_size: int
    """The flag's batch, or this device's default (see --per_device_eval_batch_size)."""
    report_to: str
    """The trackers the run logs to (auto: wandb where this machine is logged in to W&B, else none)."""
    logging_steps: int
    """The flag's steps, or about 20 log lines over the run's updates (see --logging_steps)."""
    chunked_loss: str = "false"
    """true or false (auto: see --chunked_loss); false for the families that have no vocabulary."""
    chunked_loss_tokens: int | None = None
    """Target tokens per chunk where --chunked_loss is on (see --chunked_loss_tokens); else None."""
    prefix_sharing: str = "false"
    """true or false (auto: see --prefix_sharing); false for the families that do not read it."""


# Evaluation batches when --per_device_eval_batch_size is unset, at --max_length 128 (measured in
# docs/benchmarks.md: on CUDA, 256 evaluates 3x faster than 64; on CPU larger batches gain nothing).
EVAL_BATCH_AT_128 = {"cuda": 256, "cpu": 64}


def eval_batch_size(config: TrainConfig, device_type: str) -> int:
    """--per_device_eval_batch_size, or the device's default scaled to the same tokens per batch."""
    if config.per_device_eval_batch_size is not None:
        return config.per_device_eval_batch_size
    pairs = EVAL_BATCH_AT_128.get(device_type, EVAL_BATCH_AT_128["cpu"])
    return max(8, pairs * 128 // max(config.max_length, 128))

"""The line a run prints once at its start (the main process): what this job really got, every speed
path named."""

from __future__ import annotations

from finetune.config.train_config import TrainConfig


def run_summary(accelerator, config: TrainConfig, plan, resume, global_step: int) -> str:
    """One line, printed once by the main process: what this job really got, every speed path named."""
    job = (
        f"world_size={accelerator.num_processes} device={accelerator.device} "
        f"mixed_precision={accelerator.mixed_precision} "
    )
    weights = f"torch_dtype={config.torch_dtype} attn_implementation={config.attn_implementation}"
    if not config.do_train:
        return job + (
            f"evaluation only: per_device_eval_batch={config.per_device_eval_batch_size} "
            f"padding_free={config.padding_free} pad_to_multiple_of={config.pad_to_multiple_of} "
            f"torch_compile={str(config.torch_compile).lower()} {weights}"
        )
    line = job + (
        f"per_device_batch={config.per_device_train_batch_size} global_batch={plan.global_batch_size} "
        f"steps={plan.total_updates} "
        f"(warmup {plan.warmup_updates}, {plan.updates_per_epoch}/epoch) "
        f"dropout_kernel={config.dropout_kernel} padding_free={config.padding_free} "
        f"keep_freed_memory={config.keep_freed_memory} torch_compile={str(config.torch_compile).lower()} "
        f"cuda_graphs={config.cuda_graphs} "
        f"pad_to_multiple_of={config.pad_to_multiple_of} "
        f"group_by_length={str(config.group_by_length).lower()} fused_adamw=true "
        f"{weights} gradient_checkpointing={str(config.gradient_checkpointing).lower()}"
    )
    return line + (f" resuming from {resume} at step {global_step}" if resume else "")

"""The Accelerator for this machine: CPU or GPU, precision, world size, trackers."""

from __future__ import annotations

import os

import torch
from accelerate import Accelerator

from finetune.config import ConfigError, TrainConfig


def bf16_is_fast() -> bool:
    """CUDA with bf16 tensor cores, or a CPU with native bf16 matrix instructions (AVX512-BF16/AMX)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def resolve_mixed_precision(requested: str) -> str:
    """`auto`: a launcher/config that asks for bf16 or fp16 wins, else bf16 where it is fast, else fp32."""
    if requested != "auto":
        return requested
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if launcher != "no":
        return launcher
    return "bf16" if bf16_is_fast() else "no"


def build_accelerator(config: TrainConfig, trackers: list[str]) -> Accelerator:
    accelerator = Accelerator(
        # Without CUDA, Accelerate must be told it is on CPU: otherwise processes started by a
        # multi-GPU launcher each come up as rank 0 of 1 and train independent replicas.
        cpu=not torch.cuda.is_available(),
        mixed_precision=resolve_mixed_precision(config.mixed_precision),
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        log_with=trackers or None,
        project_dir=config.output_dir,
        # The schedule is sized in real optimizer steps; by default Accelerate would step it
        # num_processes times per update (the official examples multiply the length to match).
        step_scheduler_with_optimizer=False,
    )
    expected = int(os.environ.get("WORLD_SIZE", "1"))
    if expected > 1 and accelerator.num_processes != expected:
        raise ConfigError(
            f"the launcher started {expected} processes but Accelerate sees {accelerator.num_processes}: "
            "they would train independent copies; check distributed_type and num_processes "
            "in the accelerate config"
        )
    if torch.cuda.is_available():
        # TF32 matmuls on Ampere+ cost ~nothing in accuracy for fine-tuning and are several times faster.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return accelerator


def describe_runtime(accelerator) -> dict:
    return {
        "world_size": accelerator.num_processes,
        "device": str(accelerator.device),
        "mixed_precision": accelerator.mixed_precision,
    }


def run_summary(accelerator, config: TrainConfig, plan, resume, global_step: int) -> str:
    """One line, printed once by the main process: what this job really got."""
    line = (
        f"world_size={accelerator.num_processes} device={accelerator.device} "
        f"mixed_precision={accelerator.mixed_precision} "
        f"per_device_batch={config.per_device_train_batch_size} global_batch={plan.global_batch_size} "
        f"steps={plan.total_updates} "
        f"(warmup {plan.warmup_updates}, {plan.updates_per_epoch}/epoch)"
    )
    return line + (f" resuming from {resume} at step {global_step}" if resume else "")

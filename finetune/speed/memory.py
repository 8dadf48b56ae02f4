"""Memory controls: gradient checkpointing, and a per-device batch that fits (--auto_find_batch_size)."""

from __future__ import annotations

import torch
from accelerate.utils import find_executable_batch_size, gather_object
from datasets import Dataset
from torch import nn

from finetune.config.train_config import TrainConfig
from finetune.data.batching import MODEL_INPUTS, PadCollator, resolve_pad_to_multiple_of
from finetune.errors import ConfigError


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Activations are recomputed in the backward pass. Non-reentrant checkpointing: it also gives
    gradients when the embeddings are frozen (no input of a checkpointed block requires grad, as
    under LoRA), and it restores the RNG state, so recomputed dropout draws the same masks."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ConfigError(
            f"--gradient_checkpointing: {type(model).__name__} does not support it; drop the flag"
        )
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def fit_batch_size(
    config: TrainConfig, model: nn.Module, train: Dataset, tokenizer, accelerator
) -> tuple[dict, str]:
    """Collective: --auto_find_batch_size. Runs one forward and backward pass (no optimizer step) on the
    longest training rows at --per_device_train_batch_size; on out-of-memory halves that batch and
    doubles --gradient_accumulation_steps, so the global batch, the step plan and the schedule stay,
    and tries again. Sets the Accelerator's accumulation; returns both for `Resolved`, and the line that
    says so.

    Call before the dataloaders are built (they take the batch size) and before `accelerator.prepare`
    (each rank probes its own unwrapped model: no all-reduce a rank out of memory would leave hanging);
    the ranks then take the smallest batch any of them fitted. The probe runs under a forked RNG, so
    the run draws the same dropout masks as one started at the chosen batch; its gradients are dropped.
    AdamW's two moments, allocated at the first step, are held as empty tensors during the probe, so it
    peaks where a training step does."""
    start_batch, start_accumulation = config.per_device_train_batch_size, config.gradient_accumulation_steps
    # A list: datasets reads Arrow on every row access, far too slow for a sort over a training set.
    lengths = train.select_columns(["length"]).to_dict()["length"]
    longest = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)
    inputs = train.select_columns([c for c in MODEL_INPUTS if c in train.column_names])
    device = accelerator.device
    # Padded as the training batches are (build_dataloaders; varlen packs no wider than this).
    multiple = int(resolve_pad_to_multiple_of(config.pad_to_multiple_of, device.type == "cuda"))
    collate = PadCollator(tokenizer, multiple, config.max_length)
    model.to(device)

    size = start_batch

    def halve() -> int:
        nonlocal size
        if size % 2:
            raise ConfigError(
                f"--auto_find_batch_size: out of memory at --per_device_train_batch_size {size}, "
                "which can't be halved exactly; give a power of two, or a smaller batch"
            )
        size //= 2
        return size

    @find_executable_batch_size(starting_batch_size=start_batch, reduce_batch_size_fn=halve)
    def probe(batch_size: int) -> int:
        batch = collate([inputs[i] for i in longest[:batch_size]])
        batch = {k: v.to(device) for k, v in batch.items() if k not in ("labels", "weight")}
        devices = [device] if device.type == "cuda" else []
        trainable = [p for p in model.parameters() if p.requires_grad]
        moments = [torch.empty_like(p) for p in trainable for _ in range(2)]  # noqa: F841 (held, not read)
        with torch.random.fork_rng(devices=devices), accelerator.autocast():
            model.train()
            model(**batch).logits.float().sum().backward()  # the gradients' memory, not their values
        model.zero_grad(set_to_none=True)
        return batch_size

    fitted = probe()
    chosen = min(gather_object([fitted])) if accelerator.num_processes > 1 else fitted
    factor = start_batch // chosen
    accumulation = start_accumulation * factor
    accelerator.gradient_accumulation_steps = accumulation
    batch = {"per_device_train_batch_size": chosen, "gradient_accumulation_steps": accumulation}
    if factor == 1:
        return batch, f"auto_find_batch_size: --per_device_train_batch_size {chosen} fits"
    return batch, (
        f"auto_find_batch_size: out of memory at --per_device_train_batch_size {start_batch}; "
        f"training at {chosen} with --gradient_accumulation_steps {accumulation} (same global batch)"
    )

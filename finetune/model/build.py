"""The speed choices of a family that takes none of sequence classification's kernels."""

from __future__ import annotations

from finetune.config.train_config import TrainConfig
from finetune.data.batching import resolve_pad_to_multiple_of
from finetune.speed.malloc import keep_freed_memory, resolve_keep_freed_memory


def plain_speed(args: TrainConfig, model, accelerator) -> dict:
    """The speed choices of a family that takes none of classification's kernels (causal LMs, taggers):
    torch's dropout, padded batches, --pad_to_multiple_of and --keep_freed_memory as resolved for this
    device (glibc's setting applied here), for `Resolved`."""
    device_type = accelerator.device.type
    speed = {
        "attn_implementation": model.config._attn_implementation,
        "dropout_kernel": "torch",
        "padding_free": "false",
        "pad_to_multiple_of": resolve_pad_to_multiple_of(args.pad_to_multiple_of, device_type == "cuda"),
        "keep_freed_memory": resolve_keep_freed_memory(
            args.keep_freed_memory, device_type, accelerator.mixed_precision
        ),
    }
    if speed["keep_freed_memory"] == "true":
        keep_freed_memory()
    return speed

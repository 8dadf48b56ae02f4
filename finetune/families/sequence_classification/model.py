"""Sequence classification's model: loaded with its head, fitted to its tokenizer, with this machine's
speed paths (classification's kernels: packed dropout, padding-free, varlen) and the memory and LoRA
settings."""

from __future__ import annotations

from finetune.config.train_config import TrainConfig
from finetune.data.batching import resolve_pad_to_multiple_of
from finetune.model.backbones import classifies_from_last_token, fit_tokenizer_to_model, prepare_decoder
from finetune.model.loading import load_model_and_tokenizer
from finetune.model.lora import wrap_with_lora
from finetune.model.options import refuse_checkpoint_dtype
from finetune.speed.attention import check_varlen_precision, use_sync_free_masks, use_varlen_attention
from finetune.speed.malloc import keep_freed_memory, resolve_keep_freed_memory
from finetune.speed.memory import enable_gradient_checkpointing
from finetune.speed.packed_dropout import pack_dropout_modules, resolve_dropout_kernel, use_packed_dropout
from finetune.speed.padding_free import resolve_padding_free, use_padding_free


def build_model(
    args: TrainConfig, task, accelerator, loading: dict, bf16_native: bool, cuda_graphs: str = "false"
):
    """The model and tokenizer, fitted to each other, with this machine's speed paths and the memory
    and LoRA settings (`cuda_graphs`: the resolved --cuda_graphs; captured steps need sync-free masks).
    Returns (model, tokenizer, the `backbone` record of train_config.json, the speed choices for
    `Resolved`)."""
    model, tokenizer = load_model_and_tokenizer(args.model_name_or_path, task, args.max_length, loading)
    refuse_checkpoint_dtype(model, args, accelerator.device.type, bf16_native)
    backbone = backbone_summary(model, fit_tokenizer_to_model(model, tokenizer))
    backbone.update(prepare_decoder(model))  # decoders: positions that ignore left padding, no cache
    if args.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    device_type = accelerator.device.type
    # Each choice as it is made, in this order: padding-free wraps the attention packed dropout chose.
    speed = {"attn_implementation": model.config._attn_implementation}  # transformers' choice
    # torch for architectures packed dropout can't take
    speed["dropout_kernel"] = resolve_dropout_kernel(args.dropout_kernel, device_type, model)
    if speed["dropout_kernel"] == "packed":
        use_packed_dropout(model)
    speed["padding_free"] = resolve_padding_free(args, model, device_type)  # "true"/"false"/"varlen"
    if speed["padding_free"] == "true":
        use_padding_free(model)
    speed["pad_to_multiple_of"] = resolve_pad_to_multiple_of(args.pad_to_multiple_of, device_type == "cuda")
    if speed["padding_free"] == "varlen":
        check_varlen_precision(model, device_type, accelerator.mixed_precision)
        use_varlen_attention(model)
    elif speed["padding_free"] == "false" and (
        args.pad_to_multiple_of not in ("auto", "1") or cuda_graphs == "true"
    ):
        # Bucketed as asked (auto stays as measured), or captured: a graph cannot wait on the device.
        use_sync_free_masks(model)
    speed["keep_freed_memory"] = resolve_keep_freed_memory(  # "true"/"false"
        args.keep_freed_memory, device_type, accelerator.mixed_precision
    )
    if speed["keep_freed_memory"] == "true":
        keep_freed_memory()
    if args.use_peft:  # after the kernels patch the model's own modules; before the optimizer
        model = wrap_with_lora(model, args)
        if speed["dropout_kernel"] == "packed":
            pack_dropout_modules(model)  # the adapters' own dropout on their inputs
    return model, tokenizer, backbone, speed


def backbone_summary(model, tokenizer_changes: list[str]) -> dict:
    """What train_config.json says about the architecture and what was adapted to train it."""
    return {
        "model_type": model.config.model_type,
        "classifier_reads": "last non-pad token" if classifies_from_last_token(model) else "encoder output",
        "dtype": str(model.dtype).removeprefix("torch."),
        "tokenizer_changes": tokenizer_changes,
    }

"""How a checkpoint is read (dtype, attention, remote code, revision), and the refusals: what this
device can't do, a checkpoint's dtype, transformers' errors as one line."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers.utils import is_flash_attn_2_available

from finetune.config.train_config import TrainConfig
from finetune.errors import ConfigError


def loading_options(config: TrainConfig, device_type: str, bf16_native: bool) -> dict:
    """from_pretrained keyword arguments for --torch_dtype, --attn_implementation, --model_revision and
    --trust_remote_code; refuses what this device can't do before any weights are read."""
    folder = Path(config.model_name_or_path)
    if (folder / "trainer_state.json").is_file() and not (folder / "config.json").is_file():
        raise ConfigError(
            f"--model_name_or_path {folder} is a training checkpoint (state for --resume_from_checkpoint), "
            "not a model: give the run's --output_dir, or its best_model/"
        )
    if config.torch_dtype == "bfloat16" and not bf16_native:
        raise ConfigError(
            f"--torch_dtype bfloat16: this {device_type.upper()} has no native bf16 (it would emulate it, "
            "several times slower); use --torch_dtype float32 (with --mixed_precision fp16 on a GPU)"
        )
    if config.attn_implementation == "flash_attention_2" and not (
        device_type == "cuda" and is_flash_attn_2_available()
    ):
        raise ConfigError(
            "--attn_implementation flash_attention_2: needs a CUDA GPU and the flash-attn package; use sdpa"
        )
    options = dict(config.hub_options)
    # float32 is transformers' own default; "auto" keeps the checkpoint's dtype.
    dtype = config.torch_dtype
    options["dtype"] = dtype if dtype == "auto" else getattr(torch, dtype)
    if config.attn_implementation is not None:
        options["attn_implementation"] = config.attn_implementation
    return options


def refuse_checkpoint_dtype(
    model: nn.Module, config: TrainConfig, device_type: str, bf16_native: bool
) -> None:
    """--torch_dtype auto: the dtype the checkpoint brought passes the rules an explicit one does."""
    if config.torch_dtype != "auto" or model.dtype not in (torch.bfloat16, torch.float16):
        return
    held = f"--torch_dtype auto: {config.model_name_or_path} holds {str(model.dtype)[6:]} weights"
    if model.dtype == torch.bfloat16 and not bf16_native:
        raise ConfigError(
            f"{held} and this {device_type.upper()} has no native bf16 (it would emulate it, several times "
            "slower); use --torch_dtype float32"
        )
    if model.dtype == torch.float16 and config.do_train:
        raise ConfigError(
            f"{held}, which train unstably; use --torch_dtype float32 (with --mixed_precision fp16) or "
            "bfloat16"
        )


def loading_error(model_name_or_path: str, error: ValueError, loading: dict) -> ConfigError:
    """transformers' ValueError while reading a checkpoint, as one line naming the flag and the fix."""
    text = str(error)
    where = f"--model_name_or_path {model_name_or_path}"
    if "trust_remote_code" in text:
        return ConfigError(
            f"{where}: its config.json maps to code shipped with the model (auto_map); read that code, "
            "then pass --trust_remote_code true to run it"
        )
    if "Unrecognized configuration class" in text:
        model_type = text.split("configuration class ", 1)[1].split(">")[0].rsplit(".", 1)[-1].strip("'")
        return ConfigError(
            f"{where}: {model_type} has no sequence-classification class in transformers; pick a backbone "
            "that has one (BERT, RoBERTa, DeBERTa, ModernBERT, Llama, Qwen, ...)"
        )
    if "attention implementation" in text or "attn_implementation" in text:
        return ConfigError(
            f"--attn_implementation {loading.get('attn_implementation')}: {text.split('. ')[0][:200]}; "
            "drop the flag (transformers then picks one the model has) or use eager"
        )
    return ConfigError(f"{where}: transformers can't load it ({text.splitlines()[0][:200]})")

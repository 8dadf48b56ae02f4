"""How a checkpoint is read (dtype, attention, remote code, revision), and the fixes that let any
sequence-classification backbone train here: a pad token for decoders, no token types where the
model takes none, positions that ignore left padding."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch
from torch import nn
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES
from transformers.utils import is_flash_attn_2_available

from finetune.config import ConfigError, TrainConfig

PAD_TOKEN = "<pad>"  # added when a tokenizer has neither a pad nor an EOS token


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


def classifies_from_last_token(model: nn.Module) -> bool:
    """Decoders (Llama, Qwen, GPT-2, ...) classify from the last non-pad token, found through
    config.pad_token_id; encoders (every masked-LM family) from their first token or a pooled mean."""
    return model.config.model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES


def fit_tokenizer_to_model(model: nn.Module, tokenizer) -> list[str]:
    """Makes the tokenizer's batches ones the model can take, and saves it that way; returns what
    changed, for the run summary.

    - No pad token: the EOS token pads (else a new `<pad>` token, and the embeddings grow by one row);
      decoders find their last real token through config.pad_token_id, so it is set, and exported.
    - A model whose forward takes no token_type_ids (DistilBERT, ModernBERT, decoders) gets none."""
    changes = []
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
            changes.append(f"pad_token={tokenizer.eos_token} (the EOS token)")
        else:
            tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
            model.resize_token_embeddings(len(tokenizer))
            changes.append(f"pad_token={PAD_TOKEN} (added; embeddings resized to {len(tokenizer)})")
    text_config = model.config.get_text_config()
    if text_config.pad_token_id is None or (
        classifies_from_last_token(model) and text_config.pad_token_id != tokenizer.pad_token_id
    ):
        text_config.pad_token_id = tokenizer.pad_token_id
    if "token_type_ids" in tokenizer.model_input_names and not _takes(model, "token_type_ids"):
        tokenizer.model_input_names = [n for n in tokenizer.model_input_names if n != "token_type_ids"]
        tokenizer.init_kwargs["model_input_names"] = tokenizer.model_input_names  # saved with it
        changes.append("no token_type_ids (the model takes none)")
    return changes


def _takes(model: nn.Module, argument: str) -> bool:
    return argument in inspect.signature(model.forward).parameters


def prepare_decoder(model: nn.Module) -> dict:
    """For decoders (nothing for encoders); returns what it set, for train_config.json.

    - Position ids counted over real tokens only, so a left-padded row gets the positions it has alone
      (GPT-2's learned positions would otherwise shift by its padding); right padding gives the same
      ids as before. A forward pre-hook.
    - No key/value cache: a classifier never generates, and in evaluation the cache would keep every
      layer's keys and values alive."""
    if not classifies_from_last_token(model):
        return {}
    done = {}
    if _takes(model, "position_ids"):
        model.register_forward_pre_hook(_position_ids, with_kwargs=True)
        done["position_ids"] = "from attention_mask"
    if getattr(model.config, "use_cache", False):
        model.config.use_cache = False
        done["use_cache"] = False
    return done


def _position_ids(model, args, kwargs):
    mask = kwargs.get("attention_mask")
    if mask is None or kwargs.get("position_ids") is not None:
        return None
    return args, {**kwargs, "position_ids": (mask.long().cumsum(-1) - 1).clamp(min=0)}

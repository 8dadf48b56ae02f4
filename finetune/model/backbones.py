"""The fixes that let any sequence-classification backbone train here: a pad token for decoders, no
token types where the model takes none, positions that ignore left padding; which token the classifier
reads."""

from __future__ import annotations

import inspect

from torch import nn
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

PAD_TOKEN = "<pad>"  # added when a tokenizer has neither a pad nor an EOS token


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

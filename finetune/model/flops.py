"""Training FLOPs per token, for MFU: 6 x the non-embedding parameters (LoRA: its own count)."""

from __future__ import annotations

import torch

from finetune.model.lora import training_flops_per_token
from finetune.model.quantization import weight_count


def non_embedding_parameters(model: torch.nn.Module) -> int:
    """N in the 6·N FLOPs per trained token of MFU: every parameter outside the embedding layer(s):
    the encoder's `embeddings` block (with its LayerNorm) where there is one, and every nn.Embedding
    (a decoder's token embeddings, GPT-2's learned positions)."""
    embeddings = getattr(model.base_model, "embeddings", None) or model.get_input_embeddings()
    excluded = {id(p) for p in embeddings.parameters()}
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            excluded.update(id(p) for p in module.parameters())
    return sum(weight_count(p) for p in model.parameters() if id(p) not in excluded)  # 4-bit: unpacked


def flops_per_token(model, use_peft: bool) -> int:
    """Training FLOPs of one real token, for MFU: 6 x non-embedding parameters; LoRA's own count."""
    non_embedding = non_embedding_parameters(model)
    return training_flops_per_token(model, non_embedding) if use_peft else 6 * non_embedding

"""Packed dropout: the same Bernoulli masks from a quarter of the random draws, for CPU training.

On CPU, torch draws dropout masks with one mt19937 call (or more) per element on one thread: in a
small encoder's step `bernoulli_` can cost more than all the attention matmuls (docs/log.md).
Packed dropout asks the same generator for 64-bit words and splits each into four 16-bit uniforms,
keeping an element when its uniform is at or above p (p rounded to a multiple of 1/65536, at most
7.6e-6 off). Same generator, so `--seed`, the RNG state in checkpoints and exact resume work as
before. On CUDA the Philox generator is cheap and torch's own dropout stays.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from finetune.errors import ConfigError

LEVELS = 1 << 16


ATTENTION = "finetune_packed_dropout"


# Encoders whose dropout is nn.Dropout modules and whose attention (if it goes through
# AttentionInterface) has as many key/value heads as query heads and no soft-capping: what
# packed_dropout_attention computes. Decoders are left out: grouped-query attention, and their
# dropout is usually 0 (nothing to gain).
MODEL_TYPES = (
    "bert", "roberta", "xlm-roberta", "electra", "distilbert", "albert", "deberta-v2", "modernbert",
)  # fmt: skip


def packed_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Training-mode dropout: zero each element with probability p, scale the kept ones by 1/(1-p)."""
    dropped = round(p * LEVELS)
    if dropped == 0:
        return x
    if dropped >= LEVELS:
        return torch.zeros_like(x)
    words = torch.empty(x.numel() // 4 + 1, dtype=torch.int64, device=x.device).random_(-(2**63), None)
    uniform = words.view(torch.int16)[: x.numel()].view(x.shape)  # each in [-32768, 32767]
    keep = (uniform >= dropped - LEVELS // 2).to(x.dtype)
    return _MaskAndScale.apply(x, keep, LEVELS / (LEVELS - dropped))


class _MaskAndScale(torch.autograd.Function):
    """x * keep * scale, saving only the {0, 1} mask in x's dtype: forward plus backward are faster
    than `torch.where(keep, x * scale, 0)` on CPU. The scale stays a Python float, so a bf16 x is
    rounded once, as torch's dropout does."""

    @staticmethod
    def forward(ctx, x, keep, scale):
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None, None


class PackedDropout(nn.Dropout):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_dropout(x, self.p) if self.training else x


def packed_dropout_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention with packed dropout on the probabilities while training; torch's fused
    scaled_dot_product_attention when there is no dropout (evaluation)."""
    if not dropout:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=0.0, **kwargs
        )
    scores = torch.matmul(query, key.transpose(2, 3)) * (scaling or query.size(-1) ** -0.5)
    if attention_mask is not None:
        scores = scores + attention_mask  # additive: 0 where a key counts, the dtype's minimum where not
    probabilities = packed_dropout(torch.softmax(scores, dim=-1), dropout)
    return torch.matmul(probabilities, value).transpose(1, 2).contiguous(), None


def register_attention() -> None:
    """Makes `ATTENTION` a name transformers' models accept (global registries, hence not at import)."""
    AttentionInterface.register(ATTENTION, packed_dropout_attention)
    AttentionMaskInterface.register(ATTENTION, eager_mask)


def supports_packed_dropout(model: nn.Module) -> bool:
    return model.config.model_type in MODEL_TYPES


def resolve_dropout_kernel(requested: str, device_type: str, model: nn.Module) -> str:
    """--dropout_kernel as "packed" or "torch". auto: packed on CPU for the architectures it supports."""
    if requested == "auto":
        return "packed" if device_type == "cpu" and supports_packed_dropout(model) else "torch"
    if requested == "packed" and not supports_packed_dropout(model):
        raise ConfigError(
            f"--dropout_kernel packed: not for this model ({model.config.model_type}); it takes "
            f"{', '.join(MODEL_TYPES)}: use --dropout_kernel torch"
        )
    return requested


def use_packed_dropout(model: nn.Module) -> None:
    """Every nn.Dropout of the model becomes PackedDropout (same p, no weights change); models that
    take their attention from transformers' AttentionInterface, with sdpa, also get it in attention."""
    register_attention()
    pack_dropout_modules(model)
    # Only in place of sdpa, which it runs when there is no dropout: an explicit eager (or other)
    # --attn_implementation stays what the user chose.
    if getattr(model, "_supports_attention_backend", False) and model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(ATTENTION)


def pack_dropout_modules(model: nn.Module) -> None:
    """Every nn.Dropout module becomes PackedDropout (same p). Also run after LoRA wraps the model:
    peft's `lora_dropout` draws a mask on the input of every adapted layer, and with torch's draws
    a CPU LoRA step was slower than full fine-tuning of the same model (docs/log.md)."""
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is nn.Dropout:
                # In the mode of the module it replaces: from_pretrained returns a model in eval mode.
                setattr(parent, name, PackedDropout(child.p).train(child.training))

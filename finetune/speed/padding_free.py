"""Padding-free encoders: every layer but attention runs on the real tokens only.

Length-grouped batches still carry some padding, random ones much more (docs/design.md has the
ratios for MNLI). Linear layers, GELU, LayerNorm and dropout work token by token, so the encoder takes the
batch's real tokens packed into one row; attention, which needs the batch x length shape, gets its
queries, keys and values padded back (padded keys masked as before) and returns real tokens only.
The pooler sees the usual padded shape again. Same weights, same function: logits and gradients
equal the padded model's up to float rounding (tests check both). The price is a token count and two
nonzero() per forward, which wait for a GPU, and a few index copies per layer; on CPUs without AMX
the work saved outweighs it (`make bench-steps ARGS="--compare padding_free"`; docs/benchmarks.md).
A few padding tokens join the real ones to round their count up to a multiple of 16, which bf16
matmuls run faster on. On a GPU, where a small encoder's step is bound by launching kernels, not by
arithmetic, the extra launches and waits cost more than they save: off there.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from finetune.config.train_config import TrainConfig
from finetune.errors import ConfigError
from finetune.speed.hardware import cpu_has_amx
from finetune.speed.packed_dropout import ATTENTION as PACKED_DROPOUT_ATTENTION
from finetune.speed.packed_dropout import packed_dropout_attention

# Encoders of these model types take (hidden_states, attention_mask=..., **kwargs), pass the kwargs
# down to AttentionInterface, and mix tokens nowhere else (transformers 5.x).
MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "electra")


# The model's attention before, and the padding-free attention that wraps it.
WRAPPED_ATTENTION = {
    "sdpa": ("finetune_padding_free", sdpa_attention_forward),
    PACKED_DROPOUT_ATTENTION: ("finetune_padding_free_packed_dropout", packed_dropout_attention),
}


# bf16 matmuls over a count of rows that is a multiple of 16 run faster than over the bare count on
# AVX512-BF16 CPUs; fp32 ones do not care (`make bench-steps ARGS="--compare rows_multiple"`).
ROWS_MULTIPLE = 16


class PaddedShape(NamedTuple):
    real: torch.Tensor
    """Flat indices in the batch x length grid of the tokens the encoder computes: the real ones, and
    as many padding ones as round their count up to ROWS_MULTIPLE."""
    batch: int
    length: int


def padding_free_pays(device_type: str, torch_compile: bool) -> bool:
    """Whether auto turns padding-free on for a model that takes it: on CPU, where the work saved
    outweighs the packing, except on CPUs with AMX, whose padded matmuls are fast enough that it does not
    pay; not on GPUs (more launches and a wait per forward), nor under torch.compile (nonzero() breaks
    the graph). docs/benchmarks.md has the figures."""
    return device_type == "cpu" and not cpu_has_amx() and not torch_compile


def supports_padding_free(model: nn.Module) -> bool:
    return (
        model.config.model_type in MODEL_TYPES
        and not model.config.is_decoder
        and model.config._attn_implementation in WRAPPED_ATTENTION
    )


def resolve_padding_free(config: TrainConfig, model: nn.Module, device_type: str) -> str:
    """--padding_free as "true" or "false". auto: where it pays (`padding_free_pays`), for a model that
    takes it."""
    if config.padding_free == "auto":
        wanted = padding_free_pays(device_type, config.torch_compile) and supports_padding_free(model)
        return "true" if wanted else "false"
    if config.padding_free == "true" and not supports_padding_free(model):
        raise ConfigError(
            f"--padding_free true: not for this model ({model.config.model_type}, attention "
            f"{model.config._attn_implementation}); it takes {', '.join(MODEL_TYPES)} encoders: "
            "use --padding_free false"
        )
    return config.padding_free


def use_padding_free(model: nn.Module, rows_multiple: int = ROWS_MULTIPLE) -> None:
    """From now on the model's encoder runs on real tokens only (their count rounded up to
    `rows_multiple` with padding ones); weights and outputs are unchanged."""
    if not supports_padding_free(model):
        raise ValueError(f"padding-free needs one of {', '.join(MODEL_TYPES)} with sdpa or packed attention")
    name, inner = WRAPPED_ATTENTION[model.config._attn_implementation]
    # Global registries of transformers, so filled here rather than at import.
    AttentionInterface.register(name, functools.partial(padding_free_attention, inner=inner))
    AttentionMaskInterface.register(name, eager_mask)
    encoder = model.base_model.encoder
    encoder.register_forward_pre_hook(
        functools.partial(_pack_real_tokens, rows_multiple=rows_multiple), with_kwargs=True
    )
    encoder.register_forward_hook(_pad_encoder_output, with_kwargs=True)
    model.set_attn_implementation(name)


def _pack_real_tokens(encoder, args, kwargs, rows_multiple):
    """[batch, length, width] hidden states -> [1, real tokens rounded up to rows_multiple, width],
    and their places passed down to attention as `padding_free`; a batch without padding (or with
    too little to round up) runs as it is."""
    mask = kwargs.get("attention_mask")  # additive [batch, 1, length, length]: 0 where a key counts
    if not args or mask is None:
        return None
    hidden = args[0]
    batch, length, width = hidden.shape
    kept = (mask[:, 0, 0, :] == 0).flatten()
    short = -int(kept.sum()) % rows_multiple
    # The padding tokens that join the real ones are computed as the padded model computes every
    # token; their keys stay masked.
    kept[(~kept).nonzero()[:short, 0]] = True
    real = kept.nonzero().squeeze(1)
    if real.numel() == batch * length:
        return None
    packed = hidden.reshape(batch * length, width).index_select(0, real).unsqueeze(0)
    return (packed, *args[1:]), {**kwargs, "padding_free": PaddedShape(real, batch, length)}


def _pad_encoder_output(encoder, args, kwargs, output):
    shape = kwargs.get("padding_free")
    if shape is not None:
        output.last_hidden_state = _to_grid(output.last_hidden_state[0], shape)
    return output


def _to_grid(tokens: torch.Tensor, shape: PaddedShape) -> torch.Tensor:
    """[real tokens, ...] -> [batch, length, ...], zeros where the padding was."""
    grid = tokens.new_zeros(shape.batch * shape.length, *tokens.shape[1:])
    return grid.index_copy(0, shape.real, tokens).view(shape.batch, shape.length, *tokens.shape[1:])


def padding_free_attention(module, query, key, value, attention_mask, inner, padding_free=None, **kwargs):
    """`inner` attention on [batch, heads, length, head size] rebuilt from packed real tokens; its
    [batch, length, heads, head size] output packed again."""
    if padding_free is None:
        return inner(module, query, key, value, attention_mask, **kwargs)
    # [1, heads, tokens, head size] -> [tokens, heads, head size] -> [batch, length, heads, head size]
    query, key, value = (
        _to_grid(t[0].transpose(0, 1), padding_free).transpose(1, 2) for t in (query, key, value)
    )
    output, _ = inner(module, query, key, value, attention_mask, **kwargs)
    return output.flatten(0, 1).index_select(0, padding_free.real).unsqueeze(0), None

"""Attention without host waits: masks built without asking the device whether a batch holds padding,
and `--padding_free varlen`, whose attention runs on packed real tokens with torch's variable-length
kernel (CUDA only; on CPU a reference that computes the same function, for tests). The same kernel,
causal, runs a decoder's packed documents (`--packing` on CUDA: `use_causal_varlen_attention`).

The varlen batch comes from `finetune.data.batching.VarlenCollator`: one row of the batch's real tokens,
positions restarting in every pair, and `cu_seq_lens_q`/`_k` built on the CPU. transformers passes
those keyword arguments down to the attention function (they are FlashAttention's kwargs), so the
encoder runs as written; a forward hook hands the pooler (BERT) or the head (RoBERTa, ELECTRA) each
pair's first token. torch's kernel has no dropout: attention-probability dropout is not applied on
this path, everything else (hidden-state dropout included) is.
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from finetune.errors import ConfigError
from finetune.speed.padding_free import MODEL_TYPES

VARLEN_ATTENTION = "finetune_varlen"
CAUSAL_VARLEN_ATTENTION = "finetune_causal_varlen"


def use_sync_free_masks(model: nn.Module) -> None:
    """The model's attention, with its mask always built: transformers' SDPA mask otherwise asks
    `attention_mask.all()` every forward (a wait for the GPU) to drop the mask of a batch without
    padding (for a decoder: to use `is_causal` instead). Bucketed batches nearly always hold padding,
    so the answer is almost always no."""
    implementation = model.config._attn_implementation
    if implementation not in ALL_MASK_ATTENTION_FUNCTIONS or implementation not in ALL_ATTENTION_FUNCTIONS:
        return  # eager (not a registered function) or no transformers mask function: nothing to change
    name = f"finetune_{implementation}_mask_always"
    # Global registries of transformers, so filled here rather than at import.
    AttentionInterface.register(name, ALL_ATTENTION_FUNCTIONS[implementation])
    AttentionMaskInterface.register(
        name, functools.partial(_mask_always, ALL_MASK_ATTENTION_FUNCTIONS[implementation])
    )
    model.set_attn_implementation(name)


def _mask_always(make_mask, *args, **kwargs):
    # Both skips ask the device whether the batch holds padding (encoders' bidirectional, decoders' causal).
    kwargs["allow_is_bidirectional_skip"] = False
    kwargs["allow_is_causal_skip"] = False
    return make_mask(*args, **kwargs)


def varlen_position_offset(model: nn.Module) -> int:
    """Where a pair's positions start: RoBERTa and XLM-R count from their padding id + 1."""
    if model.config.model_type in ("roberta", "xlm-roberta"):
        return model.config.pad_token_id + 1
    return 0


def check_varlen(model: nn.Module) -> None:
    if model.config.model_type not in MODEL_TYPES or model.config.is_decoder:
        raise ConfigError(
            f"--padding_free varlen: not for this model ({model.config.model_type}); it takes "
            f"{', '.join(MODEL_TYPES)} encoders: use --padding_free false"
        )


def computes_in_half(model: nn.Module, mixed_precision: str) -> bool:
    """Whether the model's attention sees bf16 or fp16: autocast, or half-precision weights."""
    return mixed_precision in ("bf16", "fp16") or model.dtype in (torch.bfloat16, torch.float16)


def check_varlen_precision(model: nn.Module, device_type: str, mixed_precision: str) -> None:
    """torch's CUDA varlen kernel is FlashAttention's, which takes bf16 and fp16 only: a run whose
    attention would see fp32 is refused before training rather than failing at its first forward."""
    if device_type == "cuda" and not computes_in_half(model, mixed_precision):
        raise ConfigError(
            "--padding_free varlen: torch's varlen attention on CUDA takes bf16 or fp16 only, and this run "
            "trains in fp32; use --mixed_precision bf16, or --padding_free false",
            flag="--padding_free",
            fix="use --mixed_precision bf16, or --padding_free false",
        )


def use_varlen_attention(model: nn.Module) -> None:
    """From now on the model takes `VarlenCollator` batches: attention through `varlen_attention`,
    and the encoder returns [pairs, 1, width]: each pair's first token, all the pooler or head reads."""
    check_varlen(model)
    AttentionInterface.register(VARLEN_ATTENTION, varlen_attention)
    AttentionMaskInterface.register(VARLEN_ATTENTION, _no_mask)
    model.base_model.encoder.register_forward_hook(_first_tokens, with_kwargs=True)
    model.set_attn_implementation(VARLEN_ATTENTION)


def _no_mask(*args, **kwargs):
    return None  # the pairs' bounds are the mask


def _first_tokens(encoder, args, kwargs, output):
    bounds = kwargs.get("cu_seq_lens_q")
    if bounds is not None:  # [pairs + padding segments (as many) + 1]: the pairs' starts come first
        starts = bounds[: (bounds.shape[0] - 1) // 2]
        output.last_hidden_state = output.last_hidden_state[0].index_select(0, starts).unsqueeze(1)
    return output


def varlen_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    scaling=None,
    dropout=0.0,
    cu_seq_lens_q=None,
    cu_seq_lens_k=None,
    max_length_q=None,
    max_length_k=None,
    **kwargs,
):
    """[1, heads, tokens, head size] queries, keys and values of packed pairs -> [1, tokens, heads,
    head size]: each token attends to its own pair only. No attention dropout (see the module)."""
    query, key, value = (t[0].transpose(0, 1) for t in (query, key, value))  # [tokens, heads, head size]
    if query.device.type == "cuda":
        from torch.nn.attention.varlen import varlen_attn

        output = varlen_attn(
            query, key, value, cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k, scale=scaling
        )
    else:
        output = reference_varlen_attention(query, key, value, cu_seq_lens_q, scale=scaling)
    return output.unsqueeze(0), None


def reference_varlen_attention(query, key, value, bounds, scale=None):
    """What torch's varlen kernel computes, on any device: SDPA over all tokens with a block-diagonal
    mask (a token sees the keys of its own segment). Memory grows with tokens²: for tests and CPU runs."""
    tokens = query.shape[0]
    segment = torch.searchsorted(
        bounds[1:], torch.arange(tokens, device=query.device, dtype=bounds.dtype), right=True
    )
    same = segment.unsqueeze(0) == segment.unsqueeze(1)
    output = torch.nn.functional.scaled_dot_product_attention(
        query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), attn_mask=same, scale=scale
    )
    return output.transpose(0, 1)


def use_causal_varlen_attention(model: nn.Module) -> None:
    """From now on a packed micro-batch (one row, `cu_seq_lens_q`/`_k` bounding its documents, no
    attention_mask: `packing.forward_inputs`) runs torch's varlen kernel, causal within each document
    (and within its sliding window), and no mask is built for it; every other forward (evaluation's
    padded rows, generation: each with its attention_mask) is sdpa's own, with its mask. The kernel has
    no dropout: `packing.packed_attention` takes this path only for models without attention dropout."""
    AttentionInterface.register(CAUSAL_VARLEN_ATTENTION, causal_varlen_attention)
    AttentionMaskInterface.register(CAUSAL_VARLEN_ATTENTION, _sdpa_mask_unless_packed)
    model.set_attn_implementation(CAUSAL_VARLEN_ATTENTION)


def _sdpa_mask_unless_packed(*args, attention_mask=None, **kwargs):
    # A packed micro-batch comes without a 2D mask (its bounds are cu_seq_lens): none is built, where
    # transformers would otherwise find the documents in position_ids and build their block mask,
    # [tokens, tokens] for the micro-batch's whole row.
    if attention_mask is None:
        return None
    return ALL_MASK_ATTENTION_FUNCTIONS["sdpa"](*args, attention_mask=attention_mask, **kwargs)


def causal_varlen_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    scaling=None,
    dropout=0.0,
    sliding_window=None,
    cu_seq_lens_q=None,
    cu_seq_lens_k=None,
    max_length_q=None,
    max_length_k=None,
    **kwargs,
):
    """A packed micro-batch's [1, heads, tokens, head size] queries (keys and values: their own heads,
    grouped-query) -> [1, tokens, heads, head size]: each token attends to the earlier tokens of its own
    document, within `sliding_window` tokens (itself included, as transformers' mask counts). Anything
    else goes to sdpa as transformers would send it."""
    if cu_seq_lens_q is None:
        if attention_mask is None and sliding_window and key.shape[2] > sliding_window:
            attention_mask = _window_mask(query.shape[2], key.shape[2], sliding_window, query.device)
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if dropout:
        raise RuntimeError(
            "torch's varlen kernel has no attention dropout: packing should have kept the mask"
        )
    query, key, value = (t[0].transpose(0, 1) for t in (query, key, value))  # [tokens, heads, head size]
    device = query.device.type
    if torch.is_autocast_enabled(device):
        # Autocast casts sdpa's inputs, not this kernel's: rotary embeddings in fp32 leave queries and keys
        # in fp32 beside bf16 values, and the kernel takes one half-precision dtype.
        half = torch.get_autocast_dtype(device)
        query, key, value = (t.to(half) for t in (query, key, value))
    window = (sliding_window - 1 if sliding_window else -1, 0)  # flash's (left, right); right 0: causal
    if device == "cuda":
        from torch.nn.attention.varlen import varlen_attn

        options, repeats = varlen_options(torch_varlen_features(), query.shape[1], key.shape[1], window)
        if repeats > 1:  # a torch whose kernel takes no grouped-query heads: each key/value head, repeated
            key, value = (t.repeat_interleave(repeats, dim=1) for t in (key, value))
        output = varlen_attn(
            query,
            key,
            value,
            cu_seq_lens_q,
            cu_seq_lens_k,
            max_length_q,
            max_length_k,
            scale=scaling,
            **options,
        )
    else:
        output = reference_causal_varlen_attention(query, key, value, cu_seq_lens_q, scaling, window[0])
    return output.unsqueeze(0), None


def _window_mask(queries: int, keys: int, window: int, device) -> torch.Tensor:
    # A forward with neither a 2D mask nor bounds: `_sdpa_mask_unless_packed` built no mask, and sdpa's
    # `is_causal` alone would let a token see past its window. The queries are the keys' last ones.
    back = torch.arange(keys - queries, keys, device=device).unsqueeze(1) - torch.arange(keys, device=device)
    return ((back >= 0) & (back < window))[None, None]


def reference_causal_varlen_attention(query, key, value, bounds, scale=None, left: int = -1):
    """What torch's kernel computes for `causal_varlen_attention`, on any device: SDPA over all tokens
    with a mask (a token sees its own segment's keys up to itself, at most `left` back; -1: all).
    Memory grows with tokens²: for tests and the CPU."""
    if not query.dtype == key.dtype == value.dtype:  # as the kernel, which takes one dtype
        raise TypeError(f"queries, keys and values in {query.dtype}, {key.dtype}, {value.dtype}")
    tokens = query.shape[0]
    at = torch.arange(tokens, device=query.device)
    segment = torch.searchsorted(bounds[1:], at.to(bounds.dtype), right=True)
    back = at.unsqueeze(1) - at.unsqueeze(0)  # query index - key index
    allowed = (segment.unsqueeze(1) == segment.unsqueeze(0)) & (back >= 0) & ((back <= left) | (left < 0))
    output = torch.nn.functional.scaled_dot_product_attention(
        query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), attn_mask=allowed, scale=scale,
        enable_gqa=query.shape[1] != key.shape[1],
    )  # fmt: skip
    return output.transpose(0, 1)


@functools.cache
def torch_varlen_features() -> frozenset[str]:
    """What this torch's varlen kernel takes: "causal" (torch 2.10: `is_causal`), "window" (2.11 and
    later: `window_size`, causal and sliding windows too), "gqa" (`enable_gqa`); empty: no kernel."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return frozenset()
    names = inspect.signature(varlen_attn).parameters
    found = {"window", "causal"} if "window_size" in names else {"causal"} if "is_causal" in names else set()
    return frozenset(found | ({"gqa"} if "enable_gqa" in names else set()))


def varlen_options(features: frozenset[str], heads: int, kv_heads: int, window: tuple[int, int]):
    """The causal kernel's keyword arguments for this torch (`torch_varlen_features`), and how many times
    to repeat each key/value head where it takes no grouped-query heads."""
    if "window" in features:
        options = {"window_size": window}
    elif window[0] == -1 and "causal" in features:
        options = {"is_causal": True}
    else:
        raise RuntimeError(f"torch {torch.__version__}'s varlen attention takes no window of {window[0] + 1}")
    if heads != kv_heads and "gqa" in features:
        return {**options, "enable_gqa": True}, 1
    return options, heads // kv_heads

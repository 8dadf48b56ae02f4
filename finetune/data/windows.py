"""--long_documents sliding_window: texts longer than --max_length as overlapping windows, and the
windows' logits grouped back into one set per document.

Windowing is the fast tokenizer's own (`return_overflowing_tokens`, `stride`), as HF's run_qa does:
every window holds the tokenizer's special tokens; a pair's first text is windowed and its second
text kept whole in every window (`truncation="only_first"`)."""

from __future__ import annotations

import torch

from finetune.errors import ConfigError


def check_room(
    tokenizer, seconds: list[str] | None, max_length: int, doc_stride: int, default_stride: bool = False
) -> None:
    """Refuses windows that cannot hold any of the text, or a stride that leaves them no progress:
    `seconds`, a pair's second texts (None: single texts); `default_stride`: --doc_stride was not given,
    so it is a quarter of --max_length. A --max_length named in a fix passes both checks."""
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(
            "--long_documents sliding_window windows with a fast tokenizer's overflowing tokens; this "
            "model's tokenizer is a slow one: use --long_documents truncate",
            flag="--long_documents",
            fix="use --long_documents truncate, or a model with a fast tokenizer",
        )
    taken = tokenizer.num_special_tokens_to_add(pair=seconds is not None)
    longest = (
        max(len(ids) for ids in tokenizer(seconds, add_special_tokens=False)["input_ids"]) if seconds else 0
    )
    room = max_length - taken - longest
    if doc_stride < room:  # a stride is never negative: room for some of the text too
        return
    enough = f"--max_length {smallest_max_length(taken + longest, doc_stride, default_stride)} or more"
    if seconds and room <= 0:
        raise ConfigError(
            f"--long_documents sliding_window keeps a pair's second text whole in every window, and one "
            f"is {longest} tokens: no room is left in --max_length {max_length} for the first text; "
            f"{enough}, or shorten the second texts",
            flag="--max_length",
        )
    holds = f"the {room} tokens a window holds of the text (--max_length {max_length} less special tokens"
    holds += " and the second text)" if seconds else ")"
    strides = f", or a --doc_stride below {room}, e.g. {max(room // 4, 1)}" if room > 1 else ""
    if default_stride:  # the user gave no --doc_stride: the fix is --max_length first
        raise ConfigError(
            f"the default --doc_stride {doc_stride} (a quarter of --max_length) is not less than {holds}; "
            f"{enough}{strides}",
            flag="--max_length",
        )
    raise ConfigError(
        f"--doc_stride {doc_stride} must be less than {holds}; "
        + (f"--doc_stride below {room}, e.g. {max(room // 4, 1)}, or {enough}" if room > 1 else enough),
        flag="--doc_stride",
    )


def smallest_max_length(taken: int, doc_stride: int, default_stride: bool) -> int:
    """The smallest --max_length that leaves a window more of the text than the stride: `taken` tokens
    (special tokens, a pair's longest second text) aside; a default stride grows with it."""
    length = taken + 1
    while length - taken <= (length // 4 if default_stride else doc_stride):
        length += 1
    return length


def encode_windows(
    tokenizer, texts: list[list[str]], max_length: int, doc_stride: int, default_stride: bool = False
) -> dict:
    """The windows of a batch of texts (one column, or two for pairs): the tokenizer's encoding plus
    `doc`, the position in `texts` each window comes from (windows of a document are consecutive).
    `default_stride`: for check_room's fixes."""
    pair = len(texts) == 2
    check_room(tokenizer, texts[1] if pair else None, max_length, doc_stride, default_stride)
    encoded = tokenizer(
        *texts,
        truncation="only_first" if pair else True,
        max_length=max_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
    )
    encoded["doc"] = encoded.pop("overflow_to_sample_mapping")
    return dict(encoded)


def by_document(docs: torch.Tensor, keys: torch.Tensor, logits: torch.Tensor, aggregation: str):
    """Windows to documents, whatever their order and however many ranks scored them: (the documents'
    numbers, ascending; each one's key (its label or row, the same in all its windows); its logits,
    the mean or the per-class max of its windows'; its number of windows)."""
    documents, inverse, counts = torch.unique(docs, return_inverse=True, return_counts=True)
    index = inverse.view(-1, *([1] * (logits.dim() - 1))).expand_as(logits)
    if aggregation == "max":
        start = torch.full((len(documents), *logits.shape[1:]), -torch.inf, dtype=logits.dtype)
        grouped = start.scatter_reduce(0, index, logits, reduce="amax")
    else:
        # In float64: the windows' order (which differs with the number of ranks) does not change it in fp32.
        summed = torch.zeros((len(documents), *logits.shape[1:]), dtype=torch.float64)
        summed.index_add_(0, inverse, logits.double())
        grouped = (summed / counts.view(-1, *([1] * (logits.dim() - 1)))).to(logits.dtype)
    first = torch.empty(len(documents), dtype=torch.long)
    first[inverse] = torch.arange(len(docs))  # any window of it: all carry the same key
    return documents, keys[first], grouped, counts

"""A tagging micro-batch: windows padded on the right, the labelled sub-tokens found in the collator,
and the loss summed over exactly those sub-tokens, their count from the same tensor (the units the loop
divides an update by), each weighted by --class_weights and smoothed by --label_smoothing_factor."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from finetune.data.batching import bucket
from finetune.families.family import class_weights_tensor
from finetune.families.token_classification.encoding import IGNORE

POSITIONS = "target_positions"
"""The batch's key for the flat positions (in rows x tokens) of its labelled sub-tokens."""


class TagCollator:
    """input_ids, attention_mask (and all-zero token_type_ids where the tokenizer makes them) padded on
    the right to the longest window, rounded up to `pad_to_multiple_of` and capped at `max_length`;
    `labels` padded with -100, `word_index` with -1; `row` one per window."""

    def __init__(self, pad_token_id: int, token_types: bool, pad_to_multiple_of: int | None, max_length: int):
        self.pad_token_id = pad_token_id
        self.token_types = token_types
        self.multiple = pad_to_multiple_of or 1
        self.max_length = max_length

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        rows = len(features)
        width = bucket(max(len(f["input_ids"]) for f in features), self.multiple, self.max_length)
        padded = {
            "input_ids": np.full((rows, width), self.pad_token_id, dtype=np.int64),
            "attention_mask": np.zeros((rows, width), dtype=np.int64),
        }
        fill = {"labels": IGNORE, "word_index": -1}
        for key, value in fill.items():
            if key in features[0]:
                padded[key] = np.full((rows, width), value, dtype=np.int64)
        for i, feature in enumerate(features):
            length = len(feature["input_ids"])
            padded["input_ids"][i, :length] = feature["input_ids"]
            padded["attention_mask"][i, :length] = 1
            for key in fill:
                if key in padded:
                    padded[key][i, :length] = feature[key]
        batch = {key: torch.from_numpy(values) for key, values in padded.items()}
        if self.token_types:
            batch["token_type_ids"] = torch.zeros((rows, width), dtype=torch.int64)
        if "labels" in padded:
            batch[POSITIONS] = torch.from_numpy(np.flatnonzero(padded["labels"].reshape(-1) != IGNORE))
        batch["row"] = torch.tensor([f["row"] for f in features])
        return batch


def _weights(task, device: torch.device) -> torch.Tensor | None:
    return None if task.class_weights is None else class_weights_tensor(task.class_weights, device)


def token_loss(logits: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor, task):
    """(the cross-entropy summed over the labelled sub-tokens in fp32, their count as float64), both from
    the same selection of `labels` (the collator's `positions`): nothing here waits for the device."""
    targets = labels.reshape(-1).index_select(0, positions)
    picked = logits.reshape(-1, logits.shape[-1]).index_select(0, positions).float()
    summed = F.cross_entropy(
        picked, targets, weight=_weights(task, logits.device), label_smoothing=task.label_smoothing,
        reduction="sum",
    )  # fmt: skip
    return summed, (targets != IGNORE).sum(dtype=torch.float64)


def row_losses(logits: torch.Tensor, labels: torch.Tensor, task) -> tuple[torch.Tensor, torch.Tensor]:
    """Per window: (the training loss summed over its labelled sub-tokens, float64; their count), so that
    gathered windows count each sub-token once however they were sharded and batched."""
    labelled = labels != IGNORE
    windows = labelled.nonzero()[:, 0]
    losses = F.cross_entropy(
        logits[labelled].float(), labels[labelled], weight=_weights(task, logits.device),
        label_smoothing=task.label_smoothing, reduction="none",
    ).double()  # fmt: skip
    summed = torch.zeros(labels.shape[0], dtype=torch.float64, device=labels.device)
    return summed.index_add_(0, windows, losses), labelled.sum(dim=1)

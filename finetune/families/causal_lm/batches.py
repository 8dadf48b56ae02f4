"""A causal-LM micro-batch: padded on the right, its targets shifted one to the left in the collator,
and its loss summed over exactly the target tokens counted from the same tensor."""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F

from finetune.data.batching import bucket
from finetune.families.causal_lm.conversations import IGNORE


class CausalLmCollator:
    """input_ids and attention_mask padded on the right (a causal model's real tokens never see the
    padding), rounded up to `pad_to_multiple_of` and capped at `max_length`; `labels` are the targets
    already shifted: position i holds token i+1's id where that token is a target, else -100, so the
    loss reads logits and labels as they are and the last real token of a row predicts nothing.
    Other columns (`row`) are one value per row."""

    def __init__(
        self, pad_token_id: int, pad_to_multiple_of: int | None = None, max_length: int | None = None
    ):
        self.pad_token_id = pad_token_id
        self.multiple = pad_to_multiple_of or 1
        self.max_length = max_length

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        rows = len(features)
        width = bucket(max(len(f["input_ids"]) for f in features), self.multiple, self.max_length)
        input_ids = np.full((rows, width), self.pad_token_id, dtype=np.int64)
        mask = np.zeros((rows, width), dtype=np.int64)
        labels = np.full((rows, width), IGNORE, dtype=np.int64)
        for i, feature in enumerate(features):
            ids = feature["input_ids"]
            input_ids[i, : len(ids)] = ids
            mask[i, : len(ids)] = 1
            if "labels" in feature:
                labels[i, : len(ids) - 1] = feature["labels"][1:]
        batch = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(mask)}
        if "labels" in features[0]:
            batch["labels"] = torch.from_numpy(labels)
            batch[POSITIONS] = target_positions(labels)
        for key in features[0]:
            if key not in ("input_ids", "attention_mask", "labels"):
                batch[key] = torch.tensor([f[key] for f in features])
        return batch


POSITIONS = "target_positions"
"""The batch's key for the flat positions (in rows x tokens) of its targets, found by the collator."""


def target_positions(labels: np.ndarray) -> torch.Tensor:
    """Where the targets are, found on the CPU in the collator: selecting them on the device by a
    boolean mask would make the host wait for it (nonzero) on every micro-batch."""
    return torch.from_numpy(np.flatnonzero(labels.reshape(-1) != IGNORE))


def targets_at(labels: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The target token ids, in `positions`' order (the order `head_at` gives their logits)."""
    return labels.reshape(-1).index_select(0, positions)


def target_loss(
    logits: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the cross-entropy summed over the target tokens, in fp32, their count as float64), both read
    from the same selection of `labels` (`positions`, the collator's), so the count cannot drift from
    the sum. `logits`: every token's, or only the targets' (`head_at`). Only the targets' logits are cast
    to fp32: a whole [rows, tokens, vocabulary] copy would not be. Nothing here waits for the device."""
    targets = targets_at(labels, positions)
    summed = F.cross_entropy(_at(logits, positions).float(), targets, reduction="sum")
    return summed, (targets != IGNORE).sum(dtype=torch.float64)


def row_losses(
    logits: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: (the summed cross-entropy of its targets, float64; their count): evaluation gathers rows,
    so each is counted once however the rows were sharded, batched and padded. `logits` as `target_loss`
    reads them."""
    targets = targets_at(labels, positions)
    losses = F.cross_entropy(_at(logits, positions).float(), targets, reduction="none").double()
    return per_row(losses, labels, positions)


def per_row(losses: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor):
    """`row_losses`' sums from each target's loss (float64, in `positions`' order)."""
    rows = torch.div(positions, labels.shape[1], rounding_mode="floor")
    summed = torch.zeros(labels.shape[0], dtype=torch.float64, device=labels.device).index_add_(
        0, rows, losses
    )
    return summed, (labels != IGNORE).sum(dim=1)


def _at(logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The targets' logits, [targets, vocabulary]. Every token's logits hold more rows than there are
    targets (a row's last token predicts nothing), so as many rows as targets are `head_at`'s, already
    only the targets'."""
    flat = logits.reshape(-1, logits.shape[-1])
    return flat if flat.shape[0] == positions.numel() else flat.index_select(0, positions)


@contextlib.contextmanager
def head_at(model, positions: torch.Tensor | None):
    """While a forward runs: the model's output layer applied only to the hidden states at `positions`
    (flat, in rows x tokens: the targets), so its logits come back as [1, targets, vocabulary]. The
    other tokens' share of the output layer's product is skipped (in a 135M model the output layer is a
    fifth of the forward's FLOPs), and so is the [rows, tokens, vocabulary] tensor, a batch's largest.
    `model` None: nothing changes. Only for models `heads_at_targets` accepted."""
    if model is None:
        yield
        return

    def at_targets(_module, args):
        hidden = args[0]
        return (hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions).unsqueeze(0), *args[1:])

    handle = model.get_output_embeddings().register_forward_pre_hook(at_targets)
    try:
        yield
    finally:
        handle.remove()


def heads_at_targets(model) -> bool:
    """Whether `head_at` gives this model's logits at the targets as its full forward does, tried on three
    tokens picked out of order, in eager attention (the model is still on the CPU, where flash attention
    cannot run, and the output layer does not depend on the attention): an output layer that is not the
    logits' last step, or is called on anything but the hidden states, fails it, and the model keeps its
    full logits."""
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if not isinstance(head, torch.nn.Module) or not isinstance(weight, torch.Tensor):
        return False
    ids = torch.tensor([[1, 2, 3]], device=weight.device)
    picks = torch.tensor([2, 0], device=weight.device)
    # fp32 logits agree to rounding; half-precision ones to their few bits
    tolerance = 1e-4 if weight.dtype == torch.float32 else 2e-2
    training, attention = model.training, model.config._attn_implementation
    model.eval()
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            full = model(input_ids=ids).logits.float()
            with head_at(model, picks):
                picked = model(input_ids=ids).logits.float()
        expected = full[0].index_select(0, picks)
        same_shape = picked.shape == (1, 2, full.shape[-1])
        return same_shape and torch.allclose(picked[0], expected, rtol=tolerance, atol=tolerance)
    except Exception:  # noqa: BLE001  (whatever fails: the model keeps its full logits)
        return False
    finally:
        model.config._attn_implementation = attention
        model.train(training)

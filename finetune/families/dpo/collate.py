"""A DPO micro-batch: its pairs' chosen sequences then their rejected ones, in one batch padded to one
width (one forward for both), as the causal-LM collator pads and shifts them."""

from __future__ import annotations

import torch

from finetune.families.causal_lm.batches import CausalLmCollator

REFERENCE_COLUMNS = ("ref_chosen_logps", "ref_rejected_logps")
"""--precompute_ref_log_probs: each pair's reference log-probs, columns of the encoded rows."""
PAIR_COLUMNS = ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels", "row",
                *REFERENCE_COLUMNS)  # fmt: skip
"""What the loaders read of an encoded pair."""


class PairCollator:
    """Rows 0..R-1 the R pairs' chosen sequences, R..2R-1 their rejected ones (input_ids, attention_mask,
    shifted labels, target positions: `CausalLmCollator`'s), `row` the pairs' row numbers, and their
    precomputed reference log-probs where the rows carry them."""

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None, max_length: int | None):
        self.sequences = CausalLmCollator(pad_token_id, pad_to_multiple_of, max_length)

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        sides = [
            {"input_ids": f[f"{side}_input_ids"], "labels": f[f"{side}_labels"]}
            for side in ("chosen", "rejected")
            for f in features
        ]
        batch = self.sequences(sides)
        batch["row"] = torch.tensor([f["row"] for f in features])
        for column in REFERENCE_COLUMNS:
            if column in features[0]:
                batch[column] = torch.tensor([f[column] for f in features], dtype=torch.float32)
        return batch

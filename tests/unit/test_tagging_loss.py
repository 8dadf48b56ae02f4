"""The tagging loss: summed over exactly the labelled sub-tokens, their count the units, each sub-token's
cross-entropy weighted by --class_weights and smoothed by --label_smoothing_factor; evaluation's per-window
sums add up to the same; the collator pads labels with -100 and finds the labelled positions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from finetune.families.token_classification.batches import POSITIONS, TagCollator, row_losses, token_loss
from finetune.families.token_classification.encoding import IGNORE
from finetune.families.token_classification.task import TagTask


def features():
    return [
        {
            "input_ids": [101, 7, 8, 102],
            "labels": [IGNORE, 2, 0, IGNORE],
            "word_index": [-1, 0, 1, -1],
            "row": 0,
        },
        {"input_ids": [101, 9, 102], "labels": [IGNORE, 1, IGNORE], "word_index": [-1, 0, -1], "row": 1},
    ]


def test_the_collator_pads_labels_and_word_index_and_finds_the_labelled_positions():
    batch = TagCollator(0, token_types=True, pad_to_multiple_of=None, max_length=8)(features())
    assert batch["input_ids"].tolist() == [[101, 7, 8, 102], [101, 9, 102, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert batch["labels"].tolist() == [[IGNORE, 2, 0, IGNORE], [IGNORE, 1, IGNORE, IGNORE]]
    assert batch["word_index"][1].tolist() == [-1, 0, -1, -1]
    assert batch[POSITIONS].tolist() == [1, 2, 5]
    assert batch["token_type_ids"].sum() == 0 and batch["row"].tolist() == [0, 1]


@pytest.mark.parametrize("weights, smoothing", [(None, 0.0), ((0.5, 2.0, 1.0), 0.0), ((0.5, 2.0, 1.0), 0.1)])
def test_the_loss_is_summed_per_labelled_sub_token_with_weights_and_smoothing(weights, smoothing):
    task = TagTask(label_names=("O", "B-X", "I-X"), scheme="IOB2", format="rows", class_weights=weights,
                   label_smoothing=smoothing)  # fmt: skip
    batch = TagCollator(0, False, None, 8)(features())
    logits = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(0))
    summed, units = token_loss(logits, batch["labels"], batch[POSITIONS], task)
    assert units.dtype == torch.float64 and units.item() == 3
    expected = 0.0
    for row, position, label in ((0, 1, 2), (0, 2, 0), (1, 1, 1)):
        one = F.cross_entropy(logits[row, position][None], torch.tensor([label]), label_smoothing=smoothing,
                              weight=None if weights is None else torch.tensor(weights))  # fmt: skip
        expected += float(one) * (1.0 if weights is None else weights[label])
    assert float(summed) == pytest.approx(expected, rel=1e-6)
    per_row, counts = row_losses(logits, batch["labels"], task)
    assert counts.tolist() == [2, 1] and float(per_row.sum()) == pytest.approx(expected, rel=1e-6)

"""A DPO micro-batch, in one of two layouts that give the same log-probs:

- padded (`PairCollator`): the R pairs' chosen sequences then their rejected ones, 2R rows padded to one
  width, as the causal-LM collator pads them;
- shared prefix (`SharedPrefixCollator`, --prefix_sharing): one row a pair, the tokens chosen and
  rejected share (the prompt, and any first completion tokens they agree on) once, then the chosen tail,
  then the rejected tail, which sees the shared tokens but not the chosen tail (a 4-D attention mask) and
  takes up the positions where the shared tokens end. A causal model computes each shared token's hidden
  states the same for both completions, so running them once is exact; with a chat template's system
  prompt the shared tokens are most of a short pair (SmolLM2: 31% fewer tokens on make bench-dpo's pairs).

Both give the targets as `Targets`: where each target's logit is, its token, and which of the 2R
sequences (chosen i, rejected R + i) it scores."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from finetune.data.batching import bucket
from finetune.families.causal_lm.batches import POSITIONS, CausalLmCollator, targets_at
from finetune.families.causal_lm.conversations import IGNORE
from finetune.families.dpo.pairs import common_length

REFERENCE_COLUMNS = ("ref_chosen_logps", "ref_rejected_logps")
"""--precompute_ref_log_probs: each pair's reference log-probs, columns of the encoded rows."""
PAIR_COLUMNS = ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels", "row",
                *REFERENCE_COLUMNS)  # fmt: skip
"""What the loaders read of an encoded pair."""
TARGET_KEYS = (POSITIONS, "target_ids", "target_sequences", "target_counts", "real_tokens")
"""The batch's keys that are `Targets`', not the model's inputs."""


@dataclass
class Targets:
    """A micro-batch's target tokens, found on the CPU by its collator."""

    positions: torch.Tensor
    """Flat, in rows x width: where each target's logit is (`head_at` reads them in this order)."""
    ids: torch.Tensor
    """Each target's token id."""
    sequences: torch.Tensor
    """Each target's sequence: i for pair i's chosen completion, pairs + i for its rejected one."""
    counts: torch.Tensor
    """[2 x pairs]: each sequence's number of targets."""
    real_tokens: torch.Tensor
    """The tokens the forward computes that are not padding."""

    @classmethod
    def pop(cls, batch: dict) -> Targets:
        """Taken out of `batch`, which is left with the model's inputs (and `row`, the reference's)."""
        return cls(*(batch.pop(key) for key in TARGET_KEYS))


class PairCollator:
    """The padded layout: rows 0..R-1 the R pairs' chosen sequences, R..2R-1 their rejected ones
    (input_ids, attention_mask: `CausalLmCollator`'s), `row` the pairs' row numbers, and their
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
        labels, positions = batch.pop("labels"), batch[POSITIONS]
        batch["target_ids"] = targets_at(labels, positions)
        batch["target_sequences"] = torch.div(positions, labels.shape[1], rounding_mode="floor")
        batch["target_counts"] = (labels != IGNORE).sum(dim=1)
        batch["real_tokens"] = batch["attention_mask"].sum()
        return _with_pair_columns(batch, features)


class SharedPrefixCollator:
    """The shared-prefix layout: input_ids [R, width] (padded on the right), position_ids, a boolean
    attention_mask [R, 1, width, width] (True: may attend), `row`, the reference log-probs where the rows
    carry them, and the targets."""

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None):
        self.pad_token_id = pad_token_id
        self.multiple = pad_to_multiple_of or 1

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        layouts = [_shared_layout(f["chosen_input_ids"], f["rejected_input_ids"]) for f in features]
        pairs, width = len(features), bucket(max(len(ids) for ids, *_ in layouts), self.multiple, None)
        input_ids = np.full((pairs, width), self.pad_token_id, dtype=np.int64)
        position_ids = np.zeros((pairs, width), dtype=np.int64)
        causal = np.tril(np.ones((width, width), dtype=bool))
        mask = np.repeat(causal[None, None], pairs, axis=0)
        found = {side: ([], [], []) for side in ("chosen", "rejected")}
        counts = np.zeros(2 * pairs, dtype=np.int64)
        for i, (feature, layout) in enumerate(zip(features, layouts, strict=True)):
            ids, positions, shared, chosen_end = layout
            input_ids[i, : len(ids)] = ids
            position_ids[i, : len(ids)] = positions
            mask[i, 0, chosen_end : len(ids), shared:chosen_end] = False  # rejected never sees chosen's tail
            for side, sequence, tail in (("chosen", i, shared), ("rejected", pairs + i, chosen_end)):
                labels = np.asarray(feature[f"{side}_labels"])
                targets = np.flatnonzero(labels[1:] != IGNORE)  # token k+1 is predicted at token k
                # where token k's hidden state is in the row: shared tokens once, then the side's tail
                at = np.where(targets < shared, targets, targets - shared + tail)
                found[side][0].append(i * width + at)
                found[side][1].append(labels[1:][targets])
                found[side][2].append(np.full(len(targets), sequence))
                counts[sequence] = len(targets)
        positions, ids, sequences = (
            torch.from_numpy(np.concatenate(found["chosen"][k] + found["rejected"][k])) for k in range(3)
        )
        batch = {
            "input_ids": torch.from_numpy(input_ids),
            "position_ids": torch.from_numpy(position_ids),
            "attention_mask": torch.from_numpy(mask),
            POSITIONS: positions,
            "target_ids": ids,
            "target_sequences": sequences,
            "target_counts": torch.from_numpy(counts),
            "real_tokens": torch.tensor(sum(len(ids) for ids, *_ in layouts)),
        }
        return _with_pair_columns(batch, features)


def _shared_layout(chosen: list[int], rejected: list[int]) -> tuple[list[int], list[int], int, int]:
    """(the row's token ids, their positions, how many tokens both share, where chosen's tail ends)."""
    shared = common_length(chosen, rejected)
    ids = list(chosen) + list(rejected[shared:])
    positions = list(range(len(chosen))) + list(range(shared, len(rejected)))
    return ids, positions, shared, len(chosen)


def _with_pair_columns(batch: dict, features: list[dict]) -> dict[str, torch.Tensor]:
    batch["row"] = torch.tensor([f["row"] for f in features])
    for column in REFERENCE_COLUMNS:
        if column in features[0]:
            batch[column] = torch.tensor([f[column] for f in features], dtype=torch.float32)
    return batch


def shares_prefixes(model) -> bool:
    """Whether the shared-prefix layout gives this model the padded layout's log-probs: tried on a pair
    of 6 and 5 tokens sharing 3, in eval mode without gradients, wherever the model is. An attention that
    misreads a 4-D boolean mask (eager adds it to its scores), or positions taken from anything but
    `position_ids`, fails it; flash and flex attention (which take no such mask) and a sliding window
    (which the mask would not keep) are not tried."""
    from finetune.families.dpo.loss import sequence_logps  # loss.py reads this module's Targets

    config = model.config
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):  # flash, flex: no 4-D mask
        return False
    pair = {"chosen_input_ids": [1, 2, 3, 4, 5, 6], "chosen_labels": [IGNORE] * 3 + [4, 5, 6],
            "rejected_input_ids": [1, 2, 3, 7, 8], "rejected_labels": [IGNORE] * 3 + [7, 8],
            "row": 0}  # fmt: skip
    weight = next(model.parameters())
    found = []
    training = model.training
    model.eval()
    try:
        for collate in (PairCollator(0, None, None), SharedPrefixCollator(0, None)):
            batch = {k: v.to(weight.device) for k, v in collate([pair]).items()}
            targets = Targets.pop(batch)
            batch.pop("row")
            with torch.no_grad():
                found.append(sequence_logps(model(**batch, use_cache=False).logits, targets)[0])
    except (RuntimeError, ValueError, TypeError):  # a model whose attention cannot take the mask at all
        return False
    finally:
        model.train(training)
    tolerance = 1e-4 if weight.dtype == torch.float32 else 5e-2
    return bool(torch.allclose(found[0], found[1], rtol=tolerance, atol=tolerance))

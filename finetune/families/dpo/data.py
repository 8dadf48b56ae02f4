"""A MINIMAL stand-in for DPO's data (prompt, chosen, rejected strings from local files), so the family's
tests run; the real module (formats, implicit prompt, masking, truncation) replaces it. Its contract:
`load_preference_splits(config) -> (PreferenceTask, {split: Dataset})` and `encode_pairs(...)`, whose rows
hold chosen_input_ids, chosen_labels, rejected_input_ids, rejected_labels, chosen_targets,
rejected_targets, row and length."""

from __future__ import annotations

from dataclasses import dataclass, field

from datasets import Dataset

from finetune.data.sources import load_data_file
from finetune.errors import ConfigError
from finetune.families.causal_lm.conversations import IGNORE

COLUMNS = ("prompt", "chosen", "rejected")


@dataclass
class PreferenceTask:
    format: str = "prompt_chosen_rejected"
    name: str = "dpo"
    validation_splits: tuple[str, ...] = ("validation",)
    counts: dict = field(default_factory=dict)

    def metric_keys(self, per_class: bool = True) -> list[str]:
        return [
            "eval_rewards/accuracies",
            "eval_rewards/margins",
            "eval_rewards/chosen",
            "eval_rewards/rejected",
        ]

    def summary(self) -> str:
        splits = "; ".join(f"{name} {c['rows']:,} pairs" for name, c in self.counts.items())
        return f"task: dpo, prompt-chosen-rejected pairs; {splits}"


def load_preference_splits(config) -> tuple[PreferenceTask, dict[str, Dataset]]:
    files = {"train": config.train_file if config.do_train else None, "validation": config.validation_file}
    splits = {name: load_data_file(path, ()) for name, path in files.items() if path}
    for name, split in splits.items():
        missing = [c for c in COLUMNS if c not in split.column_names]
        if missing:
            raise ConfigError(f"{files[name]}: no {', '.join(missing)} column; give prompt, chosen, rejected")
    for name, limit in (("train", config.max_train_samples), ("validation", config.max_eval_samples)):
        if name in splits and limit is not None and limit < len(splits[name]):
            splits[name] = splits[name].select(range(limit))
    return PreferenceTask(), splits


def encode_pairs(task: PreferenceTask, splits: dict, tokenizer, config, accelerator) -> dict[str, Dataset]:
    """Prompt tokens then completion tokens and EOS, the labels on the completion (cut at --max_length)."""
    encoded = {}
    for name, split in splits.items():
        columns = {k: [] for k in ("chosen_input_ids", "chosen_labels", "rejected_input_ids",
                                   "rejected_labels", "chosen_targets", "rejected_targets", "row",
                                   "length")}  # fmt: skip
        for number, row in enumerate(split):
            prompt = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
            for side in ("chosen", "rejected"):
                completion = tokenizer(row[side], add_special_tokens=False)["input_ids"]
                ids = (prompt + completion + [tokenizer.eos_token_id])[: config.max_length]
                labels = ([IGNORE] * len(prompt) + completion + [tokenizer.eos_token_id])[: config.max_length]
                columns[f"{side}_input_ids"].append(ids)
                columns[f"{side}_labels"].append(labels)
                columns[f"{side}_targets"].append(sum(label != IGNORE for label in labels[1:]))
            columns["row"].append(number)
            columns["length"].append(
                max(len(columns["chosen_input_ids"][-1]), len(columns["rejected_input_ids"][-1]))
            )
        encoded[name] = Dataset.from_dict(columns)
        task.counts[name] = {"rows": len(encoded[name])}
    return encoded

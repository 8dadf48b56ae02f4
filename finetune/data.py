"""MNLI data: local files or the Hub, labels in the GLUE convention, cached tokenization, dataloaders."""

from __future__ import annotations

import csv
from pathlib import Path

import torch
from datasets import Dataset, Value, load_dataset
from torch.utils.data import DataLoader, Sampler
from transformers import DataCollatorWithPadding

from finetune.config import ConfigError, TrainConfig

LABEL_NAMES = ("entailment", "neutral", "contradiction")
TEXT_COLUMNS = ("premise", "hypothesis")
MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask", "labels")


def load_splits(config: TrainConfig) -> dict[str, Dataset]:
    """Raw splits with an integer `label` column: train, validation_matched[, validation_mismatched]."""
    if config.uses_local_files:
        files = {"train": config.train_file, "validation_matched": config.validation_file}
        if config.validation_mismatched_file:
            files["validation_mismatched"] = config.validation_mismatched_file
        splits = {name: _load_file(path) for name, path in files.items()}
        sources = files
    else:
        hub = load_dataset(config.dataset_name, config.dataset_config_name)
        names = [n for n in ("train", "validation_matched", "validation_mismatched") if n in hub]
        splits = {n: hub[n] for n in names}
        sources = {n: f"{config.dataset_name}/{config.dataset_config_name}:{n}" for n in names}
    for name, split in splits.items():
        splits[name] = _normalize_labels(split, sources[name])
    limits = {"train": config.max_train_samples}
    for name, split in splits.items():
        limit = limits.get(name, config.max_eval_samples)
        if limit is not None and limit < len(split):
            splits[name] = split.select(range(limit))
    return splits


def _load_file(path: str) -> Dataset:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"data file {path} does not exist; check the path")
    if file.stat().st_size == 0:
        raise ConfigError(f"data file {path} is empty")
    suffix = file.suffix.lower()
    if suffix in (".jsonl", ".json"):
        dataset = load_dataset("json", data_files=str(file), split="train")
    elif suffix == ".tsv":
        # GLUE's own .tsv files hold unbalanced quotes, so quotes are text, not delimiters.
        dataset = load_dataset(
            "csv", data_files=str(file), split="train", delimiter="\t", quoting=csv.QUOTE_NONE
        )
    else:
        dataset = load_dataset("csv", data_files=str(file), split="train")
    missing = [c for c in (*TEXT_COLUMNS, "label") if c not in dataset.column_names]
    if missing:
        raise ConfigError(
            f"data file {path} lacks column(s) {', '.join(missing)}; found {', '.join(dataset.column_names)}"
        )
    return dataset


def _normalize_labels(dataset: Dataset, source: str) -> Dataset:
    """Labels as 0/1/2 (GLUE: entailment, neutral, contradiction), given as ints or those words."""
    to_id = {name: i for i, name in enumerate(LABEL_NAMES)}
    to_id.update({str(i): i for i in range(len(LABEL_NAMES))})
    to_id.update({i: i for i in range(len(LABEL_NAMES))})

    def key(value):
        return value.strip().lower() if isinstance(value, str) else value

    bad = [v for v in dataset.unique("label") if key(v) not in to_id]
    if bad:
        first_row = dataset["label"].index(bad[0])
        shown = ", ".join(repr(v) for v in bad[:5])
        raise ConfigError(
            f"{source}: label value(s) {shown} (first at row {first_row}) are not in "
            f"0/1/2 or {'/'.join(LABEL_NAMES)}"
        )
    if all(isinstance(v, int) for v in dataset.unique("label")):
        return dataset
    features = dataset.features.copy()
    features["label"] = Value("int64")
    return dataset.map(
        lambda b: {"label": [to_id[key(v)] for v in b["label"]]},
        batched=True,
        features=features,
        desc="labels",
    )


def tokenize_splits(
    splits: dict[str, Dataset], tokenizer, max_length: int, accelerator
) -> dict[str, Dataset]:
    """Token ids plus a `length` column; cached by `datasets`, so a second run skips the work."""

    def encode(batch):
        encoded = tokenizer(batch["premise"], batch["hypothesis"], truncation=True, max_length=max_length)
        encoded["labels"] = batch["label"]
        encoded["length"] = [len(ids) for ids in encoded["input_ids"]]
        return encoded

    # Rank 0 tokenizes and writes the cache first; the other ranks then read it instead of redoing it.
    with accelerator.main_process_first():
        return {
            name: split.map(encode, batched=True, remove_columns=split.column_names, desc=f"tokenize {name}")
            for name, split in splits.items()
        }


class LengthGroupedSampler(Sampler[int]):
    """A fresh seeded shuffle every epoch; with grouping, sorted by length inside mega-batches.

    Sorting inside chunks of `mega_batch_size` shuffled indices keeps batches random across the
    epoch while each batch holds pairs of similar length, so little of it is padding. The order is a
    pure function of (seed, epoch): Accelerate shards it by whole batches, and a resumed run that
    sets the same epoch and skips the finished batches sees exactly the same data.
    """

    def __init__(self, lengths: list[int], mega_batch_size: int, seed: int, group_by_length: bool = True):
        self.lengths = lengths
        self.mega_batch_size = mega_batch_size
        self.seed = seed
        self.group_by_length = group_by_length
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        if not self.group_by_length:
            return iter(order)
        grouped = []
        for start in range(0, len(order), self.mega_batch_size):
            chunk = order[start : start + self.mega_batch_size]
            grouped.extend(sorted(chunk, key=self.lengths.__getitem__, reverse=True))
        return iter(grouped)


def build_dataloaders(
    tokenized: dict[str, Dataset], tokenizer, config: TrainConfig, world_size: int, on_gpu: bool
) -> tuple[DataLoader, dict[str, DataLoader]]:
    # Tensor cores want sequence lengths in multiples of 8; on CPU that would only add padding.
    collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if on_gpu else None)
    workers = config.dataloader_num_workers
    common = {
        "collate_fn": collator,
        "num_workers": workers,
        "pin_memory": on_gpu,
        "persistent_workers": workers > 0,
    }
    train = tokenized["train"]
    sampler = LengthGroupedSampler(
        train["length"],
        mega_batch_size=50 * config.per_device_train_batch_size * world_size,
        seed=config.seed,
        group_by_length=config.group_by_length,
    )
    train_loader = DataLoader(
        train.select_columns([c for c in MODEL_INPUTS if c in train.column_names]),
        batch_size=config.per_device_train_batch_size,
        sampler=sampler,
        # Its own generator, so starting an epoch draws nothing from the global RNG that dropout uses.
        generator=torch.Generator().manual_seed(config.seed),
        **common,
    )
    eval_loaders = {}
    for name, split in tokenized.items():
        if name == "train":
            continue
        lengths = split["length"]
        # Length-sorted evaluation pads almost nothing; accuracy does not depend on the order.
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        eval_loaders[name] = DataLoader(
            split.select_columns([c for c in MODEL_INPUTS if c in split.column_names]),
            batch_size=config.per_device_eval_batch_size,
            sampler=order,
            **common,
        )
    return train_loader, eval_loaders

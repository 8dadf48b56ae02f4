"""The task and its splits: read (finetune/data/sources.py), labels as class ids
(finetune/data/labels.py), a validation split carved from the training rows, --max_*_samples."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from datasets import Dataset, List

from finetune.config.train_config import TrainConfig
from finetune.data.labels import (
    _class_weights,
    _custom_label_names,
    _is_multi_label,
    _label_note,
    _multi_hot,
    _multi_label_names,
    _normalize_labels,
    model_head,
    settle_label_order,
)
from finetune.data.rows import refuse_a_float_among_integers, refuse_rows_without_text
from finetune.data.sources import read_splits
from finetune.data.tasks import GLUE_TASKS, Task, custom_task
from finetune.errors import ConfigError


def load_splits(config: TrainConfig) -> tuple[Task, dict[str, Dataset]]:
    """The task, with its label names settled, and its raw splits: train, the validation split(s),
    test. Labels become a `label` column of class ids (floats for regression); test has none."""
    task = GLUE_TASKS.get(config.task_name)
    columns = config.text_column_names or task.text_columns
    wanted = {
        "train": config.do_train or config.carves_validation,
        # Not when carved from the training rows (--validation_split_percentage), nor for a training run
        # that does not evaluate.
        **dict.fromkeys(
            task.validation_splits if task else ("validation",),
            not config.carves_validation and (config.evaluates_training or not config.do_train),
        ),
        "test": config.do_predict,
    }
    splits, sources, declared = read_splits(config, task, wanted)
    for name, split in splits.items():
        refuse_rows_without_text(split, sources[name], columns)
    if task is None:
        if declared and "train" in splits:  # the dataset's own names, in its own id order
            multi_label, names = isinstance(splits["train"].features["label"], List), declared
        else:
            multi_label = _is_multi_label(splits, config)
            names = _multi_label_names(splits, config) if multi_label else _custom_label_names(splits, config)
        task = custom_task(columns, names, multi_label)
        if task.is_regression and "train" in splits and _whole_numbers(splits["train"]):
            refuse_a_float_among_integers(config.train_file, config.label_column)
        task = replace(task, label_note=_label_note(task, splits, config))  # said in the run's task line
    else:
        task = task.with_columns(config.text_column_names)
    canonical = task.label_names  # the order the data's class ids (GLUE's 0, 1, 2) are written in
    task, _ = settle_label_order(
        task,
        model_head(config.model_name_or_path, config.hub_options),
        config.ignore_mismatched_sizes,
        config.do_train,
        config.model_name_or_path,
    )
    for name, split in splits.items():
        if name == "test":
            continue
        if task.multi_label:
            splits[name] = _multi_hot(split, sources[name], task, config.cell_label_separator)
        else:
            splits[name] = _normalize_labels(split, sources[name], task, canonical)
    if config.carves_validation:
        held_out = task.validation_splits[0]
        splits["train"], splits[held_out] = _carve_validation(splits["train"], config, task)
        sources[held_out] = f"{sources['train']} ({config.validation_split_percentage}% held out)"
    if config.label_smoothing_factor and (task.is_regression or task.multi_label):
        raise ConfigError(
            "--label_smoothing_factor is for single-label classification; drop it for this task"
        )
    task = replace(
        task,
        class_weights=_class_weights(config, task, splits),
        threshold=config.multi_label_threshold,
        label_smoothing=config.label_smoothing_factor,
        window_aggregation=config.window_aggregation,
    )
    limits = {"train": config.max_train_samples, "test": None}
    for name, split in splits.items():
        limit = limits.get(name, config.max_eval_samples)
        if limit is not None and limit < len(split):
            splits[name] = split.select(range(limit))
    return task, splits


def _whole_numbers(split: Dataset) -> bool:
    scores = np.asarray(split["label"], dtype=np.float64)
    return bool(np.all(scores[np.isfinite(scores)] == np.round(scores[np.isfinite(scores)])))


def _carve_validation(train: Dataset, config: TrainConfig, task: Task) -> tuple[Dataset, Dataset]:
    """--validation_split_percentage of the training rows, drawn with --seed from each class alike
    (single-label), at random otherwise; every rank draws the same rows."""
    rng = np.random.default_rng(config.seed)
    stratify = not (task.is_regression or task.multi_label)
    groups = np.asarray(train["label"]) if stratify else np.zeros(len(train), dtype=np.int64)
    held = []
    for value in np.unique(groups):
        rows = np.flatnonzero(groups == value)
        rng.shuffle(rows)
        held.extend(rows[: round(len(rows) * config.validation_split_percentage / 100)].tolist())
    if not held or len(held) == len(train):
        raise ConfigError(
            f"--validation_split_percentage {config.validation_split_percentage} of the {len(train)} rows "
            f"of {config.train_source} leaves no validation or no training rows; change it"
        )
    kept = np.ones(len(train), dtype=bool)
    kept[held] = False
    return train.select(np.flatnonzero(kept).tolist()), train.select(sorted(held))

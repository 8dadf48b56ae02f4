"""Labels: custom label names and multi-label inferred from the data, labels as class ids (or
multi-hot, or float scores), class weights; the label order of the model's own head."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
from datasets import Dataset, List, Value
from transformers import AutoConfig

from finetune.config.train_config import TrainConfig
from finetune.data.tasks import Task
from finetune.errors import ConfigError
from finetune.model.options import loading_error


def _is_multi_label(splits: dict[str, Dataset], config: TrainConfig) -> bool:
    """A list in a label cell (a JSON list, or --label_separator in a CSV/TSV cell) of the training
    file; without training, the model's problem_type."""
    if "train" not in splits:
        return _model_problem_type(config) == "multi_label_classification"
    train = splits["train"]
    feature = train.features["label"]
    if isinstance(feature, List):
        return True
    if isinstance(feature, Value) and not _is_text(feature):
        return False
    values = train.unique("label") if isinstance(feature, Value) else train["label"]
    separator = config.cell_label_separator
    return any(isinstance(v, list) or (isinstance(v, str) and separator and separator in v) for v in values)


def _label_note(task: Task, splits: dict[str, Dataset], config: TrainConfig) -> str | None:
    """For the run's task line: label text split into several labels, or whole-number floats (what
    pandas writes for integers beside a NaN) read as scores, where classes may have been meant."""
    if "train" not in splits:
        return None
    feature = splits["train"].features["label"]
    if not task.multi_label and _is_text(feature):
        labels = [v for v in splits["train"].unique("label") if v is not None]
        variants = [" = ".join(s) for s in _spellings(labels).values() if len(s) > 1]
        if variants:
            return f"labels that differ only in case or spaces are one class: {'; '.join(variants)}"
    if task.multi_label and _is_text(feature):
        return f"label cells split on --label_separator {config.cell_label_separator!r}"
    if task.is_regression:
        values = np.unique(np.asarray(splits["train"]["label"], dtype=np.float64))
        if len(values) <= 10 and np.all(values == np.round(values)):
            shown = ", ".join(f"{v:g}.0" for v in values[:4]) + (", ..." if len(values) > 4 else "")
            return f"the labels {shown} are floats; write them as integers or names for classes"
    return None


def _is_text(feature) -> bool:
    return isinstance(feature, Value) and feature.dtype in ("string", "large_string")  # CSV: large_string


def _model_problem_type(config: TrainConfig) -> str | None:
    try:
        return AutoConfig.from_pretrained(config.model_name_or_path, **config.hub_options).problem_type
    except OSError:
        raise ConfigError(
            f"--model_name_or_path {config.model_name_or_path}: no model config there to read "
            "the label names from"
        ) from None


def _label_list(value, separator: str | None) -> list[str]:
    """One multi-label cell as label names: a JSON list, `a|b` text, one label, or nothing."""
    if value is None:
        return []
    if isinstance(value, list):
        return [str(v).strip() for v in value if v is not None and str(v).strip()]
    parts = [str(value)] if separator is None else str(value).split(separator)
    return [part.strip() for part in parts if part.strip()]


def _multi_label_names(splits: dict[str, Dataset], config: TrainConfig) -> tuple[str, ...]:
    """Sorted distinct labels of the training rows' lists; without training, the model's names."""
    if "train" not in splits:
        return _custom_label_names(splits, config)
    separator = config.cell_label_separator
    names = {name for value in splits["train"]["label"] for name in _label_list(value, separator)}
    if not names:
        raise ConfigError(
            f"{config.train_source}: every row has an empty label list; a multi-label task "
            "needs rows tagged with at least one label"
        )
    if all(name.lstrip("-").isdigit() for name in names):
        return tuple(sorted(names, key=int))
    spelled = {}  # a label in several cases counts once, under its first spelling in sorted order
    for name in sorted(names):
        spelled.setdefault(name.lower(), name)
    return tuple(sorted(spelled.values()))


def _multi_hot(dataset: Dataset, source: str, task: Task, separator: str | None) -> Dataset:
    """Each row's label list as a float 0/1 vector in the task's label order (names in any case)."""
    to_id = {name.lower(): i for i, name in enumerate(task.label_names)}
    values = dataset["label"]
    rows = [_label_list(v, separator) for v in values]
    for row, names in enumerate(rows):
        bad = [n for n in names if n.lower() not in to_id]
        if bad:
            raise ConfigError(
                f"{source}: label value(s) {', '.join(repr(b) for b in bad[:5])} (first at row {row}) "
                f"are not in {'/'.join(task.label_names)}"
            )
    vectors = np.zeros((len(rows), task.num_labels), dtype=np.float32)
    for row, names in enumerate(rows):
        vectors[row, [to_id[n.lower()] for n in names]] = 1.0
    features = dataset.features.copy()
    features["label"] = List(Value("float32"))
    dataset = dataset.remove_columns("label")
    return dataset.add_column("label", vectors.tolist(), feature=features["label"])


def _class_weights(config: TrainConfig, task: Task, splits: dict[str, Dataset]) -> tuple[float, ...] | None:
    """--class_weights as one weight per class in the task's label order; 'balanced' from the
    training labels, as sklearn's compute_class_weight."""
    if config.class_weights is None:
        return None
    if task.is_regression or task.multi_label:
        raise ConfigError("--class_weights is for single-label classification; drop it for this task")
    names = task.label_names
    weights = config.listed_class_weights
    if weights is not None:
        if len(weights) != len(names):
            raise ConfigError(
                f"--class_weights has {len(weights)} weights; give one per label, in the order "
                f"{','.join(names)}"
            )
        return weights
    if "train" not in splits:
        return None  # only the training loss uses them
    counts = np.bincount(np.asarray(splits["train"]["label"]), minlength=len(names))
    if (counts == 0).any():
        missing = ", ".join(n for n, c in zip(names, counts, strict=True) if c == 0)
        raise ConfigError(
            f"--class_weights balanced: no training row has the label(s) {missing}; give a comma list instead"
        )
    return tuple(float(w) for w in counts.sum() / (len(names) * counts))


def _custom_label_names(splits: dict[str, Dataset], config: TrainConfig) -> tuple[str, ...] | None:
    """Sorted distinct training labels (numerically when they are integers); float labels: None
    (regression). Without training, the names the model was trained with (its config.json)."""
    if "train" not in splits:
        try:
            model_config = AutoConfig.from_pretrained(config.model_name_or_path, **config.hub_options)
        except ValueError as error:  # e.g. code shipped with the model, without --trust_remote_code
            raise loading_error(config.model_name_or_path, error, {}) from None
        except OSError:
            raise ConfigError(
                f"--model_name_or_path {config.model_name_or_path}: no model config there to read "
                "the label names from"
            ) from None
        if model_config.problem_type == "regression":
            return None
        return tuple(model_config.id2label[i] for i in range(model_config.num_labels))
    train = splits["train"]
    if train.features["label"].dtype.startswith("float"):
        return None
    values = [v for v in train.unique("label") if v is not None]
    spellings = _spellings(values)
    if len(spellings) < 2:
        raise ConfigError(
            f"{config.train_source}: every row has the label {values[0] if values else None!r}; "
            "a classifier needs at least two classes in its training data"
        )
    if all(isinstance(v, int) for v in values):
        return tuple(str(v) for v in sorted(values))
    if any(len(s) > 1 for s in spellings.values()):  # one class, named as most rows write it
        counts = Counter(str(v).strip() for v in train["label"] if v is not None)
        return tuple(sorted(max(s, key=lambda name: (counts[name], name)) for s in spellings.values()))
    return tuple(sorted(s[0] for s in spellings.values()))


def _spellings(values: list) -> dict[str, list[str]]:
    """Label values as README promises to compare them (trimmed, any case): each class's spellings."""
    found: dict[str, set[str]] = {}
    for value in values:
        found.setdefault(str(value).strip().lower(), set()).add(str(value).strip())
    return {key: sorted(names) for key, names in found.items()}


def _normalize_labels(
    dataset: Dataset, source: str, task: Task, canonical: tuple[str, ...] | None = None
) -> Dataset:
    """Class ids in the task's order, from names (any case) or, for GLUE tasks, ids in the `canonical`
    order (the task's own, before the model's head reordered it); regression: float32."""
    features = dataset.features.copy()
    if task.is_regression:
        if dataset.features["label"].dtype not in ("float32", "float64", "int32", "int64"):
            raise ConfigError(f"{source}: the regression task needs numeric labels")
        scores = np.asarray(dataset["label"], dtype=np.float64)  # an empty cell reads as None: NaN here
        if not np.isfinite(scores).all():
            row = int(np.flatnonzero(~np.isfinite(scores))[0])
            raise ConfigError(
                f"{source}: row {row} has no number as its label (empty, NaN or inf); a regression needs one "
                "on every row: fill or drop such rows"
            )
        features["label"] = Value("float32")
        return dataset.cast(features)
    names = task.label_names
    if task.name == "custom":  # the inferred names are the labels as written (integers: as digits)
        to_id = {int(name): i for i, name in enumerate(names) if name.lstrip("-").isdigit()}
    else:  # GLUE files hold class ids, Hub-style, or names
        position = {name.lower(): i for i, name in enumerate(names)}
        ids = [position[name.lower()] for name in (canonical or names)]
        to_id = {i: ids[i] for i in range(len(names))} | {str(i): ids[i] for i in range(len(names))}
    to_id.update({name.lower(): i for i, name in enumerate(names)})
    reordered = canonical is not None and tuple(canonical) != tuple(names)

    def key(value):
        if isinstance(value, bool):  # JSON true/false: names "False"/"True", not the ids 0/1
            return str(value).lower()
        return value.strip().lower() if isinstance(value, str) else value

    bad = [v for v in dataset.unique("label") if key(v) not in to_id]
    if None in bad:
        row = dataset["label"].index(None)
        raise ConfigError(f"{source}: row {row} has an empty label; give every row one, or drop such rows")
    if bad:
        first_row = dataset["label"].index(bad[0])
        shown = ", ".join(repr(v) for v in bad[:5])
        allowed = "/".join(names) if task.name == "custom" else f"0..{len(names) - 1} or {'/'.join(names)}"
        raise ConfigError(f"{source}: label value(s) {shown} (first at row {first_row}) are not in {allowed}")
    if all(isinstance(v, int) for v in dataset.unique("label")) and task.name != "custom" and not reordered:
        return dataset
    features["label"] = Value("int64")
    return dataset.map(
        lambda b: {"label": [to_id[key(v)] for v in b["label"]]},
        batched=True,
        features=features,
        desc="labels",
    )


def is_generic_head(names: tuple[str, ...]) -> bool:
    """transformers' default names LABEL_0..LABEL_{n-1}: a head nobody named, treated as untrained."""
    return tuple(names) == tuple(f"LABEL_{i}" for i in range(len(names)))


REGRESSION_HEAD = "regression"  # model_head's answer for a head trained to predict one score


def settle_label_order(
    task: Task, head: tuple[str, ...] | str | None, ignore_mismatched_sizes: bool, training: bool, model: str
) -> tuple[Task, bool]:
    """The task in the label order of the model's trained head `head` (model_head's answer) when its
    names are the task's (as sets, any case); and whether the head must be replaced.

    A trained head that predicts something else (other labels; a score where the task has labels, or
    the reverse) is replaced only with --ignore_mismatched_sizes and only when training; a generic one
    (LABEL_i, nobody trained it) whenever its size differs; no head: the task's own order."""
    if head is None:
        return task, False
    if head != REGRESSION_HEAD and is_generic_head(head):
        return task, len(head) != (1 if task.is_regression else task.num_labels)
    if task.is_regression and head == REGRESSION_HEAD:
        return task, False
    if not task.is_regression and head != REGRESSION_HEAD:
        ours = {name.lower(): name for name in task.label_names}
        if len(ours) == len(head) and set(ours) == {name.lower() for name in head}:
            return replace(task, label_names=tuple(ours[name.lower()] for name in head)), False
    theirs = "one regression score" if head == REGRESSION_HEAD else "/".join(head)
    wanted = "one regression score" if task.is_regression else "/".join(task.label_names)
    task_has = "the task predicts" if task.is_regression else "the task's labels are"
    mismatch = f"--model_name_or_path {model}: its head predicts {theirs}, {task_has} {wanted}"
    if not training:
        raise ConfigError(f"{mismatch}; evaluate a model trained for this task")
    if not ignore_mismatched_sizes:
        raise ConfigError(f"{mismatch}; pass --ignore_mismatched_sizes to replace the head with a new one")
    return task, True


def model_head(model_name_or_path: str, hub: dict | None = None) -> tuple[str, ...] | str | None:
    """What the model's head predicts, from its config.json: the label names in id order,
    REGRESSION_HEAD, or None when there is no readable config. Cheap: reads config.json only."""
    try:
        model_config = AutoConfig.from_pretrained(model_name_or_path, **(hub or {}))
    except (OSError, ValueError):  # load_model_and_tokenizer names the problem
        return None
    if model_config.problem_type == "regression":
        return REGRESSION_HEAD
    if not model_config.id2label:
        return None
    return tuple(model_config.id2label[i] for i in range(model_config.num_labels))

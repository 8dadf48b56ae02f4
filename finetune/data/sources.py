"""Where a task's rows come from: local files (.jsonl/.json/.csv/.tsv/.parquet), or a dataset by
`--dataset_name` (a Hub id, or a local folder of data files). Returns the raw splits, each with a
`label` column, and the label names a dataset declares (its ClassLabel feature)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from datasets import ClassLabel, Dataset, DatasetDict, List, Value, load_dataset, load_from_disk
from datasets.exceptions import DatasetGenerationError
from pyarrow import ArrowException

from finetune.config.train_config import TrainConfig
from finetune.data.tasks import Task
from finetune.errors import ConfigError, shorten
from finetune.hub import hub_offline_reason, is_path


def read_splits(
    config: TrainConfig, task: Task | None, wanted: dict[str, bool]
) -> tuple[dict[str, Dataset], dict[str, str], tuple[str, ...] | None]:
    """The raw splits this run needs (`wanted`: split -> needed), where each came from (for messages),
    and, for a custom task, the label names the data declares in a ClassLabel feature (None: none);
    such labels arrive as their names, so they read as text labels do. `task` None: a custom task."""
    columns = config.text_column_names or task.text_columns
    validation = task.validation_splits[0] if task else "validation"
    if config.uses_local_files:
        files = {
            "train": config.train_file,
            validation: config.validation_file,
            "validation_mismatched": config.validation_mismatched_file,
            "test": config.test_file,
        }
        sources = {name: path for name, path in files.items() if path and wanted.get(name)}
        splits = {
            name: load_data_file(path, columns if name == "test" else (*columns, config.label_column))
            for name, path in sources.items()
        }
    else:
        splits, sources = load_dataset_splits(config, task, wanted, columns)
    if config.label_column != "label":
        splits = {n: _label_column_as_label(s, config.label_column) for n, s in splits.items()}
    if "test" in splits and "label" in splits["test"].column_names:
        splits["test"] = splits["test"].remove_columns("label")  # GLUE hides test labels (-1); unused here
    declared = None
    if task is None:
        found = {n: _class_label(s) for n, s in splits.items() if n != "test"}
        labelled = {n: names for n, names in found.items() if names is not None}
        first = next(iter(labelled), None)
        declared = labelled.get(first)
        for split, names in labelled.items():
            if names.names != declared.names:  # the same id would mean another label in each split
                raise ConfigError(
                    f"{sources[split]}: its ClassLabel names {names.names} are not those of "
                    f"{sources[first]} {declared.names}; save the splits with one ClassLabel"
                )
        splits = {n: _class_labels_as_names(s) for n, s in splits.items()}
    return splits, sources, declared and tuple(declared.names)


def load_dataset_splits(
    config: TrainConfig, task: Task | None, wanted: dict, columns: tuple[str, ...], labelled: bool = True
):
    """--dataset_name's splits. GLUE tasks: the Hub's own split names; a custom task (or another family's
    data, `labelled` False: no label column needed): the ones --train_split_name, --validation_split_name
    and --test_split_name give."""
    name, subset = config.dataset_name, config.dataset_config_name
    named = (
        f"--task_name {config.task_name} reads {name} (--dataset_name)" if task else f"--dataset_name {name}"
    )
    if Path(name).is_file():
        raise ConfigError(
            f"--dataset_name {name} is a file: give it as --train_file (--validation_file, ...)"
        )
    if is_path(name) and not Path(name).exists():
        raise ConfigError(f"--dataset_name {name}: no such folder; check the path")
    offline = None if Path(name).exists() else hub_offline_reason(datasets=True)  # the cache, not retries
    try:
        # One Dataset's save_to_disk (a DatasetDict's, load_dataset reads): its rows are the training split.
        if (Path(name) / "state.json").is_file():
            dataset = DatasetDict({"train": load_from_disk(name)})
        else:
            dataset = load_dataset(name, subset)
    except (ConnectionError, FileNotFoundError, ValueError, DatasetGenerationError) as error:
        detail = (
            shorten(str(error).strip().splitlines()[0], 160) if str(error).strip() else type(error).__name__
        )
        if Path(name).exists():
            fix = "give a folder of data files of one format (.jsonl, .csv, .parquet) named by split"
        elif subset and "BuilderConfig" in detail:
            fix = f"check --dataset_config_name {subset}"
        elif offline and isinstance(error, (ConnectionError, FileNotFoundError)):
            detail = f"not in the datasets cache, and {offline}"
            fix = "give local files (--train_file, --validation_file) or a local folder of data files"
        else:
            fix = "check the name, or give local files (--train_file, --validation_file)"
        raise ConfigError(f"{named}: cannot load it ({detail}); {fix}") from None
    named = {"train": "train", "test": "test", **{s: s for s in (task.validation_splits if task else ())}}
    if task is None:
        named = {
            "train": config.train_split_name,
            "validation": config.validation_split_name,
            "test": config.test_split_name,
        }
    where = f"{name}/{subset}" if subset else name
    sources, splits = {}, {}
    for split, hub_split in named.items():
        if not wanted.get(split):
            continue
        if hub_split not in dataset:
            if task is not None:
                continue  # GLUE: a split the Hub lacks is left out, as before
            flag = {"train": "--train_split_name", "validation": "--validation_split_name"}.get(split)
            carve = " or carve one with --validation_split_percentage" if split == "validation" else ""
            raise ConfigError(
                f"--dataset_name {name} has no split {hub_split!r} (it has {', '.join(dataset)}); name one "
                f"with {flag or '--test_split_name'}{carve}"
            )
        source = f"{where}:{hub_split}"
        needed = columns if split == "test" or not labelled else (*columns, config.label_column)
        missing = [c for c in needed if c not in dataset[hub_split].column_names]
        if missing:
            raise ConfigError(_lacks(source, missing, dataset[hub_split].column_names))
        sources[split], splits[split] = source, dataset[hub_split]
    return splits, sources


def _lacks(source: str, missing: list[str], found: list[str]) -> str:
    other = _another_familys_rows(found)
    if other:  # a chat or tagging file given to the classifier (no --task_type): that is the fix
        rows, task_type = other
        return (
            f"{source} lacks column(s) {', '.join(missing)}; its {rows} train --task_type {task_type}: "
            f"add --task_type {task_type}"
        )
    return (
        f"{source} lacks column(s) {', '.join(missing)}; found {', '.join(found)} "
        "(name yours with --text_columns and --label_column)"
    )


def _another_familys_rows(found: list[str]) -> tuple[str, str] | None:
    """What another family's rows look like (TRL's chat columns, run_ner's word and tag lists), and it."""
    if "messages" in found:
        return "messages (conversations)", "causal_lm"
    if "prompt" in found and "completion" in found:
        return "prompt and completion columns", "causal_lm"
    tags = [c for c in ("tags", "ner_tags", "pos_tags") if c in found]
    if "tokens" in found and tags:
        return f"tokens and {tags[0]} (words and their tags)", "token_classification"
    return None


def _class_label(dataset: Dataset) -> ClassLabel | None:
    """The label column's ClassLabel (Hub datasets, parquet written by `datasets`), single- or
    multi-label; None for labels stored as plain values."""
    feature = dataset.features.get("label")
    inner = feature.feature if isinstance(feature, List) else feature
    return inner if isinstance(inner, ClassLabel) else None


def _class_labels_as_names(dataset: Dataset) -> Dataset:
    """ClassLabel ids as their names (-1, the datasets convention for "no label", as none)."""
    declared = _class_label(dataset)
    if declared is None:
        return dataset

    def name(i):
        return None if i is None or i < 0 else declared.int2str(i)

    multi = isinstance(dataset.features["label"], List)
    features = dataset.features.copy()
    features["label"] = List(Value("string")) if multi else Value("string")
    return dataset.map(
        lambda b: {"label": [[name(i) for i in v or []] if multi else name(v) for v in b["label"]]},
        batched=True,
        features=features,
        desc="label names",
    )


def load_data_file(path: str, columns: tuple[str, ...]) -> Dataset:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"data file {path} does not exist; check the path")
    if file.stat().st_size == 0:
        raise ConfigError(f"data file {path} is empty")
    suffix = file.suffix.lower()
    try:
        if suffix in (".jsonl", ".json"):
            dataset = load_dataset("json", data_files=str(file), split="train")
        elif suffix == ".tsv":
            # GLUE's own .tsv files hold unbalanced quotes, so quotes are text, not delimiters.
            dataset = load_dataset(
                "csv", data_files=str(file), split="train", delimiter="\t", quoting=csv.QUOTE_NONE
            )
        elif suffix == ".parquet":
            dataset = load_dataset("parquet", data_files=str(file), split="train")
        else:
            dataset = load_dataset("csv", data_files=str(file), split="train")
    except (DatasetGenerationError, ArrowException, UnicodeError, ValueError) as error:
        raise ConfigError(f"data file {path}: {_unreadable(error, suffix, file)}") from None
    if len(dataset) == 0:
        raise ConfigError(f"data file {path}: holds no rows (only a header or blank lines)")
    missing = [c for c in columns if c not in dataset.column_names]
    if missing:
        raise ConfigError(_lacks(f"data file {path}", missing, dataset.column_names))
    return _mixed_columns_as_text(dataset, columns)


def _mixed_columns_as_text(dataset: Dataset, columns: tuple[str, ...]) -> Dataset:
    """A JSON column whose rows mix types (labels 0, 1 and "neutral") arrives as untyped JSON values,
    which Arrow can't compare; as text they read as a CSV's would."""
    mixed = [
        c
        for c in columns
        if c in dataset.column_names
        and not isinstance(dataset.features[c], (Value, List, ClassLabel))
        and not any(isinstance(v, list) for v in dataset[c])  # multi-label lists among single labels
    ]
    if not mixed:
        return dataset
    features = dataset.features.copy()
    features.update({c: Value("string") for c in mixed})
    return dataset.map(
        lambda b: {c: [None if v is None else str(v) for v in b[c]] for c in mixed},
        batched=True,
        features=features,
        desc="mixed columns",
    )


def _unreadable(error: Exception, suffix: str, file: Path) -> str:
    """What `datasets` could not read, with the row or line its parser named, and the fix."""
    cause = error.__cause__ or error.__context__ or error
    if isinstance(cause, UnicodeError) or isinstance(error, UnicodeError):
        return "not UTF-8 text; save it as UTF-8"
    detail = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
    if "corresponds to no data" in detail:
        return "holds no rows (only a header or blank lines)"
    if suffix == ".jsonl":
        found = _first_line_not_an_object(file)  # Arrow names a row of its block, not of the file
        if found is not None:
            return f"line {found[0]} is {found[1]}; fix it to hold one JSON object per line"
    shape = {
        ".jsonl": "one JSON object per line",
        ".json": "one JSON object per line, or a list of objects",
        # QUOTE_NONE (GLUE's files hold unbalanced quotes): a quoted field cannot hide a tab
        ".tsv": "the same fields on every row (quotes are text in a .tsv, so no field may hold a tab: "
        "write such rows as .csv or .jsonl)",
    }.get(suffix, "the same fields on every row")
    return f"cannot be parsed ({shorten(detail, 200)}); fix it to hold {shape}"


def _first_line_not_an_object(file: Path) -> tuple[int, str] | None:
    """(line number, what it is) of the first non-blank line that is not one JSON object."""
    with file.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError:
                return number, "not valid JSON"
            if not isinstance(value, dict):
                return number, f"a JSON {type(value).__name__.replace('str', 'string')}, not an object"
    return None


def _label_column_as_label(dataset: Dataset, label_column: str) -> Dataset:
    if label_column not in dataset.column_names:  # a test file without labels
        return dataset
    if "label" in dataset.column_names:
        dataset = dataset.remove_columns("label")
    return dataset.rename_column(label_column, "label")

"""Task data: the task and its splits (read by sources.py), labels as class ids, cached tokenization,
dataloaders."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from datasets import Dataset, List, Value
from torch.utils.data import DataLoader, Sampler
from transformers import AutoConfig

from finetune.config import ConfigError, TrainConfig
from finetune.loading import loading_error
from finetune.modeling import model_head, settle_label_order
from finetune.sources import read_splits
from finetune.tasks import GLUE_TASKS, Task, custom_task

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask", "labels", "row")


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
    if task is None:
        if declared and "train" in splits:  # the dataset's own names, in its own id order
            multi_label, names = isinstance(splits["train"].features["label"], List), declared
        else:
            multi_label = _is_multi_label(splits, config)
            names = _multi_label_names(splits, config) if multi_label else _custom_label_names(splits, config)
        task = custom_task(columns, names, multi_label)
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
    )
    limits = {"train": config.max_train_samples, "test": None}
    for name, split in splits.items():
        limit = limits.get(name, config.max_eval_samples)
        if limit is not None and limit < len(split):
            splits[name] = split.select(range(limit))
    return task, splits


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
    if len({str(v).strip() for v in values}) < 2:
        raise ConfigError(
            f"{config.train_source}: every row has the label {values[0] if values else None!r}; "
            "a classifier needs at least two classes in its training data"
        )
    if all(isinstance(v, int) for v in values):
        return tuple(str(v) for v in sorted(values))
    return tuple(sorted({str(v).strip() for v in values}))


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


def tokenize_splits(
    task: Task, splits: dict[str, Dataset], tokenizer, max_length: int, accelerator
) -> dict[str, Dataset]:
    """Token ids plus a `length` column (test: the `row` number instead of labels); cached by
    `datasets`, so a second run skips the work."""

    def encode(batch, rows):
        texts = [[str(t) if t is not None else "" for t in batch[c]] for c in task.text_columns]
        encoded = tokenizer(*texts, truncation=True, max_length=max_length)
        if "label" in batch:
            encoded["labels"] = batch["label"]
        else:
            encoded["row"] = rows
        encoded["length"] = [len(ids) for ids in encoded["input_ids"]]
        return encoded

    # Rank 0 tokenizes and writes the cache first; the other ranks then read it instead of redoing it.
    with accelerator.main_process_first():
        return {
            name: split.map(
                encode,
                batched=True,
                with_indices=True,
                remove_columns=split.column_names,
                desc=f"tokenize {name}",
            )
            for name, split in splits.items()
        }


class LengthGroupedSampler(Sampler[int]):
    """A fresh seeded shuffle every epoch; with grouping, batches of similar length in random order.

    Each chunk of `mega_batches` shuffled global batches is sorted by length and cut into batches,
    so little of a batch is padding, and those batches are shuffled again: left sorted (HF Trainer's
    group_by_length) the steps run from long pairs to short ones in a sawtooth, which cost MiniLM
    MNLI accuracy in 1-epoch runs (docs/design.md has the table). The order is a
    pure function of (seed, epoch): Accelerate shards it by whole batches (`global_batch_size` is the
    per-device batch times the processes, so one step's ranks get similar lengths), and a resumed run
    that sets the same epoch and skips the finished batches sees exactly the same data.
    """

    def __init__(
        self,
        lengths: list[int],
        global_batch_size: int,
        seed: int,
        group_by_length: bool = True,
        mega_batches: int = 16,
    ):
        self.lengths = lengths
        self.global_batch_size = global_batch_size
        self.mega_batches = mega_batches
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
        size = self.global_batch_size
        by_length = []
        for start in range(0, len(order), size * self.mega_batches):
            chunk = order[start : start + size * self.mega_batches]
            by_length.extend(sorted(chunk, key=self.lengths.__getitem__, reverse=True))
        batches = [by_length[i : i + size] for i in range(0, len(by_length), size)]
        # Only whole batches move: a short last batch stays last, or every later batch would shift.
        whole = len(order) // size
        shuffled = [batches[i] for i in torch.randperm(whole, generator=generator).tolist()]
        return iter([i for batch in shuffled + batches[whole:] for i in batch])


class PadCollator:
    """The batches of transformers' DataCollatorWithPadding (pad ids from the tokenizer, its padding
    side, the longest pair rounded up to `pad_to_multiple_of`), filled in numpy.

    Much faster than the tokenizer's `pad` (docs/design.md has the figures), which matters: it runs
    in the training process between steps: on a GPU, whose small steps are bound by the CPU launching
    kernels, the GPU waits for it.
    """

    def __init__(self, tokenizer, pad_to_multiple_of: int | None = None, max_length: int | None = None):
        self.pad_ids = {
            "input_ids": tokenizer.pad_token_id,
            "token_type_ids": tokenizer.pad_token_type_id,
            "attention_mask": 0,
        }
        self.left = tokenizer.padding_side == "left"
        self.multiple = pad_to_multiple_of or 1
        self.max_length = max_length
        """Widths are capped here (the truncation length): with 32 at 128 the buckets are 32, 64, 96, 128."""

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        longest = max(len(f["input_ids"]) for f in features)
        width = _bucket(longest, self.multiple, self.max_length)
        batch = {}
        for key in features[0]:
            if key not in self.pad_ids:  # labels, row: one value per pair
                batch[key] = torch.tensor([f[key] for f in features])
                continue
            padded = np.full((len(features), width), self.pad_ids[key], dtype=np.int64)
            for row, feature in zip(padded, features, strict=True):
                values = feature[key]
                if self.left:
                    row[width - len(values) :] = values
                else:
                    row[: len(values)] = values
            batch[key] = torch.from_numpy(padded)
        return batch


def _bucket(tokens: int, multiple: int, cap: int | None) -> int:
    """`tokens` rounded up to a multiple of `multiple`, but never past `cap` (unless `tokens` is)."""
    rounded = -(-tokens // multiple) * multiple
    return rounded if cap is None else min(rounded, max(cap, tokens))


class VarlenCollator:
    """Batches for `--padding_free varlen`: the real tokens of every pair in one row, built on the CPU.

    input_ids, token_type_ids, attention_mask (1: a real token) and position_ids (restarting at
    `position_offset` in every segment) are [1, tokens]; `cu_seq_lens_q`/`_k` (int32, [2 x pairs + 1])
    bound the pairs, then as many padding segments of at most `pad_to_multiple_of` tokens (some
    empty), which round the token count up to a multiple of `pad_to_multiple_of` x pairs: as few
    shapes as padded batches have lengths. `max_length_q`/`_k`, the longest segment allowed, is the
    same in every batch, so compiled code is not specialized on it. The device never has to find the
    pairs (no nonzero()), and padding costs attention at most pairs x pad_to_multiple_of².
    """

    def __init__(self, tokenizer, pad_to_multiple_of: int | None, max_length: int, position_offset: int = 0):
        self.pad_ids = {"input_ids": tokenizer.pad_token_id, "token_type_ids": tokenizer.pad_token_type_id}
        self.multiple = pad_to_multiple_of or 1
        self.longest = max(max_length, self.multiple)
        self.position_offset = position_offset

    def __call__(self, features: list[dict]) -> dict:
        rows = len(features)
        lengths = np.array([len(f["input_ids"]) for f in features], dtype=np.int64)
        real = int(lengths.sum())
        total = _bucket(real, self.multiple * rows if self.multiple > 1 else 1, None)  # 1: no padding
        padding = np.full(rows, -(-(total - real) // rows), dtype=np.int64)  # each < multiple
        padding = np.clip(total - real - np.arange(rows) * padding[0], 0, padding)
        segments = np.concatenate([lengths, padding])
        starts = np.concatenate([[0], np.cumsum(segments)])
        batch = {}
        for key in ("input_ids", "token_type_ids"):
            if key not in features[0]:
                continue
            row = np.full(total, self.pad_ids[key], dtype=np.int64)
            row[:real] = np.concatenate([f[key] for f in features])
            batch[key] = torch.from_numpy(row).unsqueeze(0)
        mask = np.zeros(total, dtype=np.int64)
        mask[:real] = 1
        positions = np.arange(total, dtype=np.int64) - np.repeat(starts[:-1], segments)
        batch["attention_mask"] = torch.from_numpy(mask).unsqueeze(0)
        batch["position_ids"] = torch.from_numpy(positions + self.position_offset).unsqueeze(0)
        bounds = torch.from_numpy(starts.astype(np.int32))
        batch["cu_seq_lens_q"], batch["cu_seq_lens_k"] = bounds, bounds.clone()
        batch["max_length_q"] = batch["max_length_k"] = self.longest
        for key in features[0]:
            if key not in ("input_ids", "token_type_ids", "attention_mask"):  # labels, row: one per pair
                batch[key] = torch.tensor([f[key] for f in features])
        return batch


def resolve_pad_to_multiple_of(requested: str, on_gpu: bool) -> str:
    """--pad_to_multiple_of as a number. auto: 8 on CUDA, whose tensor cores want lengths in multiples
    of 8; 1 (exact lengths) on CPU, where padding is only extra work."""
    if requested != "auto":
        return requested
    return "8" if on_gpu else "1"


def build_dataloaders(
    tokenized: dict[str, Dataset],
    tokenizer,
    config: TrainConfig,
    world_size: int,
    on_gpu: bool,
    position_offset: int = 0,
) -> dict[str, DataLoader]:
    """One loader per split: train in seeded length-grouped order, the others sorted by length.
    `position_offset`: where positions start in a `--padding_free varlen` batch (RoBERTa's start after
    its padding id)."""
    multiple = int(resolve_pad_to_multiple_of(config.pad_to_multiple_of, on_gpu))
    if config.padding_free == "varlen":
        collator = VarlenCollator(tokenizer, multiple, config.max_length, position_offset)
    else:
        collator = PadCollator(tokenizer, multiple, config.max_length)
    workers = config.dataloader_num_workers
    common = {
        "collate_fn": collator,
        "num_workers": workers,
        "pin_memory": on_gpu,
        "persistent_workers": workers > 0,
    }
    loaders = {}
    for name, split in tokenized.items():
        inputs = split.select_columns([c for c in MODEL_INPUTS if c in split.column_names])
        # A list: datasets' lazy Column reads Arrow on every index, which makes a sort by it slow.
        lengths = split.select_columns(["length"]).to_dict()["length"]
        if name == "train":
            sampler = LengthGroupedSampler(
                lengths,
                global_batch_size=config.per_device_train_batch_size * world_size,
                seed=config.seed,
                group_by_length=config.group_by_length,
            )
            loaders[name] = DataLoader(
                inputs,
                batch_size=config.per_device_train_batch_size,
                sampler=sampler,
                # Its own generator: starting an epoch draws nothing from the global RNG dropout uses.
                generator=torch.Generator().manual_seed(config.seed),
                **common,
            )
            continue
        # Length-sorted evaluation pads almost nothing; metrics do not depend on the order, and
        # predictions carry their row number back to the input order.
        loaders[name] = DataLoader(
            inputs,
            batch_size=config.per_device_eval_batch_size,
            sampler=sorted(range(len(lengths)), key=lengths.__getitem__),
            # Starting an iteration draws a seed: from its own generator, not the global RNG that
            # dropout uses, so an evaluation (or one abandoned at a stop signal) leaves training as is.
            generator=torch.Generator().manual_seed(config.seed),
            **common,
        )
    return loaders

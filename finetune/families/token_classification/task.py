"""What a tagging run learns (`TagTask`): its tags in id order, their scheme, where the sentences came
from and how many; and the splits, read (reading.py) and checked against the tag set: the labels come
from the training tags (or --label_names, or the model's own when nothing trains), and a tag seen only in
evaluation is reported on the task line, scored as gold, never mapped to another."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from datasets import Dataset
from transformers import AutoConfig

from finetune.data.tasks import PER_CLASS
from finetune.errors import ConfigError
from finetune.families.token_classification.reading import load_tag_sources, read_split
from finetune.families.token_classification.tags import (
    SCHEME_WORDS,
    check_tags,
    detect_scheme,
    entities,
    entity_types,
    label_order,
    scheme_of_names,
)


@dataclass
class TagTask:
    label_names: tuple[str, ...]
    """The model's labels, in id order."""
    scheme: str
    """IOB2, IOB1, BIOES, or none (tags without prefixes, e.g. POS): how tags make entities."""
    format: str
    """How the rows were read (the task line's words)."""
    name: str = "token_classification"
    class_weights: tuple[float, ...] | None = None
    """--class_weights per label, in label order: each labelled sub-token's cross-entropy weighted."""
    label_smoothing: float = 0.0
    label_all_tokens: bool = False
    validation_splits: tuple[str, ...] = ("validation",)
    counts: dict = field(default_factory=dict)
    """Per split: sentences, words, gold entities; with the windows once encoded."""
    unseen: dict = field(default_factory=dict)
    """Per evaluation split: {tag the labels lack: its words}."""
    references: dict = field(default_factory=dict)
    """Per split, set when encoded: each sentence's gold tags (evaluation) or words and offsets (test)."""

    @property
    def entity_tags(self) -> bool:
        return self.scheme != "none"

    @property
    def metrics(self) -> tuple[str, ...]:
        """The first picks the best model by default."""
        return ("f1", "precision", "recall", "accuracy") if self.entity_tags else ("accuracy", "macro_f1")

    @property
    def per_class_metrics(self) -> tuple[str, ...]:
        kinds = entity_types(self.label_names) if self.entity_tags else self.label_names
        return tuple(f"{metric}_{kind}" for kind in kinds for metric in PER_CLASS)

    def metric_keys(self, per_class: bool = True) -> list[str]:
        return [f"eval_{m}" for m in (*self.metrics, *(self.per_class_metrics if per_class else ()))]

    def summary(self) -> str:
        """The task line (the source, the scheme, the tags, each split's counts), and a line naming the
        tags an evaluation split holds that the labels lack."""
        names = ", ".join(self.label_names[:10]) + (", ..." if len(self.label_names) > 10 else "")
        splits = "; ".join(f"{split} {_counts(c)}" for split, c in self.counts.items())
        line = (
            f"task: token_classification, {self.format}, tag scheme {SCHEME_WORDS[self.scheme]}, "
            f"{len(self.label_names)} tags: {names}; {splits}"
        )
        for split, tags in self.unseen.items():
            shown = ", ".join(f"{tag} ({n} words)" for tag, n in sorted(tags.items()))
            lacks = "tags the training data lacks, scored as gold but never predicted (no loss)"
            line += f"\n{split}: {lacks}: {shown}"
        return line


def _counts(counts: dict) -> str:
    text = f"{counts['sentences']:,} sentences, {counts['words']:,} words"
    text += f", {counts['entities']:,} entities" if "entities" in counts else ""
    if counts.get("windowed"):
        text += (
            f" ({counts['windowed']:,} longer than --max_length, in {counts['windows']:,} windows over words)"
        )
    return text


def load_tag_splits(config) -> tuple[TagTask, dict[str, Dataset]]:
    """The task and its splits (`words`, `tags`; a test split `words` or `text`), checked."""
    wanted = {
        "train": config.do_train or config.carves_validation,
        "validation": not config.carves_validation and (config.evaluates_training or not config.do_train),
        "test": config.do_predict,
    }
    splits, formats, declared = {}, {}, {}
    for name, (source, dataset) in load_tag_sources(config, wanted).items():
        splits[name], formats[name], declared[name] = read_split(config, name, source, dataset)
        if name != "test":  # row numbers as in the file: before any carving or cap
            check_tags(splits[name].select_columns(["tags"]).to_dict()["tags"], source)
    if config.carves_validation:
        splits["train"], splits["validation"] = _carve(splits["train"], config)
    for name, limit in (("train", config.max_train_samples), ("validation", config.max_eval_samples)):
        if name in splits and limit is not None and limit < len(splits[name]):
            splits[name] = splits[name].select(range(limit))
    labelled = {
        name: split.select_columns(["tags"]).to_dict()["tags"]
        for name, split in splits.items()
        if name != "test"
    }
    if "train" in labelled and len({tag for tags in labelled["train"] for tag in tags}) == 1:
        (only,) = {tag for tags in labelled["train"] for tag in tags}
        raise ConfigError(
            f"{config.train_source}: every word has the tag {only}, so there is nothing to learn; give "
            "sentences with other tags too",
            fix="give sentences with other tags too",
        )
    label_names = _label_names(config, labelled, declared.get("train") or declared.get("validation"))
    sequences = labelled.get("train") or labelled.get("validation")
    scheme = detect_scheme(sequences) if sequences else _scheme_of_model(config, label_names)
    read = {fmt for name, fmt in formats.items() if name != "test"} or set(formats.values())
    fmt = " + ".join(sorted(read))
    task = TagTask(
        label_names=label_names,
        scheme=scheme,
        format=fmt if config.uses_local_files else f"{fmt} of --dataset_name {config.dataset_name}",
        class_weights=_class_weights(config, label_names, labelled.get("train")),
        label_smoothing=config.label_smoothing_factor,
        label_all_tokens=config.label_all_tokens,
    )
    known = set(label_names)
    for name, sentences in labelled.items():
        words = sum(len(tags) for tags in sentences)
        task.counts[name] = {"sentences": len(sentences), "words": words}
        if scheme != "none":
            task.counts[name]["entities"] = sum(len(entities(tags)) for tags in sentences)
        unseen = {}
        for tags in sentences:
            for tag in tags:
                if tag not in known:
                    unseen[tag] = unseen.get(tag, 0) + 1
        if unseen and name == "train":  # only --label_names leaves a training tag out
            raise ConfigError(
                f"{config.train_source}: tag {min(unseen)} is not in --label_names; add it to --label_names",
                flag="--label_names",
            )
        if unseen:
            task.unseen[name] = unseen
    if "test" in splits:
        task.counts["test"] = {"sentences": len(splits["test"]), "words": 0}
    return task, splits


def _label_names(config, labelled: dict, declared: list[str] | None = None) -> tuple[str, ...]:
    """The tags in the order of the model's trained head when it tags these very names (a token
    classifier's id2label: the head is kept); else --label_names in their order, the dataset's ClassLabel
    names (`declared`: all of them, in its id order, as run_ner takes them), or the training tags sorted
    (O first). With nothing to train, a head that tags other names (or none) is refused: a new head would
    be scored untrained."""
    own = model_labels(config.model_name_or_path, config.hub_options)
    if config.label_names:
        names = _listed_names(config)
    elif declared and "train" in labelled:
        names = tuple(declared)
    elif "train" in labelled:
        names = label_order(tag for tags in labelled["train"] for tag in tags)
    else:
        names = own
    if own is not None and set(own) == set(names):
        return own
    if "train" not in labelled:
        model = f"--model_name_or_path {config.model_name_or_path}"
        if own is None:
            raise ConfigError(
                f"{model} is not a token classifier and nothing trains, so its tagging head would be new and "
                "untrained; train it (--do_train), or evaluate a tagging run's output_dir",
                flag="--model_name_or_path",
            )
        raise ConfigError(
            f"{model} tags {','.join(own)}; --label_names {config.label_names} names others, and nothing "
            "trains a head for them; drop --label_names to evaluate with the model's own tags",
            flag="--label_names",
            fix="drop --label_names",
        )
    return names


def _listed_names(config) -> tuple[str, ...]:
    names = tuple(n.strip() for n in config.label_names.split(","))
    if len(set(names)) != len(names) or not all(names):
        raise ConfigError(
            f"--label_names {config.label_names}: give distinct, non-empty names", flag="--label_names"
        )
    return names


def _scheme_of_model(config, label_names: tuple[str, ...]) -> str:
    """With nothing labelled read: the scheme the model was trained on (its config's tag_scheme, which
    this toolkit's exports carry) when its labels are these; else what the names alone say."""
    model_config = _model_config(config.model_name_or_path, config.hub_options)
    scheme = getattr(model_config, "tag_scheme", None)
    named = scheme_of_names(label_names)
    fits = scheme == named or (scheme, named) == ("IOB1", "IOB2")  # IOB1 sets may hold B- tags too
    return scheme if fits and _token_labels(model_config) == label_names else named


def model_labels(model_name_or_path: str, hub: dict) -> tuple[str, ...] | None:
    """A token classifier's labels in id order (its config's id2label); None for any other model."""
    return _token_labels(_model_config(model_name_or_path, hub))


def _model_config(model_name_or_path: str, hub: dict):
    try:
        return AutoConfig.from_pretrained(model_name_or_path, **hub)
    except (OSError, ValueError):
        return None


def _token_labels(model_config) -> tuple[str, ...] | None:
    architectures = getattr(model_config, "architectures", None) or []
    if not any(a.endswith("ForTokenClassification") for a in architectures):
        return None
    return tuple(model_config.id2label[i] for i in range(len(model_config.id2label)))


def _class_weights(config, label_names: tuple[str, ...], train: list | None) -> tuple[float, ...] | None:
    """--class_weights per label: a comma list in label order (--label_names' own, where given), or
    'balanced' (sklearn's rule over the training words' tags)."""
    if config.class_weights is None:
        return None
    weights = config.listed_class_weights
    if weights is not None:
        listed = _listed_names(config) if config.label_names else label_names
        if len(weights) != len(listed):
            raise ConfigError(
                f"--class_weights has {len(weights)} weights; give one per tag, in the order "
                f"{','.join(listed)}"
            )
        by_name = dict(zip(listed, weights, strict=True))
        return tuple(by_name[name] for name in label_names)  # the head's order, where it was kept
    if train is None:
        return None  # only the training loss uses them
    index = {name: i for i, name in enumerate(label_names)}
    counts = np.bincount([index[t] for tags in train for t in tags], minlength=len(label_names))
    if (counts == 0).any():
        missing = ", ".join(n for n, c in zip(label_names, counts, strict=True) if c == 0)
        raise ConfigError(f"--class_weights balanced: no training word has the tag(s) {missing}; give a list")
    return tuple(float(w) for w in counts.sum() / (len(label_names) * counts))


def _carve(train: Dataset, config) -> tuple[Dataset, Dataset]:
    """--validation_split_percentage of the training sentences, drawn with --seed (every rank the same)."""
    held = round(len(train) * config.validation_split_percentage / 100)
    if not 0 < held < len(train):
        raise ConfigError(
            f"--validation_split_percentage {config.validation_split_percentage} of {len(train)} sentences "
            "leaves no validation or no training sentences; change it"
        )
    order = np.random.default_rng(config.seed).permutation(len(train))
    return train.select(sorted(order[held:].tolist())), train.select(sorted(order[:held].tolist()))

"""What a task is: its text columns, label names, evaluation splits and the metrics it is judged by."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Task:
    name: str
    text_columns: tuple[str, ...]
    """One column (single sentence) or two (a pair, encoded as one sequence with [SEP])."""
    label_names: tuple[str, ...] | None
    """Class names in id order; None for a regression task (one float per row)."""
    metrics: tuple[str, ...]
    """What the GLUE paper reports for it; the first picks the best model by default."""
    validation_splits: tuple[str, ...] = ("validation",)
    """Hub split names, also the keys of the evaluation loaders."""

    @property
    def is_regression(self) -> bool:
        return self.label_names is None

    @property
    def num_labels(self) -> int:
        return 1 if self.label_names is None else len(self.label_names)

    def metric_keys(self) -> list[str]:
        """The keys evaluation writes: eval_<metric>, or eval_<split>_<metric> for MNLI's two sets."""
        return [eval_key(split, metric) for split in self.validation_splits for metric in self.metrics]

    def with_columns(self, text_columns: tuple[str, ...] | None) -> Task:
        return self if text_columns is None else replace(self, text_columns=text_columns)


def eval_key(split: str, metric: str) -> str:
    short = split.removeprefix("validation").strip("_")
    return f"eval_{short}_{metric}" if short else f"eval_{metric}"


PAIR_ACCURACY = ("accuracy",)
GLUE_TASKS = {
    "cola": Task("cola", ("sentence",), ("unacceptable", "acceptable"), ("matthews_correlation",)),
    "sst2": Task("sst2", ("sentence",), ("negative", "positive"), ("accuracy",)),
    "mrpc": Task("mrpc", ("sentence1", "sentence2"), ("not_equivalent", "equivalent"), ("f1", "accuracy")),
    "qqp": Task("qqp", ("question1", "question2"), ("not_duplicate", "duplicate"), ("f1", "accuracy")),
    "stsb": Task("stsb", ("sentence1", "sentence2"), None, ("pearson", "spearmanr")),
    "qnli": Task("qnli", ("question", "sentence"), ("entailment", "not_entailment"), PAIR_ACCURACY),
    "rte": Task("rte", ("sentence1", "sentence2"), ("entailment", "not_entailment"), PAIR_ACCURACY),
    "wnli": Task("wnli", ("sentence1", "sentence2"), ("not_entailment", "entailment"), PAIR_ACCURACY),
    "mnli": Task(
        "mnli",
        ("premise", "hypothesis"),
        ("entailment", "neutral", "contradiction"),
        PAIR_ACCURACY,
        ("validation_matched", "validation_mismatched"),
    ),
}
TASK_CHOICES = (*GLUE_TASKS, "custom")


def custom_task(text_columns: tuple[str, ...], label_names: tuple[str, ...] | None) -> Task:
    """Your own files: labels inferred from the training file (float labels mean regression)."""
    metrics = ("pearson", "spearmanr") if label_names is None else ("accuracy",)
    return Task("custom", text_columns, label_names, metrics)

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
    multi_label: bool = False
    """Each row holds any number of the labels (a multi-hot vector; sigmoid and BCE), not one."""
    class_weights: tuple[float, ...] | None = None
    """Per-class weights of the training cross-entropy (--class_weights), in label order."""
    threshold: float = 0.5
    """Multi-label: the sigmoid probability at which a label counts as predicted."""
    label_smoothing: float = 0.0
    """Single-label: probability of the cross-entropy's target spread evenly over the labels."""
    window_aggregation: str = "mean"
    """--long_documents sliding_window: how a document's windows' logits make its own (mean, max)."""
    label_note: str | None = None
    """How a custom task's labels were read, where a user may have meant otherwise (the task line)."""

    @property
    def is_regression(self) -> bool:
        return self.label_names is None

    @property
    def num_labels(self) -> int:
        return 1 if self.label_names is None else len(self.label_names)

    @property
    def per_class_metrics(self) -> tuple[str, ...]:
        """A custom single-label task's precision_<label>, recall_<label>, f1_<label>, support_<label>."""
        if self.name != "custom" or self.is_regression or self.multi_label:
            return ()
        return tuple(f"{kind}_{name}" for name in self.label_names for kind in PER_CLASS)

    @property
    def calibration_metrics(self) -> tuple[str, ...]:
        """Classification's ece and brier (finetune.metrics.calibration); a multi-label task's also per
        label (ece_<label>, brier_<label>); none for regression. Lower is better."""
        if self.is_regression:
            return ()
        if not self.multi_label:
            return CALIBRATION
        return (*CALIBRATION, *(f"{m}_{name}" for name in self.label_names for m in CALIBRATION))

    def metric_keys(self, per_class: bool = True) -> list[str]:
        """The keys evaluation writes: eval_<metric>, or eval_<split>_<metric> for MNLI's two sets;
        per_class=False leaves out the per-class ones (curves, the card's headline table)."""
        metrics = self.metrics + (self.per_class_metrics if per_class else ())
        return [eval_key(split, metric) for split in self.validation_splits for metric in metrics]

    def summary(self) -> str:
        """One line of the run's log: what the task is and what it predicts."""
        if self.is_regression:
            note = f"; {self.label_note}" if self.label_note else ""
            return f"task: {self.name}, regression (one score per row{note})"
        note = f" ({self.label_note})" if self.label_note else ""
        names = ", ".join(self.label_names[:8]) + (", ..." if self.num_labels > 8 else "")
        kind = "multi-label" if self.multi_label else "single-label"
        return f"task: {self.name}, {kind}, {self.num_labels} labels: {names}{note}"

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
GLUE_DATASET = "nyu-mll/glue"
"""Where the GLUE tasks' rows come from (--dataset_name's default)."""


PER_CLASS = ("precision", "recall", "f1", "support")


CALIBRATION = ("ece", "brier")


def custom_task(
    text_columns: tuple[str, ...], label_names: tuple[str, ...] | None, multi_label: bool = False
) -> Task:
    """Your own files: labels inferred from the training file (float labels mean regression, lists
    multi-label)."""
    if label_names is None:
        metrics = ("pearson", "spearmanr")
    elif multi_label:
        metrics = ("f1_micro", "f1_macro", "exact_match")
    else:
        metrics = ("accuracy", "f1_macro")
    return Task("custom", text_columns, label_names, metrics, multi_label=multi_label)

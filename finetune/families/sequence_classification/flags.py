"""Sequence classification's flags (`--task_type sequence_classification`): the task and its labels, long
documents, calibration and the family's own speed paths. Read by `finetune.config` through the seam
(finetune/families/__init__.py FLAG_GROUPS): this module imports only the configuration's types."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from finetune.config.families import SOURCE, SPEED, Owned
from finetune.config.system_args import AutoSwitch, DropoutKernel, PaddingFree
from finetune.data.tasks import GLUE_DATASET, TASK_CHOICES
from finetune.errors import ConfigError

NAME, TAGGING = "sequence_classification", "token_classification"
TaskName = Literal[TASK_CHOICES]
LongDocuments = Literal["truncate", "sliding_window"]
WindowAggregation = Literal["mean", "max"]
WindowLossWeighting = Literal["window", "document"]
Calibration = Literal["none", "temperature"]

CLASSIFIERS, LABELLED = (NAME,), (NAME, TAGGING)
MEMORY = "memory: it keeps the global batch (the resolved split is recorded)"
OWNED = {
    "task_name": Owned(CLASSIFIERS, "names a classification task (other families read theirs from the data)"),
    "validation_mismatched_file": Owned(CLASSIFIERS, "is MNLI's second validation set", left_out=SOURCE),
    "text_columns": Owned(LABELLED, "names a classifier's text columns or a tagger's column of words"),
    "label_column": Owned(LABELLED, "names the column of a classifier's labels or a tagger's tags"),
    "label_separator": Owned(CLASSIFIERS, "splits a multi-label classifier's labels"),
    "multi_label_threshold": Owned(CLASSIFIERS, "is a multi-label classifier's decision threshold"),
    "class_weights": Owned(LABELLED, "weighs a classifier's labels or a tagger's tags"),
    "label_smoothing_factor": Owned(LABELLED, "smooths a classifier's labels or a tagger's tags"),
    "long_documents": Owned(CLASSIFIERS, "windows a classifier's documents", before="truncate"),
    "doc_stride": Owned(LABELLED, "overlaps a classifier's document windows or a tagger's sentence windows",
                        before=None),
    "window_aggregation": Owned(CLASSIFIERS, "merges a classifier's windows into the document's score",
                                before="mean"),
    "window_loss_weighting": Owned(CLASSIFIERS, "weighs a classifier's windows", asks=("document",),
                                   before="window"),
    # the exported model: a fitted temperature rescales its head
    "calibrate": Owned(CLASSIFIERS, "rescales a classifier's softmax", before="none"),
    "auto_find_batch_size": Owned(CLASSIFIERS, "is measured for classifiers only; set the batch size",
                                  left_out=MEMORY),
    # The family's speed paths, asked for by name: the other families run torch's dropout on padded
    # batches (model/build.py plain_speed), and say so at the start.
    "padding_free": Owned(CLASSIFIERS, "is built for classifiers only", asks=("true", "varlen"),
                          left_out=SPEED),
    "dropout_kernel": Owned(CLASSIFIERS, "is built for classifiers only", asks=("packed",), left_out=SPEED),
    "cuda_graphs": Owned(CLASSIFIERS, "is built for classifiers only", asks=("true",), left_out=SPEED),
}  # fmt: skip
"""The flags this family reads (some with the tagger), as the one refusal rule (config/families.py) and
the run's identity (config/identity.py) read them."""


@dataclass(frozen=True)
class ClassificationArgs:
    """Sequence classification (--task_type sequence_classification): the task, labels, long documents,
    calibration, and the family's speed paths."""

    task_name: TaskName = "mnli"
    """Sequence classification: a GLUE task, or custom: your own files or dataset, its labels read from the
    data."""
    validation_mismatched_file: str | None = None
    """Optional local MNLI validation-mismatched file, same columns."""
    text_columns: str | None = None
    """Comma-separated text column(s) of the files, one or two; default: the task's own.
    token_classification: the column of each row's list of words (default: `tokens`)."""
    label_column: str = "label"
    """Label column of the files (class name, class id or a float). token_classification: the column of
    each row's list of tags (default: `tags` or `ner_tags`); in a CoNLL-U file upos (default), xpos or
    deprel."""
    label_separator: str = "|"
    """Separator of several labels in one CSV/TSV label cell (sports|politics): such cells, or JSON lists in
    JSONL, make a custom task multi-label (sigmoid per label, BCE loss). 'none': a cell is one label, whatever
    it holds."""
    multi_label_threshold: float = 0.5
    """Multi-label: a label is predicted when its sigmoid probability is at least this."""
    class_weights: str | None = None
    """Weights of the classes in the cross-entropy loss (single-label), for unbalanced data: 'balanced'
    (n_rows / (n_classes * class count) of the training labels) or a comma list in the order of the labels on
    the run's task line; train_config.json and the model card record each label's weight. eval_loss is
    weighted the same way."""
    label_smoothing_factor: float = 0.0
    """Label smoothing of the cross-entropy (single-label classification): the target puts this much
    probability evenly over all labels. eval_loss is smoothed the same way, as HF Trainer's."""
    long_documents: LongDocuments = "truncate"
    """A text longer than --max_length: truncate (its first tokens only), or sliding_window: overlapping
    windows of --max_length tokens, each with the tokenizer's special tokens (a pair's long first text is
    windowed, its second text kept whole in every window). In training each window is one example with its
    document's label, weighed in the loss as --window_loss_weighting says; evaluation and predictions score
    documents (--window_aggregation), eval_*_samples and predictions.jsonl count documents. Needs a fast
    tokenizer."""
    doc_stride: int | None = None
    """--long_documents sliding_window: tokens of overlap between consecutive windows (HF run_qa's name);
    default: a quarter of --max_length (32 at 128; run_qa has 128 at 384). Must be less than the window's
    room for the text (--max_length minus the special tokens and a pair's second text).
    token_classification: words of overlap between the windows of a sentence longer than --max_length
    (always windowed; each word scored in the window where it has the most context), at most half a
    window's words; default: --max_length / 8 (16 at 128)."""
    window_aggregation: WindowAggregation = "mean"
    """--long_documents sliding_window: a document's logits from its windows' logits: mean, or max (per class,
    label or score: the highest logit any window gives it); then softmax, sigmoid or the score as usual."""
    window_loss_weighting: WindowLossWeighting | None = None
    """--long_documents sliding_window: how a long document weighs against a short one in the training loss.
    document: each window weighs 1 / its document's windows, so every document weighs 1; window: each window
    weighs 1, so a document weighs by its number of windows (HF run_qa's way). Either way the loss of an
    update is its windows' weighted mean (over every micro-batch and process of the update). Default:
    document (docs/log.md, 2026-11-26, has the measurement); under truncate, where a document is one
    window, window."""
    calibrate: Calibration = "none"
    """temperature: after training (and --load_best_model_at_end), fit one temperature T > 0 on the first
    validation split's logits (least NLL) and divide the exported model's classification layer by it, so
    `pipeline`, predictions.jsonl and later evaluations give softmax(logits / T) with the same argmax.
    results.json's eval_* keys are then the calibrated model's (in-sample on the split T was fit on); the
    ECE, Brier and loss before T are eval_..._before_calibration, and after T on rows it was not fit on
    eval_..._after_calibration_held_out (2-fold cross-fitting); calibration_temperature, and
    calibration_temperature_at_bound when T stopped at 0.01 or 100 (at 100: no confidence signal).
    The best model is still picked by training's evaluations, before calibration. Multi-label: one T
    for every label, fit on the binary NLL of sigmoid(logits / T), ECE per label and averaged; needs
    --multi_label_threshold 0.5, where every predicted label stays. Not for regression."""
    auto_find_batch_size: bool = False
    """Before training, run a forward and backward pass on the longest rows; on out-of-memory halve
    --per_device_train_batch_size and double --gradient_accumulation_steps (same global batch, same results)
    until it fits."""
    dropout_kernel: DropoutKernel = "auto"
    """auto (packed on CPU, torch on CUDA), packed (4 masks per 64-bit random draw) or torch."""
    padding_free: PaddingFree = "auto"
    """auto (on CPU for BERT, RoBERTa, XLM-R and ELECTRA without --torch_compile, except on CPUs with AMX,
    whose padded matmuls are fast enough that skipping padding does not pay), true or false: the encoder skips
    padding everywhere but in attention; same results, less work. varlen (for CUDA in bf16 or fp16;
    docs/benchmarks.md has its figures): the collator packs real tokens only, attention runs torch's
    variable-length kernel without attention dropout (on CPU a slow per-pair reference)."""
    cuda_graphs: AutoSwitch = "auto"
    """Replay each batch shape's forward and backward as a CUDA graph, captured at its first batch: one launch
    instead of one per kernel, no compile. auto: on for one CUDA process in bf16 or fp32 without accumulation,
    compile, padding-free layers or gradient checkpointing (a model whose forward waits for the device trains
    eagerly, with a note); true refuses where it cannot be on."""

    def __post_init__(self):
        """Checks of this group's flags (values from YAML or Python arrive unchecked); some only where the
        run is a classifier's."""
        if self.doc_stride is not None and self.doc_stride <= 0:
            raise ConfigError(f"--doc_stride must be a positive integer or left unset, got {self.doc_stride}")
        if self.text_columns is not None and not 1 <= len(self.text_column_names) <= 2:
            raise ConfigError(f"--text_columns takes 1 or 2 comma-separated names, got {self.text_columns!r}")
        if not 0.0 < self.multi_label_threshold < 1.0:
            raise ConfigError(f"--multi_label_threshold must be in (0, 1), got {self.multi_label_threshold}")
        if not self.label_separator:
            raise ConfigError("--label_separator must not be empty; the default is |, 'none' splits nothing")
        if self.class_weights not in (None, "balanced"):
            try:
                weights = self.listed_class_weights
            except ValueError:
                weights = ()
            if not weights or not all(math.isfinite(w) and w > 0 for w in weights):
                raise ConfigError(
                    "--class_weights must be 'balanced' or a comma list of positive numbers, got "
                    f"{self.class_weights!r}"
                )
        if not 0.0 <= self.label_smoothing_factor < 1.0:
            raise ConfigError(
                f"--label_smoothing_factor must be in [0, 1), got {self.label_smoothing_factor}"
            )
        windowed = self.long_documents == "sliding_window"
        if self.task_type == NAME:
            self._check_classifier(windowed)
        if self.window_loss_weighting is None:  # recorded resolved: a truncated document is one window
            object.__setattr__(self, "window_loss_weighting", "document" if windowed else "window")

    def _check_classifier(self, windowed: bool) -> None:
        if self.doc_stride is not None and not windowed:
            raise ConfigError(
                "--doc_stride is the overlap of --long_documents sliding_window's windows; add "
                "--long_documents sliding_window or drop --doc_stride",
                flag="--doc_stride",
                fix="add --long_documents sliding_window or drop --doc_stride",
            )
        if self.window_loss_weighting == "document" and not windowed:
            fix = "add --long_documents sliding_window or drop --window_loss_weighting"
            raise ConfigError(
                f"--window_loss_weighting document weighs the windows of --long_documents sliding_window; "
                f"{fix}",
                flag="--window_loss_weighting",
                fix=fix,
            )
        if self.task_name == "custom" and not self.text_columns:
            raise ConfigError("--task_name custom needs --text_columns (one column, or two for pairs)")
        if self.validation_mismatched_file and self.task_name != "mnli":
            raise ConfigError("--validation_mismatched_file is for MNLI only; use --validation_file")
        renamed = self.renamed_splits
        if renamed and self.task_name != "custom":
            raise ConfigError(
                f"{renamed[0]} names a split of a custom task's --dataset_name; GLUE tasks and local files "
                "have their own: drop it"
            )
        if not self.uses_local_files and self.task_name == "custom" and self.dataset_name == GLUE_DATASET:
            raise ConfigError(
                "--task_name custom: give local files (--train_file, --validation_file) or --dataset_name (a "
                "Hub dataset id or a local folder of data files)"
            )
        if self.calibrate != "none" and self.eval_strategy == "no":
            raise ConfigError(
                f"--calibrate {self.calibrate} fits on the validation rows; set --eval_strategy steps or "
                "epoch (with validation data), or drop --calibrate",
                flag="--calibrate",
            )
        if self.calibrate != "none" and not self.do_train:
            raise ConfigError(
                f"--calibrate {self.calibrate} fits the trained model; --do_train false trains nothing: "
                "drop --calibrate (a calibrated run's exported model stays calibrated)",
                flag="--calibrate",
                fix="drop --calibrate",
            )
        if self.task_name != "custom":  # GLUE's subsets
            object.__setattr__(self, "dataset_config_name", self.dataset_config_name or self.task_name)
        # The run's folder and tracker project are named by its task (check_across_groups names the
        # other families' by --task_type).
        object.__setattr__(self, "output_dir", self.output_dir or f"outputs/{self.task_name}")
        object.__setattr__(self, "project_name", self.project_name or f"finetune-{self.task_name}")

    @property
    def text_column_names(self) -> tuple[str, ...] | None:
        if self.text_columns is None:
            return None
        return tuple(c.strip() for c in self.text_columns.split(",") if c.strip())

    @property
    def window_stride(self) -> int | None:
        """Tokens of overlap between windows; None: --long_documents truncate."""
        if self.long_documents != "sliding_window":
            return None
        return self.doc_stride if self.doc_stride is not None else self.max_length // 4

    @property
    def cell_label_separator(self) -> str | None:
        """--label_separator as the text that splits a label cell; None: cells are whole labels."""
        return None if self.label_separator == "none" else self.label_separator

    @property
    def listed_class_weights(self) -> tuple[float, ...] | None:
        """--class_weights given as a comma list, as numbers; None when unset or 'balanced'."""
        if self.class_weights in (None, "balanced"):
            return None
        return tuple(float(w) for w in self.class_weights.split(","))

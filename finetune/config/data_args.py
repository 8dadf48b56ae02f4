"""The data group of flags: the task, where its rows come from, their labels, and how many."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from finetune.data.tasks import TASK_CHOICES
from finetune.errors import ConfigError

DATA_EXTENSIONS = (".jsonl", ".json", ".csv", ".tsv", ".parquet")
TAGGING_EXTENSIONS = (".conll", ".iob", ".conllu")
"""--task_type token_classification also reads CoNLL (word and tag per line) and CoNLL-U files."""
GLUE_DATASET = "nyu-mll/glue"
TaskName = Literal[TASK_CHOICES]
TaskType = Literal["sequence_classification", "causal_lm", "token_classification", "dpo"]
LongDocuments = Literal["truncate", "sliding_window"]
WindowAggregation = Literal["mean", "max"]
WindowLossWeighting = Literal["window", "document"]
SPLIT_NAMES = {"train_split_name": "train", "validation_split_name": "validation", "test_split_name": "test"}


@dataclass(frozen=True)
class DataArgs:
    """Data: the task, where its rows come from, their labels, and how many."""

    task_type: TaskType = "sequence_classification"
    """What the run learns. sequence_classification: a label (or score) per text (--task_name). causal_lm:
    supervised fine-tuning of a decoder LLM on the rows of --train_file or --dataset_name (columns
    `messages`, `prompt` + `completion`, or `text`, as TRL reads them); it needs no --task_name.
    token_classification: a tag per word (NER, POS) from JSONL/parquet rows (`tokens` and `tags` or
    `ner_tags`), CoNLL files (.conll, .iob) or CoNLL-U (.conllu); it needs no --task_name. dpo: preference
    tuning of a decoder LLM on `prompt`, `chosen`, `rejected` rows (DPO, IPO, SimPO; --beta, --loss_type)."""
    task_name: TaskName = "mnli"
    """Sequence classification: a GLUE task, or custom: your own files or dataset, its labels read from the
    data."""
    dataset_name: str | None = GLUE_DATASET
    """Hub dataset id, or a local folder of data files (custom tasks); ignored when local files are given."""
    dataset_config_name: str | None = None
    """Hub dataset subset; default: the task name (GLUE), none (custom)."""
    train_split_name: str = "train"
    """Custom task with --dataset_name: its training split."""
    validation_split_name: str = "validation"
    """Custom task with --dataset_name: its validation split (or --validation_split_percentage)."""
    test_split_name: str = "test"
    """Custom task with --dataset_name: the split --do_predict reads."""
    train_file: str | None = None
    """Local training file (.jsonl/.json/.csv/.tsv/.parquet: text column(s) and a label column)."""
    validation_file: str | None = None
    """Local validation (MNLI: matched) file, same columns."""
    validation_mismatched_file: str | None = None
    """Optional local MNLI validation-mismatched file, same columns."""
    test_file: str | None = None
    """Local file to predict with --do_predict; only the text column(s) are needed."""
    text_columns: str | None = None
    """Comma-separated text column(s) of the files, one or two; default: the task's own.
    token_classification: the column of each row's list of words (default: `tokens`)."""
    label_column: str = "label"
    """Label column of the files (class name, class id or a float). token_classification: the column of
    each row's list of tags (default: `tags` or `ner_tags`); in a CoNLL-U file upos (default), xpos or
    deprel."""
    label_names: str | None = None
    """token_classification: comma-separated tag names, in id order, for files whose tags are ids (HF's
    conll2003 ner_tags: O,B-PER,I-PER,B-ORG,I-ORG,B-LOC,I-LOC,B-MISC,I-MISC); the model's labels keep
    that order. A ClassLabel column's ids are read by its own names (--label_names then orders them)."""
    label_all_tokens: bool = False
    """token_classification: train every sub-token of a word on its tag (a B-X's later sub-tokens on I-X,
    run_ner's name and rule), not its first sub-token only. Metrics and predictions stay per word, read from
    each word's first sub-token."""
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
    validation_split_percentage: int | None = None
    """Without --validation_file: hold out this percentage of --train_file (seeded by --seed, stratified by
    label) as the validation split."""
    max_length: int | None = None
    """Longest tokenized row in tokens; longer rows are truncated (the task line counts them for causal_lm).
    Default: each family's: 128 for sequence_classification and token_classification, 1024 for causal_lm
    and dpo (TRL's)."""
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
    max_train_samples: int | None = None
    """Use only the first N training rows (debugging)."""
    max_eval_samples: int | None = None
    """Use only the first N rows of each evaluation set."""
    group_by_length: bool = True
    """Shuffle, then batch pairs of similar length together (far less padding)."""
    completion_only_loss: bool = True
    """causal_lm, prompt-completion rows: train on the completion's tokens and the EOS only (TRL's name);
    false: on every token."""
    assistant_only_loss: bool = True
    """causal_lm, conversations: train on each assistant turn, from after its header through its
    end-of-turn token, found by rendering message prefixes with the chat template (no {% generation %}
    markers needed); false: on every token of the conversation."""
    chat_template: str | None = None
    """causal_lm: a Jinja chat template file (.jinja) that renders the conversations, in place of the
    tokenizer's own; it is exported with the model."""
    packing: bool = False
    """causal_lm: pack the training rows best-fit-decreasing into sequences of up to --max_length tokens
    (TRL's name): fewer, fuller sequences, so far less padding. Each document keeps its own positions
    and attends to and predicts only itself, so the loss is the same as unpacked: on CUDA the packs run as
    one varlen row (sdpa in bf16/fp16 through torch's varlen kernel, or flash_attention_2), elsewhere (sdpa
    in fp32 or on CPU, eager) with a block-causal mask; an attention that cannot keep documents apart is
    refused. The packs are fixed by --seed; --per_device_train_batch_size counts packs, train_samples
    documents. Evaluation is not packed."""

    def __post_init__(self):
        """Checks of this group's flags alone (values from YAML or Python arrive unchecked)."""
        if self.max_length is None:  # each family's default, recorded resolved
            from finetune.families import config_defaults  # the seam's table: imports nothing

            object.__setattr__(self, "max_length", config_defaults(self.task_type).max_length_tokens)
        if self.max_length <= 0:
            raise ConfigError(f"--max_length must be a positive integer, got {self.max_length}")
        for name in ("max_train_samples", "max_eval_samples"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"--{name} must be a positive integer or left unset, got {value}")
        if self.doc_stride is not None and self.doc_stride <= 0:
            raise ConfigError(f"--doc_stride must be a positive integer or left unset, got {self.doc_stride}")
        tagging = self.task_type == "token_classification"
        causal = self.task_type == "causal_lm"
        # Neither causal_lm nor token_classification takes --long_documents sliding_window (their losses
        # weigh each target token alike): advising it there would only move the refusal.
        if self.doc_stride is not None and self.long_documents != "sliding_window" and not tagging:
            fix = "add --long_documents sliding_window or drop --doc_stride"
            fix = "drop --doc_stride" if causal else fix
            why = ": causal_lm truncates at --max_length" if causal else ""
            raise ConfigError(
                f"--doc_stride is the overlap of --long_documents sliding_window's windows{why}; {fix}",
                flag="--doc_stride",
                fix=fix,
            )
        windowed = self.long_documents == "sliding_window"
        if self.window_loss_weighting == "document" and not windowed:
            if causal or tagging:
                fix = "drop --window_loss_weighting"
                why = f"weighs a classifier's windows; {self.task_type}'s loss weighs each target token alike"
            else:
                fix = "add --long_documents sliding_window or drop --window_loss_weighting"
                why = "weighs the windows of --long_documents sliding_window"
            raise ConfigError(
                f"--window_loss_weighting document {why}; {fix}", flag="--window_loss_weighting", fix=fix
            )
        if self.packing and self.task_type != "causal_lm":
            raise ConfigError(
                "--packing is for --task_type causal_lm; drop --packing",
                flag="--packing",
                fix="drop --packing",
            )
        if self.window_loss_weighting is None:  # recorded resolved: a truncated document is one window
            object.__setattr__(self, "window_loss_weighting", "document" if windowed else "window")
        if self.text_columns is not None and not 1 <= len(self.text_column_names) <= 2:
            raise ConfigError(f"--text_columns takes 1 or 2 comma-separated names, got {self.text_columns!r}")
        if self.task_name == "custom" and not self.text_columns:
            raise ConfigError("--task_name custom needs --text_columns (one column, or two for pairs)")
        if self.validation_mismatched_file and self.task_name != "mnli":
            raise ConfigError("--validation_mismatched_file is for MNLI only; use --validation_file")
        extensions = DATA_EXTENSIONS + (TAGGING_EXTENSIONS if tagging else ())
        for name in ("train_file", "validation_file", "validation_mismatched_file", "test_file"):
            path = getattr(self, name)
            if path and not tagging and Path(path).suffix.lower() in TAGGING_EXTENSIONS:
                raise ConfigError(
                    f"--{name} {path}: a CoNLL file (words and their tags) trains a tagger; add --task_type "
                    "token_classification",
                    flag="--task_type",
                    fix="add --task_type token_classification",
                )
            if path and Path(path).suffix.lower() not in extensions:
                raise ConfigError(
                    f"--{name} {path}: unsupported extension; use one of {', '.join(extensions)}"
                )
        self._check_labels()
        renamed = [f"--{flag}" for flag, default in SPLIT_NAMES.items() if getattr(self, flag) != default]
        if self.uses_local_files and self.dataset_name != GLUE_DATASET:
            raise ConfigError(
                "--dataset_name and local files (--train_file, ...) name two sources of rows: give one"
            )
        if renamed and (
            self.uses_local_files
            or (self.task_name != "custom" and self.task_type == "sequence_classification")
        ):
            raise ConfigError(
                f"{renamed[0]} names a split of a custom task's --dataset_name; GLUE tasks and local files "
                "have their own: drop it"
            )
        if not self.uses_local_files and not self.dataset_name:
            raise ConfigError("give local files (--train_file/--validation_file), or a Hub --dataset_name")
        if (
            self.task_type != "sequence_classification"
            and not self.uses_local_files
            and (self.dataset_name == GLUE_DATASET)
        ):
            raise ConfigError(
                f"--task_type {self.task_type}: give local files (--train_file, --validation_file) or "
                "--dataset_name (a Hub dataset id or a local folder of .jsonl/.parquet files)",
                flag="--train_file",
                fix="give --train_file or --dataset_name",
            )
        if not self.uses_local_files and self.task_name == "custom" and self.dataset_name == GLUE_DATASET:
            raise ConfigError(
                "--task_name custom: give local files (--train_file, --validation_file) or --dataset_name (a "
                "Hub dataset id or a local folder of data files)"
            )
        if self.task_name != "custom" and self.task_type == "sequence_classification":  # GLUE's subsets
            object.__setattr__(self, "dataset_config_name", self.dataset_config_name or self.task_name)

    def _check_labels(self) -> None:
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
        p = self.validation_split_percentage
        if p is not None:
            if not 0 < p < 100:
                raise ConfigError(f"--validation_split_percentage must be in 1..99, got {p}")
            if self.validation_file or (self.uses_local_files and not self.train_file):
                raise ConfigError(
                    "--validation_split_percentage carves the validation split out of the training rows: "
                    "give --train_file (or --dataset_name) and no --validation_file"
                )

    @property
    def uses_local_files(self) -> bool:
        return any((self.train_file, self.validation_file, self.validation_mismatched_file, self.test_file))

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

    @property
    def train_source(self) -> str:
        """The training rows, as a message names them."""
        if self.train_file:
            return f"--train_file {self.train_file}"
        return f"--dataset_name {self.dataset_name} (split {self.train_split_name})"

    @property
    def carves_validation(self) -> bool:
        return self.validation_split_percentage is not None and not self.validation_file

"""The data group of flags: the task, where its rows come from, their labels, and how many."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from finetune.data.tasks import GLUE_DATASET
from finetune.errors import ConfigError
from finetune.families import DEFAULT_TASK_TYPE, TaskType

DATA_EXTENSIONS = (".jsonl", ".json", ".csv", ".tsv", ".parquet")
"""Every family's data files (a family may read more: the seam's ConfigDefaults.file_extensions)."""
SPLIT_NAMES = {"train_split_name": "train", "validation_split_name": "validation", "test_split_name": "test"}


@dataclass(frozen=True)
class DataArgs:
    """Data: the task, where its rows come from, their labels, and how many."""

    task_type: TaskType = DEFAULT_TASK_TYPE
    """What the run learns. sequence_classification: a label (or score) per text (--task_name). causal_lm:
    supervised fine-tuning of a decoder LLM on the rows of --train_file or --dataset_name (columns
    `messages`, `prompt` + `completion`, or `text`, as TRL reads them); it needs no --task_name.
    token_classification: a tag per word (NER, POS) from JSONL/parquet rows (`tokens` and `tags` or
    `ner_tags`), CoNLL files (.conll, .iob) or CoNLL-U (.conllu); it needs no --task_name. dpo: preference
    tuning of a decoder LLM on `prompt`, `chosen`, `rejected` rows (DPO, IPO, SimPO; --beta, --loss_type)."""
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
    test_file: str | None = None
    """Local file to predict with --do_predict; only the text column(s) are needed."""
    validation_split_percentage: int | None = None
    """Without --validation_file: hold out this percentage of --train_file (seeded by --seed, stratified by
    label) as the validation split."""
    max_length: int | None = None
    """Longest tokenized row in tokens; longer rows are truncated (the task line counts them for causal_lm).
    Default: each family's: 128 for sequence_classification and token_classification, 1024 for causal_lm
    and dpo (TRL's)."""
    max_train_samples: int | None = None
    """Use only the first N training rows (debugging)."""
    max_eval_samples: int | None = None
    """Use only the first N rows of each evaluation set."""
    group_by_length: bool = True
    """Shuffle, then batch pairs of similar length together (far less padding)."""

    def __post_init__(self):
        """Checks of this group's flags alone (values from YAML or Python arrive unchecked)."""
        from finetune.families import config_defaults, reading_extension  # the seam's tables: no circle

        family = config_defaults(self.task_type)
        if self.max_length is None:  # each family's default, recorded resolved
            object.__setattr__(self, "max_length", family.max_length_tokens)
        if self.max_length <= 0:
            raise ConfigError(f"--max_length must be a positive integer, got {self.max_length}")
        for name in ("max_train_samples", "max_eval_samples"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"--{name} must be a positive integer or left unset, got {value}")
        extensions = DATA_EXTENSIONS + family.file_extensions
        for name in ("train_file", "validation_file", "validation_mismatched_file", "test_file"):
            path = getattr(self, name)
            suffix = Path(path).suffix.lower() if path else None
            if path and suffix not in extensions and (reader := reading_extension(suffix)):
                raise ConfigError(
                    f"--{name} {path}: {config_defaults(reader).files_hint}; add --task_type {reader}",
                    flag="--task_type",
                    fix=f"add --task_type {reader}",
                )
            if path and suffix not in extensions:
                raise ConfigError(
                    f"--{name} {path}: unsupported extension; use one of {', '.join(extensions)}"
                )
        self._check_split()
        if self.uses_local_files and self.dataset_name != GLUE_DATASET:
            raise ConfigError(
                "--dataset_name and local files (--train_file, ...) name two sources of rows: give one"
            )
        if self.renamed_splits and self.uses_local_files:
            raise ConfigError(
                f"{self.renamed_splits[0]} names a split of a custom task's --dataset_name; GLUE tasks and "
                "local files have their own: drop it"
            )
        if not self.uses_local_files and not self.dataset_name:
            raise ConfigError("give local files (--train_file/--validation_file), or a Hub --dataset_name")
        if not family.reads_glue and not self.uses_local_files and self.dataset_name == GLUE_DATASET:
            raise ConfigError(
                f"--task_type {self.task_type}: give local files (--train_file, --validation_file) or "
                "--dataset_name (a Hub dataset id or a local folder of .jsonl/.parquet files)",
                flag="--train_file",
                fix="give --train_file or --dataset_name",
            )

    def _check_split(self) -> None:
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
    def renamed_splits(self) -> list[str]:
        """The split-name flags given away from their defaults, as flags (--train_split_name)."""
        return [f"--{flag}" for flag, default in SPLIT_NAMES.items() if getattr(self, flag) != default]

    @property
    def uses_local_files(self) -> bool:
        return any((self.train_file, self.validation_file, self.validation_mismatched_file, self.test_file))

    @property
    def train_source(self) -> str:
        """The training rows, as a message names them."""
        if self.train_file:
            return f"--train_file {self.train_file}"
        return f"--dataset_name {self.dataset_name} (split {self.train_split_name})"

    @property
    def carves_validation(self) -> bool:
        return self.validation_split_percentage is not None and not self.validation_file

"""`TrainConfig`: every flag of a run, in groups (data_args, model_args, training_args, output_args,
system_args), as one flat dataclass, so flags and YAML keys are the fields' names.

Each group checks its own flags in its `__post_init__`; `check_across_groups` checks what spans groups.
The dataclass is frozen once parsed: what the run resolves is `config.resolved.Resolved`.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import inspect
import math
import textwrap
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from finetune.config.data_args import DATA_EXTENSIONS, DataArgs
from finetune.config.families import owners, refuse_other_families_flags
from finetune.config.model_args import ModelArgs
from finetune.config.output_args import DEFAULT_LOGGING_STEPS, OutputArgs
from finetune.config.system_args import SystemArgs
from finetune.config.training_args import EvaluationArgs, OptimizationArgs
from finetune.data.tasks import GLUE_DATASET
from finetune.errors import ConfigError
from finetune.families import FLAG_GROUPS

__all__ = ["DATA_EXTENSIONS", "GLUE_DATASET", "GROUPS", "TrainConfig"]

GROUPS = (DataArgs, ModelArgs, OptimizationArgs, EvaluationArgs, OutputArgs, SystemArgs, *FLAG_GROUPS)
"""In the order `--help`, docs/flags.md and train_config.json list them: the shared groups, then each
family's own (finetune/families/<family>/flags.py, through the seam)."""


@dataclass(frozen=True)
class TrainConfig(*reversed(GROUPS)):  # a dataclass takes its bases' fields last base first
    """What the user asked for, as parsed (flags, then the YAML file, then HF's defaults filled in by
    the checks); never changed after. What a run resolves for its machine and data is
    `config.resolved.Resolved`; `with_resolved` gives the configuration the run trains with."""

    def __post_init__(self):
        _check_types(self)
        refuse_other_families_flags(self, {f.name: default_of(f) for f in dataclasses.fields(self)})
        _default_eval_strategy(self)  # before the groups' checks: several read it
        for group in GROUPS:
            if "__post_init__" in vars(group):  # a group with checks of its own
                group.__post_init__(self)
        check_across_groups(self)

    def with_resolved(self, resolved) -> TrainConfig:
        """The configuration a run trains with: these flags, each `auto` or derived choice replaced by
        what `resolved` (a `config.resolved.Resolved`) chose; the flags the user gave stay readable."""
        config = copy.copy(self)  # not dataclasses.replace: the checks of user input ran once, on these flags
        for name, value in dataclasses.asdict(resolved).items():
            object.__setattr__(config, name, value)
        return config

    @property
    def evaluates_training(self) -> bool:
        """Training, judged on validation rows as it goes (--eval_strategy other than no)."""
        return self.do_train and self.eval_strategy != "no"


def _check_types(config: TrainConfig) -> None:
    """The parser checks flags; values from YAML or Python code arrive here unchecked."""
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(config):
        value, choices = getattr(config, f.name), _choices(hints[f.name])
        if f.name == "task_type":
            choices = task_types(choices)
        if choices and value is not None and value not in choices:
            raise ConfigError(f"--{f.name} must be one of {', '.join(choices)}, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"--{f.name} must be a finite number, got {value}")


def _default_eval_strategy(config: TrainConfig) -> None:
    """--eval_strategy unset: epoch, or no where training on local files has no validation rows."""
    if config.eval_strategy is None:
        unjudged = config.uses_local_files and config.do_train and not validation_rows(config)
        object.__setattr__(config, "eval_strategy", "no" if unjudged else "epoch")


def validation_rows(config: TrainConfig) -> bool:
    """Whether the run has validation rows of its own (--validation_file, or carved from training's)."""
    return bool(config.validation_file or config.carves_validation)


def _check_files_exist(config: TrainConfig) -> None:
    for name in ("train_file", "validation_file", "validation_mismatched_file", "test_file"):
        path = getattr(config, name)
        if path and not Path(path).is_file():
            raise ConfigError(f"--{name} {path} does not exist; check the path", flag=f"--{name}")


def check_across_groups(config: TrainConfig) -> None:
    """The checks (and HF's defaults) that need flags of two groups; refused before anything loads."""
    default = object.__setattr__  # HF's TrainingArguments fills these in at parse time too
    # A family may have named them (a classifier by its --task_name: sequence_classification/flags.py)
    default(config, "output_dir", config.output_dir or f"outputs/{config.task_type}")
    default(config, "project_name", config.project_name or f"finetune-{config.task_type}")
    bits = config.quantized_bits
    if bits and not config.use_peft:
        raise ConfigError(
            f"--load_in_{bits}bit freezes the base in {bits} bits, which cannot take updates; add --use_peft "
            "(LoRA adapters train beside it)",
            flag=f"--load_in_{bits}bit",
            fix="add --use_peft",
        )
    if bits and config.gguf_file:
        raise ConfigError(
            f"--load_in_{bits}bit with --gguf_file: transformers cannot quantize a GGUF checkpoint while it "
            f"dequantises it; drop --load_in_{bits}bit, or give the model's safetensors folder",
            flag=f"--load_in_{bits}bit",
        )
    if config.eval_strategy == "steps" and config.eval_steps is None:
        # --logging_steps, as Hugging Face Trainer does; unset: its fixed default, not the run's resolved
        # one, which would evaluate a short run at every step
        default(config, "eval_steps", config.logging_steps or DEFAULT_LOGGING_STEPS)
    if config.early_stopping_patience is not None and not config.evaluates_training:
        raise ConfigError(
            "--early_stopping_patience counts evaluations during training; set --eval_strategy steps "
            "or epoch (with --do_train), or drop --early_stopping_patience"
        )
    if config.torch_dtype == "float16" and config.do_train:
        raise ConfigError(
            "--torch_dtype float16: fp16 weights train unstably (no fp32 master copy, gradients the "
            "loss scaler can't unscale); use float32 with --mixed_precision fp16, or bfloat16"
        )
    if config.use_peft and not config.do_train:
        raise ConfigError(
            "--use_peft trains new adapters, --do_train false trains nothing: evaluate a LoRA run's "
            "merged model (its output_dir) without --use_peft"
        )
    if config.evaluates_training and config.train_split_name == config.validation_split_name:
        raise ConfigError(
            f"--validation_split_name {config.validation_split_name} is the training split: the run would "
            "judge itself on its training rows; name another split or use --validation_split_percentage"
        )
    refused = _local_files_lack(config) if config.uses_local_files else None
    if refused:
        _check_files_exist(config)  # a mistyped path first: it may be why a flag seems missing
        raise refused


def _local_files_lack(config: TrainConfig) -> ConfigError | None:
    """What a run on local files lacks, if anything."""
    if config.do_train and not config.train_file:
        return ConfigError("training on local files needs --train_file")
    if config.evaluates_training and not validation_rows(config):  # --eval_strategy given
        return ConfigError(
            f"--eval_strategy {config.eval_strategy} evaluates on validation rows and this run has none; "
            "give --validation_file or --validation_split_percentage, or drop --eval_strategy to train "
            "without evaluating",
            flag="--eval_strategy",
        )
    if config.do_predict and not config.test_file:
        return ConfigError("--do_predict on local files needs --test_file")
    if not config.do_train and not (config.validation_file or config.do_predict):
        return ConfigError(
            "--do_train false: give --validation_file to evaluate, or --do_predict with --test_file"
        )
    return None


def task_types(built_in: tuple) -> tuple:
    """--task_type's values: the Literal's, and the families registered from outside the package
    (`finetune.families.register`: a test's toy family)."""
    from finetune.families import registered  # the seam's registry, not a family: no layer points up

    return (*built_in, *(name for name in registered() if name not in built_in))


def _choices(annotation) -> tuple | None:
    """The values of a Literal (or Optional Literal) type; None for any other type."""
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    literals = [a for a in typing.get_args(annotation) if typing.get_origin(a) is Literal]
    return typing.get_args(literals[0]) if literals else None


@functools.cache
def flag_help() -> dict[str, str]:
    """Each field's attribute docstring, as one line: its `--help` text and docs/flags.md's."""
    docs = {}
    for group in GROUPS:
        body = ast.parse(textwrap.dedent(inspect.getsource(group))).body[0].body
        for node, after in zip(body, body[1:], strict=False):
            if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr):
                docs[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    for name, owned in owners().items():  # the families that read it, as the one refusal rule says
        values = f"{' or '.join(owned.asks)}: " if owned.asks else ""
        docs[name] += f" [{values}--task_type {' or '.join(owned.families)} only]"
    return docs


def default_of(f: dataclasses.Field):
    """A field's default value, made by its factory for the list flags."""
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def as_flag_value(value) -> str:
    """A value as the command line takes it: lists space-separated (nargs flags)."""
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def to_dict(config: TrainConfig) -> dict:
    return dataclasses.asdict(config)

"""`TrainConfig` from the command line and `--config FILE.yaml`: one ConfigError line for a bad flag,
an unknown key, or another toolkit's name for a flag (OTHER_NAMES)."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import re
import sys
from pathlib import Path

import yaml
from transformers import HfArgumentParser
from transformers.hf_argparser import string_to_bool

from finetune.config.train_config import TrainConfig, default_of, flag_help, task_types
from finetune.distributed.launch_env import launcher_rank
from finetune.errors import ConfigError


def _epochs(text: str) -> int | float:
    """--num_train_epochs: a fraction (0.5) as HF Trainer takes it; a whole number stays an int, so the
    model card and train_config.json show 3, not 3.0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of epochs (3, or 0.5), got {text!r}") from None
    return int(value) if value.is_integer() else value


class _Parser(HfArgumentParser):
    """argparse prints its usage and exits on a bad flag; here that is one ConfigError line.

    Beyond HfArgumentParser: an optional bool (`bool | None`, None = decided later) also takes its flag
    bare (= true), as the plain bool flags do; the `--no_X` flags it adds say what they do."""

    def _add_dataclass_arguments(self, dtype):
        super()._add_dataclass_arguments(dtype)
        docs = flag_help()
        for action in self._actions:
            negation = isinstance(action, argparse._StoreFalseAction)
            if action.dest in docs and not negation:
                action.help = docs[action.dest].replace("%", "%%")  # the docstring; argparse formats %
            if negation and action.option_strings[0].startswith("--no_"):
                action.help = f"Turn off --{action.dest}."  # not the positive flag's text again
                action.default = argparse.SUPPRESS  # the positive flag's default decides, not "False"
            elif action.type is string_to_bool and action.nargs is None:
                action.nargs, action.const = "?", True  # `--greater_is_better` alone means true
            elif action.dest == "num_train_epochs":
                action.type = _epochs
            elif action.dest == "task_type":  # and the registered families' (finetune.families.register)
                action.choices = list(task_types(tuple(action.choices)))

    def error(self, message: str):
        # "argument --max_length/--max-length: invalid int value: 'x'" -> "--max_length: invalid ..."
        message = re.sub(r"^argument (--\w+)(/--[\w-]+)*: ", r"\1: ", message)
        choices = re.search(r"^(--\w+): invalid choice: (.+) \(choose from (.+)\)$", message.rstrip("."))
        if choices:  # the fix is the choices themselves
            flag, given, names = choices.groups()
            raise ConfigError(f"{flag}: invalid choice {given}; choose one of {names.replace(chr(39), '')}")
        named = re.match(r"^(--\w+): (.+)$", message.rstrip("."))  # a value argparse could not read
        fix = f"{named.group(2)} (see --help)" if named else None
        raise ConfigError(f"{message.rstrip('.')}; see --help", fix=fix)


# HF Trainer's, run_glue.py's and TRL's names for what has another name (or no flag) here.
OTHER_NAMES = {
    "max_steps": "use --max_train_steps N",
    "bf16": "use --mixed_precision bf16",
    "fp16": "use --mixed_precision fp16",
    "max_seq_length": "use --max_length N",
    "save_steps": "use --checkpointing_steps N",
    "save_strategy": "use --checkpointing_steps N|epoch (the model is always saved at the end)",
    "evaluation_strategy": "use --eval_strategy",
    "do_eval": "evaluation runs whenever there is validation data; --eval_strategy no turns it off",
    "logging_strategy": "use --logging_steps N",
    "per_gpu_train_batch_size": "use --per_device_train_batch_size",
    "per_gpu_eval_batch_size": "use --per_device_eval_batch_size",
    "data_seed": "--seed also orders the data",
    "optim": "the optimizer is always fused AdamW",
    "dataset_config": "use --dataset_config_name",
    "num_epochs": "use --num_train_epochs",
    "hub_token": "set the HF_TOKEN environment variable",
    "dtype": "use --torch_dtype",
    "chat_template_path": "use --chat_template FILE.jinja",
    "dataset_text_field": "name the column text, or give messages or prompt and completion columns",
    "dataset_train_split": "use --train_split_name",
    "dataset_test_split": "use --validation_split_name",
    "eval_packing": "evaluation is never packed (eval_loss is per target token either way)",
    "packing_strategy": "--packing is always best-fit decreasing, each document whole",
}


def _unknown(arguments: list[str], where: str | None = None) -> ConfigError:
    """One line for flags (or, with `where`, YAML keys) this parser lacks; another toolkit's name
    gets what to use instead."""
    for argument in arguments:
        name = argument.lstrip("-").split("=", 1)[0].replace("-", "_")
        if (where or argument.startswith("--")) and name in OTHER_NAMES:
            named = f"{where}: {name}" if where else f"--{name}"
            return ConfigError(f"{named} is HF Trainer's or TRL's name, not one here; {OTHER_NAMES[name]}")
    close = _close_names(arguments, where)
    if where:
        fix = f"did you mean {close}?" if close else "keys are the flag names"
        return ConfigError(f"{where}: unknown key(s) {', '.join(arguments)}; {fix}")
    fix = f"did you mean {close}? (see --help for the flags)" if close else "see --help for the flags"
    return ConfigError(f"unknown argument(s) {' '.join(arguments)}; {fix}")


def _close_names(arguments: list[str], where: str | None) -> str | None:
    """The flags nearest the first unknown name (difflib's ratio, at least 0.75: `--learning_rte` finds
    --learning_rate, `--lr` nothing), as "--a" or "--a or --b"; YAML keys without the dashes."""
    flags = [a for a in arguments if where or a.startswith("--")]
    if not flags:
        return None
    name = flags[0].lstrip("-").split("=", 1)[0].replace("-", "_")
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    close = difflib.get_close_matches(name, names, n=2, cutoff=0.75)
    return " or ".join(n if where else f"--{n}" for n in close) or None


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Flags, optionally on top of `--config FILE.yaml`; unknown flags or keys are an error."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # No abbreviations: `--learning_r` silently meaning `--learning_rate` hides typos.
    parser = _Parser(TrainConfig, allow_abbrev=False)
    known, _ = parser.parse_known_args(argv)
    from_file = {}
    if known.config:
        from_file = _read_yaml(known.config)
        _check_yaml_types(parser, from_file, known.config)
        parser.set_defaults(**from_file)
    namespace, unknown = parser.parse_known_args(argv)
    if unknown:
        raise _unknown(unknown)
    values = {f.name: getattr(namespace, f.name) for f in dataclasses.fields(TrainConfig)}
    named = {a.lstrip("-").split("=", 1)[0].replace("-", "_") for a in argv if a.startswith("--")}
    values.update(_as_the_model_was_trained(values, named | set(from_file)))
    try:
        config = TrainConfig(**values)
    except ConfigError as error:
        error.debug = bool(values["debug"])  # --debug shows the traceback of a refused setting too
        raise
    # What the user set (flags and YAML keys), before __post_init__ and setup resolve anything for
    # this machine: the model card's command. Not a dataclass field, so neither a flag nor in to_dict.
    given = {
        f.name: list(values[f.name]) if isinstance(values[f.name], list) else values[f.name]
        for f in dataclasses.fields(TrainConfig)
        if f.name != "config" and values[f.name] != default_of(f)  # the YAML file's keys are inlined
    }
    object.__setattr__(config, "user_flags", given)  # the frozen dataclass's one record beside its fields
    return config


TASK_FLAGS = (
    "task_type", "task_name", "text_columns", "label_column", "long_documents", "doc_stride",
    "window_aggregation", "max_length",
)  # fmt: skip
WINDOW_FLAGS = ("doc_stride", "window_aggregation")


def _as_the_model_was_trained(values: dict, named: set[str]) -> dict:
    """--do_train false (evaluation or prediction alone) on a model this toolkit trained: the task flags
    left out (--task_type, --task_name, --text_columns, --label_column, and how it read its rows:
    --max_length, --long_documents, the windows' --doc_stride and --window_aggregation) as its folder's
    train_config.json records them, so the model reads its rows as it was trained to, and evaluating a
    custom task's model needs only its files. The window flags only under the --long_documents they were
    trained with (a tagger's windows are its own, under truncate). A flag given wins; a recorded default
    changes nothing and goes unsaid; rank 0 says what was taken."""
    folder = Path(values["model_name_or_path"])
    if values["do_train"] or named.issuperset(TASK_FLAGS) or not folder.is_dir():
        return {}
    for record in (folder / "train_config.json", folder.parent / "train_config.json"):  # best_model/ too
        try:
            recorded = json.loads(record.read_text())
            trained = recorded.get("args") or recorded  # older records: the flat configuration
        except (OSError, ValueError, AttributeError):
            continue
        defaults = {f.name: default_of(f) for f in dataclasses.fields(TrainConfig)}
        taken = {
            k: trained[k]
            for k in TASK_FLAGS
            if k not in named and trained.get(k) is not None and trained[k] != defaults[k]
        }
        reading = (values if "long_documents" in named else {**values, **taken})["long_documents"]
        if reading != trained.get("long_documents", defaults["long_documents"]):
            # e.g. --long_documents truncate given for a windowed model: no window settings
            taken = {k: v for k, v in taken.items() if k not in WINDOW_FLAGS}
        if taken and launcher_rank() == 0:
            shown = " ".join(f"--{k} {v}" for k, v in taken.items())
            print(f"--do_train false: {shown}, as {record} records the model's training", flush=True)
        return taken
    return {}


def _read_yaml(path: str) -> dict:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"--config {path}: cannot read it ({e.strerror})") from None
    try:
        values = yaml.load(text, Loader=_UniqueKeys) or {}
    except _DuplicateKey as e:
        raise ConfigError(f"--config {path}: {e}; keep one") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"--config {path}: not valid YAML{where}; fix the syntax") from None
    if not isinstance(values, dict):
        raise ConfigError(f"--config {path}: expected a mapping of flag names to values")
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise _unknown(unknown, f"--config {path}")
    if "config" in values:
        raise ConfigError(
            f"--config {path}: a config key inside the file is not read (files do not include files); "
            "put its keys in this file, or give that file with --config"
        )
    # As strings, YAML values go through the same argparse type conversion as flags do,
    # so `learning_rate: 2e-5` (a string to YAML 1.1) and `--learning_rate 2e-5` agree.
    # Lists (lora_target_modules: [query, value]) stay lists of strings, as nargs flags give them.
    # YAML 1.1 reads no/yes/off/on as booleans: written back as the flag's words (true, false, and
    # `no` where a choice flag takes it: eval_strategy, mixed_precision), see _check_yaml_types.
    as_strings = {
        k: v if v is None else str(v).lower() if isinstance(v, bool) else str(v) for k, v in values.items()
    }
    return {**as_strings, **{k: [str(x) for x in v] for k, v in values.items() if isinstance(v, list)}}


class _DuplicateKey(yaml.YAMLError):
    pass


class _UniqueKeys(yaml.SafeLoader):
    """safe_load's loader, refusing a key given twice (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise _DuplicateKey(f"{key} is given twice (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _check_yaml_types(parser: HfArgumentParser, values: dict, path: str) -> None:
    """A YAML value the flag's type can't take is named with the file, not as the flag. A list flag's
    single value becomes a list of one (in place), as `--lora_target_modules query` gives."""
    actions = {action.dest: action for action in parser._actions}
    for key, value in values.items():
        action = actions[key]
        if value is None:
            continue
        if value == "false" and action.choices and "no" in action.choices:
            value = values[key] = "no"  # `eval_strategy: no`, which YAML 1.1 reads as false
        if action.nargs in ("+", "*") and not isinstance(value, list):
            value = values[key] = [value]
        if isinstance(value, list) and action.nargs not in ("+", "*"):
            raise ConfigError(
                f"--config {path}: {key} takes one value, not a list; write it as the flag takes it "
                "(a comma list where it takes one, e.g. 1,2,3)"
            )
        for item in value if isinstance(value, list) else [value]:
            try:
                converted = item if action.type is None else action.type(item)
            except (TypeError, ValueError, SystemExit, argparse.ArgumentTypeError):
                raise ConfigError(f"--config {path}: {key}: {item!r} is not a valid value") from None
            if action.choices is not None and converted not in action.choices:
                shown = ", ".join(str(c) for c in action.choices)
                raise ConfigError(f"--config {path}: {key} must be one of {shown}, got {item!r}")

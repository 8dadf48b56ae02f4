"""What makes two launches the same run: the settings that decide the trained weights and the
evaluations that pick them, the rows' content, the model and the number of processes.

`run_identity` computes it once per launch, before anything loads; train_config.json and every
checkpoint record it. A resume, a relaunch of a finished run (--resume_from_checkpoint auto) and a
sweep compare identities and nothing else. Each flag of `TrainConfig` is either in `IDENTITY_FLAGS`
or in `LEFT_OUT` with the reason (a test walks every field); a family's own flags say which they are
where the family declares them (`Owned.left_out`), and are in the identity of a run whose family reads
them only.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from finetune.config.families import ABSENT, SOURCE, SPEED, owners, reads
from finetune.config.model_files import model_files, weight_files
from finetune.config.train_config import DATA_EXTENSIONS, TrainConfig
from finetune.errors import ConfigError
from finetune.families import DEFAULT_TASK_TYPE

_FAMILY_FLAGS = owners()  # each family's own (finetune/families/<family>/flags.py), through the seam
# In the order a refusal lists them: the shared flags, then the families'.
IDENTITY_FLAGS = (
    # task and rows
    "task_type", "ignore_mismatched_sizes", "validation_split_percentage", "max_length", "max_train_samples",
    "max_eval_samples",
    # model
    "model_revision", "torch_dtype", "use_peft", "lora_r", "lora_alpha", "lora_dropout",
    "lora_target_modules", "lora_modules_to_save", "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type",
    "use_bnb_nested_quant",
    # batches and optimization
    "group_by_length", "per_device_train_batch_size", "gradient_accumulation_steps", "num_train_epochs",
    "max_train_steps", "learning_rate", "lr_scheduler_type", "warmup_ratio", "warmup_steps", "weight_decay",
    "max_grad_norm", "adam_beta1", "adam_beta2", "adam_epsilon", "seed",
    # evaluations: they pick the exported model and stop training early
    "do_train", "eval_strategy", "eval_steps", "metric_for_best_model", "greater_is_better",
    "load_best_model_at_end", "early_stopping_patience", "early_stopping_threshold",
    *(flag for flag, owned in _FAMILY_FLAGS.items() if owned.left_out is None),
)  # fmt: skip

_OUTPUT = "where and how the run is written or reported, not what it trains"
LEFT_OUT = {
    "model_name_or_path": "in model: the folder as a place (however the path is written) and its files",
    "dataset_name": SOURCE,
    "dataset_config_name": SOURCE,
    "train_split_name": SOURCE,
    "validation_split_name": SOURCE,
    "train_file": SOURCE,
    "validation_file": SOURCE,
    "test_split_name": "prediction input: predictions do not change the run",
    "test_file": "prediction input: predictions do not change the run",
    "do_predict": "prediction: a finished run predicts without training again",
    "trust_remote_code": "a permission to run the model's code, not a setting of it",
    "attn_implementation": SPEED,
    "per_device_eval_batch_size": "memory and speed: evaluation batches score the same rows",
    "gradient_checkpointing": "memory: recomputes the same activations",
    "mixed_precision": f"{SPEED} (bf16 where the device multiplies it natively)",
    "pad_to_multiple_of": SPEED,
    "keep_freed_memory": SPEED,
    "torch_compile": SPEED,
    "torch_compile_mode": SPEED,
    "torch_compile_regional": SPEED,
    "dataloader_num_workers": SPEED,
    "full_determinism": "which kernels compute the same function: results equal up to rounding",
    "seeds": "a study of runs: each seed's run has its own identity, with its --seed",
    "ddp_bucket_cap_mb": SPEED,
    "ddp_find_unused_parameters": SPEED,
    "ddp_gradient_as_bucket_view": SPEED,
    "ddp_comm_hook": SPEED,
    "peak_tflops": "reporting: MFU's denominator",
    "output_dir": "the run's own folder: it holds the record compared",
    "overwrite_output_dir": _OUTPUT,
    "checkpointing_steps": _OUTPUT,
    "resume_from_checkpoint": _OUTPUT,
    "save_total_limit": _OUTPUT,
    "logging_steps": f"{_OUTPUT} (the --eval_steps it defaults is compared)",
    "report_to": _OUTPUT,
    "project_name": _OUTPUT,
    "run_name": _OUTPUT,
    "save_plots": _OUTPUT,
    "push_to_hub": _OUTPUT,
    "hub_model_id": _OUTPUT,
    "config": "the YAML file's keys are compared, as flags, not its path",
    "debug": _OUTPUT,
    **{flag: owned.left_out for flag, owned in _FAMILY_FLAGS.items() if owned.left_out is not None},
}
# Entries that are not flags, and how a message names them.
DERIVED = {
    "world_size": "processes",
    "model": "model",
    "model_files": "model file",
    "training_data": "training data",
    "validation_data": "validation data",
    "tokenizer": "tokenizer and chat template",
}


def run_identity(config: TrainConfig, world_size: int) -> dict:
    """This launch's identity, as train_config.json and checkpoints record it. Reads the data files
    and the model folder's config to fingerprint them (every rank: no collective)."""
    return {
        "world_size": world_size,
        "model": model_identity(config),
        "model_files": model_files(config),
        "training_data": training_data(config) if config.do_train else None,
        "validation_data": validation_data(config),
        "tokenizer": tokenizer_identity(config),
        **{flag: getattr(config, flag) for flag in IDENTITY_FLAGS if _compared(flag, config)},
    }


GENERATED = ("generation_max_new_tokens",)
"""Flags that change the run only through evaluations that generate (--predict_with_generate: its
eval_exact_match can pick the exported model and stop training). Without it they set the predictions'
and the exported generation_config.json's length alone, which a finished run's --do_predict may change:
they are then left out of the identity (and so out of the comparison; `differences` skips an entry
this launch lacks)."""


def _compared(flag: str, config: TrainConfig) -> bool:
    """A family's flag is in the identity of a run whose family reads it only (each family's identity holds
    its own flags); a GENERATED one only with --predict_with_generate."""
    if flag in _FAMILY_FLAGS and not reads(config, flag):
        return False
    return flag not in GENERATED or config.predict_with_generate


# Flags added to the identity after runs were recorded without them: what such a run had (the behaviour
# before the flag), so a finished run is not taken for one with the flag's new path (a family's own
# flags: `Owned.before`).
ADDED_LATER = {
    "task_type": DEFAULT_TASK_TYPE,
    "load_in_4bit": False,
    "load_in_8bit": False,
    "bnb_4bit_quant_type": "nf4",
    "use_bnb_nested_quant": False,
    "tokenizer": None,
    **{flag: owned.before for flag, owned in _FAMILY_FLAGS.items() if owned.before is not ABSENT},
}


def with_added_later(saved: dict, now: dict) -> dict:
    """`saved` with the ADDED_LATER value of each entry it lacks (recorded before it was part of the
    identity) that `now` has."""
    return {**{k: v for k, v in ADDED_LATER.items() if k in now}, **saved}


def differences(saved: dict, now: dict) -> list[str]:
    """The entries of two identities that differ, in identity order; an entry `saved` lacks (recorded
    before it was part of the identity) is skipped, or compared as its ADDED_LATER value."""
    saved = with_added_later(saved, now)
    return [key for key in now if key in saved and saved[key] != now[key]]


def refuse_other_run(saved: dict | None, now: dict, checkpoint: Path) -> None:
    """Resume only into the run that saved `checkpoint`: one line naming what differs and the fix."""
    if saved is None:
        raise ConfigError(
            f"--resume_from_checkpoint {checkpoint} was saved by an older finetune that did not record what "
            "makes a run the same; resume it with that version, or start over (--overwrite_output_dir or "
            "another --output_dir)"
        )
    differ = differences(saved, now)
    saved = with_added_later(saved, now)  # the message names what an older run's settings amount to
    if "world_size" in differ:
        raise ConfigError(
            f"--resume_from_checkpoint {checkpoint}: saved with {saved['world_size']} processes, this run "
            f"has {now['world_size']}; exact resume needs the same number",
            fix=f"launch {saved['world_size']} processes",
        )
    if "model_files" in differ and "model" not in differ:  # the same folder, its files rewritten
        then, this = described(saved, now, ["model_files"])
        raise ConfigError(
            f"--resume_from_checkpoint {checkpoint} was saved from the model in {_place(now['model'])} "
            f"as it was then ({then}); it has changed since ({this}): resume with the model as it was, or "
            "start a new run (--overwrite_output_dir or another --output_dir)",
            flag="--model_name_or_path",
            fix="resume with the model as it was, or start a new run",
        )
    if "model" in differ:
        raise ConfigError(
            f"--resume_from_checkpoint {checkpoint} was saved from a different model: {saved['model']}; this "
            f"run reads {now['model']}; resume with that model, or start a new run",
            flag="--model_name_or_path",
            fix="resume with that model, or start a new run",
        )
    if differ:
        then, this = described(saved, now, differ)
        raise ConfigError(
            f"--resume_from_checkpoint {checkpoint} was saved by a run with {then}; this run has {this}; "
            "resume with that run's settings, or start a new run (--overwrite_output_dir or another "
            "--output_dir)"
        )


def described(saved: dict, now: dict, differ: list[str]) -> tuple[str, str]:
    """The entries `differ` as each identity has them, as a message shows them ("--seed 1, --lr 0.1")."""
    saved = with_added_later(saved, now)
    return tuple(", ".join(_named(key, _changed(key, values, saved, now)) for key in differ)
                 for values in (saved, now))  # fmt: skip


def _changed(key: str, values: dict, saved: dict, now: dict):
    """The entry `key` of `values` as a message shows it: of model_files, the files that differ only."""
    if key != "model_files" or not isinstance(saved[key], dict) or not isinstance(now[key], dict):
        return values[key]
    names = [n for n in {**saved[key], **now[key]} if saved[key].get(n) != now[key].get(n)]
    return {n: values[key].get(n, "absent") for n in names}


def _place(model: str) -> str:
    """`model_identity`'s folder, without its digest."""
    return model.rsplit(" (files ", 1)[0]


def _named(key: str, value) -> str:
    """An identity entry as a message shows it: a flag as the command line takes it."""
    if isinstance(value, dict):  # model_files: "model file model.safetensors 0123abcd"
        return ", ".join(f"{DERIVED.get(key, key)} {name} {digest}" for name, digest in value.items())
    if key in DERIVED:
        return f"{DERIVED[key]} {value}"
    if isinstance(value, bool):
        shown = str(value).lower()
    elif isinstance(value, list):
        shown = " ".join(map(str, value))
    else:
        shown = "none" if value is None else str(value)
    return f"--{key} {shown}"


def model_identity(config: TrainConfig) -> str:
    """A local folder as a place (relative, absolute or through a link: the same folder) with a digest
    of its config.json and its weight files' names and sizes; a Hub id as written (its revision is a flag).
    Kept as it was when `model_files` came: runs recorded before compare by it alone."""
    folder = Path(config.model_name_or_path)
    if not folder.is_dir():
        return config.model_name_or_path
    digest = hashlib.sha256()
    if (folder / "config.json").is_file():
        digest.update((folder / "config.json").read_bytes())
    for file in weight_files(folder):
        digest.update(f"{file.name} {file.stat().st_size}\n".encode())
    return f"{folder.resolve()} (files {digest.hexdigest()[:12]})"


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt",
                   "tokenizer.model")  # fmt: skip


def tokenizer_identity(config: TrainConfig) -> str | None:
    """A decoder's (its family's `ConfigDefaults.tokenizer_in_identity`): a digest of the tokenizer files
    of the model folder and of --chat_template's content, which decide the target tokens (None for
    classification, whose tokenizer the model folder's digest does not cover either: its runs'
    identities stay as they were)."""
    from finetune.families import config_defaults  # the seam's table: imports nothing

    if not config_defaults(config.task_type).tokenizer_in_identity:
        return None
    digest = hashlib.sha256()
    folder = Path(config.model_name_or_path)
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            digest.update(name.encode() + (folder / name).read_bytes())
    if config.chat_template and Path(config.chat_template).is_file():
        digest.update(b"--chat_template" + Path(config.chat_template).read_bytes())
    return digest.hexdigest()[:12]


def training_data(config: TrainConfig) -> str:
    """The training rows' source fingerprinted by content: a local file's or folder's bytes (sha256);
    a Hub dataset by name, subset and split (its rows are not read before the run loads them)."""
    if config.train_file:
        return f"sha256 {fingerprint([Path(config.train_file)])}"
    return _dataset_rows(config, config.train_split_name)


def validation_data(config: TrainConfig) -> str | None:
    """The validation rows' fingerprint (see `training_data`); None when the run has none of its own
    (carved out of the training rows by --validation_split_percentage, which is compared)."""
    if config.uses_local_files:
        files = [Path(f) for f in (config.validation_file, config.validation_mismatched_file) if f]
        return f"sha256 {fingerprint(files)}" if files else None
    return None if config.carves_validation else _dataset_rows(config, config.validation_split_name)


def _dataset_rows(config: TrainConfig, split: str) -> str:
    folder = Path(config.dataset_name or "")
    if config.dataset_name and folder.is_dir():
        files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in DATA_EXTENSIONS)
        return f"{split} of a folder, sha256 {fingerprint(files, relative_to=folder)}"
    subset = f" {config.dataset_config_name}" if config.dataset_config_name else ""
    return f"{config.dataset_name}{subset} split {split}"


def fingerprint(files: list[Path], relative_to: Path | None = None) -> str:
    """sha256 over the files' names (within `relative_to`) and bytes; a file that can't be read counts
    as missing (loading it reports the error)."""
    digest = hashlib.sha256()
    for path in files:
        if relative_to is not None:
            digest.update(f"{path.relative_to(relative_to)}\n".encode())
        try:
            with path.open("rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
        except OSError:
            digest.update(b"(unreadable)")
    return digest.hexdigest()[:16]

"""The output folder before a run starts: usable, never the model it reads, never silently over a
finished run; cleared of an earlier run's outputs on --overwrite_output_dir; a finished run is
left alone when relaunched with --resume_from_checkpoint auto."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from finetune.config.train_config import TrainConfig
from finetune.distributed.ranks import launcher_rank
from finetune.errors import ConfigError
from finetune.model.loading import TOKENIZER_FILES
from finetune.model.lora import ADAPTER_DIR
from finetune.output.plots import CONFUSION_FILE, CURVES_FILE
from finetune.training.checkpoint import BEST_MODEL_DIR, PREFIX, complete_checkpoints, same_path

RUN_RECORD = (
    "metrics.jsonl",
    "results.json",
    "train_config.json",
    "predictions.jsonl",
    CURVES_FILE,
    CONFUSION_FILE,
)


MODEL_FILES = ("config.json", "generation_config.json", "special_tokens_map.json", "added_tokens.json",
               "merges.txt", "chat_template.jinja", *TOKENIZER_FILES)  # fmt: skip


def check_output_dir(config: TrainConfig, resuming: bool) -> None:
    """Before anything heavy: a usable folder, not the model's own, never silently over a finished run."""
    output_dir = Path(config.output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise ConfigError(f"--output_dir {output_dir} is a file; give a folder path")
    model = Path(config.model_name_or_path)
    if model.is_dir() and output_dir.is_dir() and model.resolve().is_relative_to(output_dir.resolve()):
        where = "is" if model.resolve() == output_dir.resolve() else "holds"
        raise ConfigError(
            f"--output_dir {output_dir} {where} the --model_name_or_path folder: this run would write over "
            "the model it reads and its run record; choose another --output_dir"
        )
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        probe = output_dir / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise ConfigError(
            f"--output_dir {output_dir}: cannot write there ({error.strerror}); choose a writable folder"
        ) from None
    overwrite = config.overwrite_output_dir
    if (output_dir / "results.json").exists() and not (overwrite or resuming):
        raise ConfigError(
            f"--output_dir {output_dir} holds a finished run (results.json); choose another folder, or pass "
            "--overwrite_output_dir to replace that run"
        )
    earlier = complete_checkpoints(output_dir)
    if earlier and not (overwrite or resuming):
        raise ConfigError(
            f"--output_dir {output_dir} holds checkpoints of an earlier run ({earlier[-1].name}); continue "
            "it with --resume_from_checkpoint auto, pass --overwrite_output_dir to remove them and start "
            "over, or choose another folder"
        )


# What makes a relaunch the same run as the finished one: what a checkpoint's resume compares, as
# train_config.json records it (values as given; the paths compared as places).
SAME_RUN = ("task_name", "dataset_config_name", "text_columns", "label_column", "max_train_samples",
            "validation_split_percentage", "group_by_length", "learning_rate", "lr_scheduler_type",
            "warmup_ratio", "warmup_steps", "weight_decay", "max_grad_norm", "adam_beta1", "adam_beta2",
            "adam_epsilon", "label_smoothing_factor", "class_weights", "seed", "per_device_train_batch_size",
            "gradient_accumulation_steps", "num_train_epochs", "max_train_steps", "max_length", "use_peft",
            "lora_r", "lora_alpha", "lora_dropout")  # fmt: skip


SAME_PLACE = ("model_name_or_path", "dataset_name", "train_file", "validation_file")


def finished_run(config: TrainConfig) -> dict | None:
    """--resume_from_checkpoint auto in a folder whose run, the same as this one, has finished
    (results.json): its results, announced by rank 0, so a relaunch (a requeued job, a restarted
    script) changes nothing. Another run's record: None, and the checks that follow refuse it."""
    folder = Path(config.output_dir)
    if config.resume_from_checkpoint != "auto" or config.overwrite_output_dir:
        return None
    try:
        finished = json.loads((folder / "results.json").read_text())
        recorded = json.loads((folder / "train_config.json").read_text())
    except (OSError, ValueError):
        return None
    if any(recorded.get(key) != getattr(config, key) for key in SAME_RUN) or not all(
        same_path(recorded.get(key), getattr(config, key)) for key in SAME_PLACE
    ):
        return None
    if launcher_rank() == 0:
        print(
            f"{config.output_dir} holds a finished run (results.json, step {finished.get('global_step')}): "
            "nothing to resume; to start it over, drop --resume_from_checkpoint and pass "
            "--overwrite_output_dir",
            flush=True,
        )
    return finished


def remove_earlier_run(output_dir: Path) -> None:
    """--overwrite_output_dir without resuming: rank 0 removes what an earlier run wrote (after taking
    the lock, so never under a live run), so nothing of it is left beside the new run's outputs: its
    checkpoints, best model, LoRA adapter, model files (a larger model's extra shards would otherwise
    stay), logs, results, predictions, plots and model card. Files of its own kept."""
    if launcher_rank() != 0:
        return
    checkpoints = [p for p in output_dir.glob(f"{PREFIX}*") if p.name[len(PREFIX) :].isdigit()]
    partial = list(output_dir.glob(f".{PREFIX}*.partial"))
    record = [output_dir / n for n in (BEST_MODEL_DIR, ADAPTER_DIR, *RUN_RECORD)]
    weights = [*output_dir.glob("model*.safetensors"), output_dir / "model.safetensors.index.json"]
    model = [*weights, *(output_dir / n for n in MODEL_FILES)]
    card = output_dir / "README.md"
    if card.is_file() and not _is_model_card(card):
        card = None  # the user's own README
    found = [p for p in (*checkpoints, *partial, *record, *model, card) if p is not None and p.exists()]
    for p in found:
        try:
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
        except OSError as error:
            raise ConfigError(
                f"--overwrite_output_dir: cannot remove {p} ({error.strerror}); remove it yourself or choose "
                "another --output_dir"
            ) from None
    if found:
        named = [p.name for p in found if p in (*partial, *record, card)]
        if any(p in found for p in model):
            named.append("the model files")
        listed = "".join(f", {name}" for name in named)
        print(
            f"--overwrite_output_dir: removed the earlier run's {len(checkpoints)} checkpoint(s){listed} "
            f"from {output_dir}"
        )


def _is_model_card(path: Path) -> bool:
    """The card report.write_model_card writes (its front matter), not a README of the user's."""
    head = path.read_text(errors="replace")[:400]
    return head.startswith("---\nlibrary_name: transformers\n") and "tags: [finetune," in head

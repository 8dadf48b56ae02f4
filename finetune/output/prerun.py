"""The output folder before a run starts: usable, never the model it reads, never silently over a
finished run; cleared of an earlier run's outputs on --overwrite_output_dir; a finished run is
left alone when relaunched with --resume_from_checkpoint auto."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from finetune.config.identity import DERIVED, described, differences
from finetune.config.train_config import TrainConfig
from finetune.distributed.launch_env import launcher_rank
from finetune.errors import ConfigError
from finetune.model.loading import TOKENIZER_FILES
from finetune.model.lora import ADAPTER_DIR
from finetune.output.card import is_model_card
from finetune.output.plots import CONFUSION_FILE, CURVES_FILE, RELIABILITY_FILE
from finetune.training.checkpoint import BEST_MODEL_DIR, PREFIX, complete_checkpoints

RUN_RECORD = (
    "metrics.jsonl",
    "results.json",
    "train_config.json",
    "predictions.jsonl",
    CURVES_FILE,
    CONFUSION_FILE,
    RELIABILITY_FILE,
)


MODEL_FILES = ("config.json", "generation_config.json", "special_tokens_map.json", "added_tokens.json",
               "merges.txt", "chat_template.jinja", *TOKENIZER_FILES)  # fmt: skip


def folders_to_create(output_dir: str | Path) -> Path | None:
    """The topmost folder of `output_dir`'s path that does not exist yet (None: the folder exists): what
    a start that fails leaves behind unless it removes it."""
    path = Path(output_dir).absolute()
    if path.exists():
        return None
    while not path.parent.exists():
        path = path.parent
    return path


def remove_failed_start(output_dir: str | Path, created: Path | None) -> None:
    """After a failed start that held the folder's lock, rank 0 removes what it created (`created`, from
    `folders_to_create` before it): the run's own folder whole, then each parent it made while empty, so
    a sibling run's folder under a parent both made stays. A folder that existed is never touched."""
    if created is None or launcher_rank() != 0:
        return
    folder = Path(output_dir).absolute()
    shutil.rmtree(folder, ignore_errors=True)
    while folder != created and folder.is_relative_to(created):
        folder = folder.parent
        try:
            folder.rmdir()
        except OSError:  # not empty (another run's), or gone
            return


def check_output_dir(config: TrainConfig, resuming: bool, identity: dict) -> None:
    """Before anything heavy: a usable folder, not the model's own, never silently over a finished run,
    an earlier run's outputs or another model's files (an unfinished start of this very run, the same
    `identity`, starts over)."""
    output_dir = Path(config.output_dir)
    check_usable_folder(output_dir, config.model_name_or_path)
    overwrite = config.overwrite_output_dir
    if (output_dir / "results.json").exists() and not (overwrite or resuming):
        raise _finished_elsewhere(output_dir, identity)
    earlier = complete_checkpoints(output_dir)
    if earlier and not (overwrite or resuming):
        raise ConfigError(
            f"--output_dir {output_dir} holds checkpoints of an earlier run ({earlier[-1].name}); continue "
            "it with --resume_from_checkpoint auto, pass --overwrite_output_dir to remove them and start "
            "over, or choose another folder"
        )
    replaced = earlier_outputs(output_dir)
    if replaced and not (overwrite or resuming or _records(output_dir, identity)):
        raise ConfigError(
            f"--output_dir {output_dir} holds files of an earlier run or another model "
            f"({', '.join(replaced)}) that this run would replace; choose another folder, or pass "
            "--overwrite_output_dir to replace them"
        )


def _finished_elsewhere(output_dir: Path, identity: dict) -> ConfigError:
    """A finished run in the folder, and this launch neither resumes it nor replaces it: the flags that
    make it another run (old -> new), since --overwrite_output_dir deletes that run's model to train
    again, and a changed flag is often what the user wants to undo instead."""
    recorded = _recorded(output_dir)
    differ = differences(recorded, identity) if recorded is not None else []
    if not differ:
        return ConfigError(
            f"--output_dir {output_dir} holds a finished run (results.json); choose another folder, or pass "
            "--overwrite_output_dir to replace that run"
        )
    then, this = described(recorded, identity, differ)
    first = differ[0]
    return ConfigError(
        f"--output_dir {output_dir} holds a finished run (results.json) with {then}; this run has {this}; "
        "relaunch with that run's settings to keep it, choose another folder, or pass "
        "--overwrite_output_dir to delete that run's model and train again",
        flag="--output_dir" if first in DERIVED else f"--{first}",
        fix="relaunch with that run's settings, choose another --output_dir, or pass --overwrite_output_dir",
    )


def check_usable_folder(output_dir: Path, model_name_or_path: str) -> None:
    """A folder (made if missing) this process can write to, and not the model's own folder or one
    holding it (a run's, or a study's: its exported model would be written over the model read)."""
    if output_dir.exists() and not output_dir.is_dir():
        raise ConfigError(f"--output_dir {output_dir} is a file; give a folder path")
    model = Path(model_name_or_path)
    if model.is_dir() and output_dir.is_dir() and model.resolve().is_relative_to(output_dir.resolve()):
        where = "is" if model.resolve() == output_dir.resolve() else "holds"
        raise ConfigError(
            f"--output_dir {output_dir} {where} the --model_name_or_path folder: this run would write over "
            "the model it reads and its run record; choose another --output_dir"
        )
    if not output_dir.exists() and int(os.environ.get("LOCAL_RANK", "0")) != 0:
        return  # made by each machine's first rank: rank 0 alone knows the folder did not exist before
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        probe = output_dir / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise ConfigError(
            f"--output_dir {output_dir}: cannot write there ({error.strerror}); choose a writable folder"
        ) from None


def earlier_outputs(output_dir: Path) -> list[str]:
    """What this run would write over: an earlier run's model, best model, adapter, records and plots, or
    another model's files (a README of the user's is never written over, so it is not listed)."""
    found = [name for name in (BEST_MODEL_DIR, ADAPTER_DIR, *RUN_RECORD) if (output_dir / name).exists()]
    model = [*output_dir.glob("model*.safetensors"), *(output_dir / n for n in MODEL_FILES)]
    return found + (["model files"] if any(p.exists() for p in model) else [])


def _recorded(output_dir: Path) -> dict | None:
    """The identity the folder's train_config.json records (None: no record, or one without it)."""
    try:
        recorded = json.loads((output_dir / "train_config.json").read_text()).get("identity")
    except (OSError, ValueError, AttributeError):
        return None
    return recorded if isinstance(recorded, dict) else None


def _records(output_dir: Path, identity: dict) -> bool:
    """The folder's train_config.json records this run (a start that ended before its first checkpoint)."""
    recorded = _recorded(output_dir)
    return recorded is not None and not differences(recorded, identity)


def finished_run(config: TrainConfig, identity: dict) -> dict | None:
    """--resume_from_checkpoint auto in a folder whose run, the same as this one (its recorded identity
    equals `identity`), has finished (results.json): its results, announced by rank 0, so a relaunch (a
    requeued job, a restarted script) changes nothing. Another run's record: None, and the checks that
    follow refuse it."""
    folder = Path(config.output_dir)
    if config.resume_from_checkpoint != "auto" or config.overwrite_output_dir:
        return None
    try:
        finished = json.loads((folder / "results.json").read_text())
        recorded = json.loads((folder / "train_config.json").read_text()).get("identity")
    except (OSError, ValueError, AttributeError):
        return None
    if recorded is None or differences(recorded, identity):
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
    if card.is_file() and not is_model_card(card):
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

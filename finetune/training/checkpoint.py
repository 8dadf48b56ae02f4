"""Training-state checkpoints: written by every rank, published atomically, resumed exactly."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import pickle
import shutil
import zipfile
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

from accelerate.utils import DistributedType
from accelerate.utils import load as safe_load  # torch.load(weights_only=True) plus numpy's RNG types
from safetensors import safe_open

from finetune.config.identity import refuse_other_run
from finetune.distributed.launch_env import launcher_rank
from finetune.errors import ConfigError, TrainingFailed, _reason
from finetune.model.quantization import loading_quantized_models
from finetune.output.modes import follow_umask

PREFIX = "checkpoint-"


STATE_FILE = "trainer_state.json"


MANIFEST = "manifest.json"
"""{file: {"bytes": size, "crc32": checksum}} of what save_state wrote (not the state file, which is
checked by parsing it): resume checks both. Checkpoints written before held {file: bytes}: sizes only."""


CHUNK_BYTES = 16 * 2**20
"""The checksum reads a file in pieces of this size: streaming, whatever the file's size."""


BEST_MODEL_DIR = "best_model"


BEST_RECORD = "eval_results.json"
"""In best_model/: the evaluation record (step, metrics) of the weights there."""


@dataclass
class TrainState:
    global_step: int = 0
    """Optimizer updates done."""
    epoch: int = 0
    """Epoch in progress (0-based)."""
    micro_batches_in_epoch: int = 0
    """Micro-batches of `epoch` already consumed by each process; resume skips exactly these."""
    samples_seen: int = 0
    """Training pairs consumed, summed over processes."""
    tokens_seen: int = 0
    """Real (non-pad) training tokens consumed, summed over processes."""
    best_metric: float | None = None
    """Best value of --metric_for_best_model so far."""
    best_step: int | None = None
    """Optimizer step at which best_metric was measured."""
    best_evaluation: dict | None = None
    """The metrics.jsonl record of the best evaluation."""
    last_evaluation: dict | None = None
    """The metrics.jsonl record of the latest evaluation."""
    last_eval_step: int | None = None
    """Optimizer step of the latest finished evaluation: a step is never evaluated twice, and a resumed
    run evaluates a step whose evaluation a stop signal abandoned."""
    early_stopping_patience_counter: int = 0
    """Evaluations in a row that did not beat best_metric by more than --early_stopping_threshold."""
    tracker_run_id: str | None = None
    """W&B run id: a resumed run continues the same W&B run."""
    identity: dict | None = None
    """What makes a resumed run the same run (identity.run_identity); resume compares it, and nothing else."""
    train_runtime_s: float = 0.0
    """Training seconds up to this checkpoint, summed over the run's segments (a resumed run starts a new
    one); evaluation excluded. results.json's train_runtime_s is this at the end of the run."""
    eval_runtime_s: float = 0.0
    """Evaluation seconds up to this checkpoint, summed over the run's segments."""
    log_window: dict | None = None
    """The logging window open at this checkpoint (steps since the last metrics.jsonl loss line), summed
    over processes: {"loss_sum", "samples", "tokens", "seconds"}, and "metrics": {name: [sum, count]} for a
    family that logs its own. A resumed run continues it, so its next loss line, and the run's samples and
    tokens, are those of a run never interrupted."""
    for_export: bool = False
    """A checkpoint of the last step, written after training for the export alone (no scheduled one
    held that step; training/loop.py): a run resumed from it trains no further, and it is removed
    once results.json is written."""


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Published checkpoints, oldest first. Unfinished writes live under a temporary name."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [
        p for p in root.glob(f"{PREFIX}*") if p.name[len(PREFIX) :].isdigit() and (p / STATE_FILE).is_file()
    ]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def save_checkpoint(
    accelerator,
    output_dir: str,
    state: TrainState,
    world_size: int,
    save_total_limit: int | None,
    optimizer=None,
) -> Path:
    """Collective: every rank must call it. Only rank 0 publishes and rotates. `optimizer`: given, a
    checkpoint for the export (`state.for_export`) is written without its moments (`_without_moments`)."""
    final = Path(output_dir) / f"{PREFIX}{state.global_step}"
    staging = Path(output_dir) / f".{PREFIX}{state.global_step}.partial"
    if accelerator.is_main_process and staging.exists():
        shutil.rmtree(staging)  # left by a run that died while writing this very step
    accelerator.wait_for_everyone()
    try:
        # Every rank writes its own RNG state (and, under FSDP, its shard) into the staging folder.
        with _without_moments(accelerator, optimizer if state.for_export else None):
            accelerator.save_state(str(staging))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            follow_umask(staging, nested=True)  # every rank's weights are written by then
            # Listed after every rank's save_state: each rank wrote its own RNG file. Rank 0 reads
            # every file back once for its checksum (a full read of the checkpoint, at disk speed).
            listed = {
                str(f.relative_to(staging)): {"bytes": f.stat().st_size, "crc32": file_checksum(f)}
                for f in sorted(staging.rglob("*"))
                if f.is_file()
            }
            (staging / MANIFEST).write_text(json.dumps(listed, indent=2))
            record = {**asdict(state), "world_size": world_size}
            (staging / STATE_FILE).write_text(json.dumps(record, indent=2))
            if final.exists():
                shutil.rmtree(final)
            # A rename is atomic: a folder named checkpoint-N is always a complete checkpoint.
            os.replace(staging, final)
    except (OSError, RuntimeError) as error:  # torch's writer reports a full disk as RuntimeError
        shutil.rmtree(staging, ignore_errors=True)  # give back the space the partial write took
        previous = complete_checkpoints(output_dir)
        intact = f"{previous[-1].name} is intact" if previous else "no earlier checkpoint exists"
        reason = getattr(error, "strerror", None) or str(error).splitlines()[0]
        raise TrainingFailed(
            f"writing {final.name} failed ({reason}); is the disk full? {intact}; free space, then "
            "continue with --resume_from_checkpoint auto"
        ) from error
    if accelerator.is_main_process and save_total_limit:
        # Only after the new one is published, and never the best one.
        best = f"{PREFIX}{state.best_step}"
        for old in complete_checkpoints(output_dir)[:-save_total_limit]:
            if old.name != best:
                shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


@contextlib.contextmanager
def _without_moments(accelerator, optimizer):
    """The optimizer's per-parameter state (AdamW's two moments: twice the trainable weights) left out of
    the save: a checkpoint for the export resumes into no further step, so they would only cost its
    writing, its checksum and the disk (~84 GB for a 7B model). Kept under FSDP, whose optimizer state
    accelerate gathers and shards by its own rules."""
    inner = getattr(optimizer, "optimizer", optimizer)
    if inner is None or accelerator.distributed_type == DistributedType.FSDP:
        yield
        return
    kept = inner.state
    inner.state = collections.defaultdict(dict)
    try:
        yield
    finally:
        inner.state = kept


def remove_export_checkpoint(output_dir: str, state: TrainState) -> None:
    """Rank 0, once results.json is written (a stop before then still finds the checkpoint): the one
    written for the export alone (`TrainState.for_export`) goes, so the run leaves the checkpoints it
    was asked for. One left by a stop in between changes nothing: the run is finished."""
    if state.for_export:
        shutil.rmtree(Path(output_dir) / f"{PREFIX}{state.global_step}", ignore_errors=True)


def file_checksum(file: Path) -> str:
    """zlib's CRC-32 of the file's bytes, read in CHUNK_BYTES pieces, as 8 hex digits."""
    checksum = 0
    with file.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            checksum = zlib.crc32(chunk, checksum)
    return f"{checksum:08x}"


def resolve_resume(resume_from_checkpoint: str | None, output_dir: str) -> Path | None:
    """The checkpoint to resume, verified. `auto` skips a damaged one (with a one-line notice) for the
    newest intact one; an explicit damaged one is refused."""
    if resume_from_checkpoint is None:
        return None
    if resume_from_checkpoint == "auto":
        found = complete_checkpoints(output_dir)
        for candidate in reversed(found):
            problem = damage(candidate)
            if problem is None:
                return candidate
            if launcher_rank() == 0:  # before the Accelerator exists
                print(f"--resume_from_checkpoint auto: skipping {candidate}: {problem}", flush=True)
        if found:
            raise ConfigError(
                f"--resume_from_checkpoint auto: every checkpoint in {output_dir} is damaged; start over "
                "with --overwrite_output_dir instead, or choose another --output_dir"
            )
        return None
    path = Path(resume_from_checkpoint)
    if not path.exists():
        raise ConfigError(
            f"--resume_from_checkpoint {path} does not exist; give a checkpoint-N folder, or 'auto' for the "
            "newest complete one in --output_dir"
        )
    if not (path / STATE_FILE).is_file():
        raise ConfigError(
            f"--resume_from_checkpoint {path}: not a complete checkpoint (no {STATE_FILE}); "
            f"use 'auto' to take the newest complete one in --output_dir"
        )
    problem = damage(path)
    if problem:
        raise ConfigError(
            f"--resume_from_checkpoint {path}: {problem}; give an earlier checkpoint, or 'auto' for the "
            "newest intact one in --output_dir"
        )
    return path


def damage(path: Path) -> str | None:
    """What is wrong with a published checkpoint ("<file> is damaged (...)"), or None: the sizes and
    checksums its manifest lists (sizes only in older manifests, nothing before manifests existed), then
    safetensors headers that parse, pickles that load. Every rank calls it (before the Accelerator
    exists) and reads the checkpoint once for the checksums."""
    records = {}
    for name in (STATE_FILE, MANIFEST):
        if name == STATE_FILE or (path / name).exists():
            try:
                records[name] = json.loads((path / name).read_text())
            except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
                return f"{name} is damaged (not readable JSON)"
    problems = []  # the manifest's word first
    for name, listed in records.get(MANIFEST, {}).items():
        size, checksum = (listed["bytes"], listed["crc32"]) if isinstance(listed, dict) else (listed, None)
        actual = (path / name).stat().st_size if (path / name).is_file() else None
        if actual is None:
            problems.append(f"{name} is missing (listed in {MANIFEST})")
        elif actual != size:
            what = f"truncated: {actual:,} of" if actual < size else f"{actual:,} bytes, written as"
            problems.append(f"{name} is damaged ({what} {size:,} bytes)")
        elif checksum is not None and file_checksum(path / name) != checksum:
            problems.append(f"{name} is damaged (checksum differs)")
    if problems:  # damage, not a pickle to judge (random bytes would read as "Python objects...")
        return problems[0]
    for file in sorted([*path.glob("*.safetensors"), *path.glob("*.bin"), *path.glob("*.pkl")]):
        try:
            if file.stat().st_size == 0:
                raise EOFError("empty")
            if file.suffix == ".safetensors":
                with safe_open(file, framework="pt"):  # parses the header, checks it covers the file
                    pass
            else:  # mmap: reads the pickle and the archive's index, not the tensors
                safe_load(file, map_location="cpu", mmap=zipfile.is_zipfile(file))
        except pickle.UnpicklingError:
            raise ConfigError(
                f"--resume_from_checkpoint {path}: {file.name} holds Python objects other than tensors and "
                "plain data; refusing to unpickle it (only resume from checkpoints you trust)"
            ) from None
        except Exception as error:  # torch says "damaged" as RuntimeError, EOFError, ValueError...
            text = (
                (str(error) or "ends early") if isinstance(error, EOFError) else _reason(error).split(". ")[0]
            )
            problems.append(f"{file.name} is damaged ({text or type(error).__name__})")
    return problems[0] if problems else None


def load_checkpoint(accelerator, path: Path, identity: dict) -> TrainState:
    """Collective: the training state of `path`, into the prepared model, optimizer and schedule; only
    into the run that saved it (the same `identity`)."""
    record = json.loads((path / STATE_FILE).read_text())
    record.pop("world_size", None)  # also in the identity
    for legacy in ("model_signature", "training"):  # what older checkpoints compared instead
        record.pop(legacy, None)
    refuse_other_run(record.get("identity"), identity, path)
    # accelerate's load_state swallows any failure to restore the RNG states, which silently
    # breaks exact resume; so each rank first loads its own file the same safe way and fails loudly.
    rng_file = path / f"random_states_{accelerator.process_index}.pkl"
    try:
        if not rng_file.is_file():
            raise ConfigError(
                f"--resume_from_checkpoint {path}: {rng_file.name} is missing; the checkpoint is incomplete"
            )
        safe_load(rng_file)
        # A quantized base loads its own way (bitsandbytes refuses a strict load into its layers).
        handle = accelerator.register_load_state_pre_hook(loading_quantized_models)
        try:
            accelerator.load_state(str(path))
        finally:
            handle.remove()
    except pickle.UnpicklingError:
        raise ConfigError(
            f"--resume_from_checkpoint {path}: a file there holds Python objects other than tensors and "
            "plain data; refusing to unpickle it (only resume from checkpoints you trust)"
        ) from None
    return TrainState(**record)

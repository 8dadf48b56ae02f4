"""The study in its storage: opened (created or joined) with Optuna's sampler and pruner; a storage
that cannot be opened is one ConfigError line naming --storage, never a traceback."""

from __future__ import annotations

import re
import time
from pathlib import Path

import optuna

from finetune.errors import ConfigError, TrainingFailed, shorten
from finetune.studies.journal import journal_storage
from finetune.studies.sweep_config import SweepSpec, grid_of

JOURNAL_FILE = "optuna-journal.log"
EXAMPLE = "give a URL such as sqlite:///sweep.db, or leave --storage out for a journal file in --output_dir"


def open_study(spec: SweepSpec, name: str, storage: str | None, direction: str, root: Path) -> optuna.Study:
    """Creates the study or joins it (same name, same storage); refuses a storage Optuna cannot open
    and a study that optimizes the other way. `storage` None: the journal file in `root`."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # a line per trial is ours to print
    for attempt in range(5):
        try:
            if storage is None:
                Path(root).mkdir(parents=True, exist_ok=True)
            opened = journal_storage(Path(root) / JOURNAL_FILE) if storage is None else storage
            study = optuna.create_study(
                study_name=name,
                storage=opened,
                sampler=sampler_for(spec),
                pruner=pruner_for(spec),
                direction=direction,
                load_if_exists=True,
            )
            break
        except (ConfigError, TrainingFailed):
            raise
        except Exception as error:
            # Workers started together on a new database race to create its tables or the study
            # (SQLAlchemy's OperationalError "table studies already exists", IntegrityError, "database
            # is locked"): the loser tries again and joins what the winner made.
            if attempt < 4 and _racing(error):
                time.sleep(0.5 * (attempt + 1))
                continue
            problem = cannot_open(storage, error, root)
            if problem is None:
                raise
            raise problem from None
    if study.direction.name.lower() != direction:
        raise ConfigError(
            f"--study_name {name}: that study is to {study.direction.name.lower()}, this sweep's metric is "
            f"to {direction} (--metric_for_best_model / --greater_is_better); use another --study_name",
            flag="--study_name",
        )
    return study


def _racing(error: Exception) -> bool:
    kind, text = type(error).__name__, str(error)
    return kind == "IntegrityError" or (
        kind == "OperationalError" and ("already exists" in text or "database is locked" in text)
    )


def cannot_open(storage: str | None, error: Exception, root: Path) -> ConfigError | None:
    """The one line for a storage Optuna could not open; None for an error that is not about it."""
    if storage is None:  # the journal file: only the filesystem can refuse it
        if not isinstance(error, OSError):
            return None
        return ConfigError(
            f"--output_dir {root}: cannot open the study's journal {JOURNAL_FILE} there "
            f"({error.strerror}); choose a folder you can write to"
        )
    from optuna.exceptions import StorageInternalError
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

    if not isinstance(
        error, ValueError | ImportError | RuntimeError | StorageInternalError | SQLAlchemyError
    ):
        return None
    # SQLAlchemy's first line, without its "(sqlite3.OperationalError) " prefix.
    reason = shorten(re.sub(r"^\([\w.]+\) ", "", str(error).strip().splitlines()[0]), 120)
    scheme = storage.split(":", 1)[0] if "://" in storage else None
    if isinstance(error, NoSuchModuleError) or (scheme and scheme.startswith("redis")):
        what, fix = f"{scheme}:// is not a database Optuna can use", EXAMPLE
    elif isinstance(error, ArgumentError):
        what, fix = "not a storage URL", EXAMPLE
    elif isinstance(error, ImportError):
        what, fix = f"the driver for {scheme} is not installed", f"install it, or {EXAMPLE}"
    elif "unable to open database file" in reason:
        what, fix = f"cannot open that file ({reason})", "give a path in an existing folder you can write to"
    elif "not a database" in reason:
        what, fix = f"that file is not a database ({reason})", "give a new file or an Optuna database"
    else:
        what, fix = f"Optuna cannot open it ({reason})", EXAMPLE
    return ConfigError(f"--storage {storage}: {what}; {fix}", flag="--storage", fix=fix)


def sampler_for(spec: SweepSpec, trial_number: int | None = None) -> optuna.samplers.BaseSampler:
    """Optuna's sampler. tpe and random are seeded by (seed, trial number): workers asking at the same
    moment draw different params, and one worker's study is reproducible."""
    if spec.sampler == "grid":
        return optuna.samplers.GridSampler({p.name: grid_of(p) for p in spec.search_space}, seed=spec.seed)
    seed = None if spec.seed is None else spec.seed + 1_000_003 * (trial_number or 0)
    return (
        optuna.samplers.TPESampler(seed=seed)
        if spec.sampler == "tpe"
        else optuna.samplers.RandomSampler(seed)
    )


def pruner_for(spec: SweepSpec) -> optuna.pruners.BasePruner:
    if spec.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=spec.pruner_startup_trials)
    if spec.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner()
    return optuna.pruners.NopPruner()

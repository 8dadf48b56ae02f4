"""Which study a sweep joins, and that its folder and its storage hold that study and nothing else.

A study's identity is what makes two launches the same sweep: the identity of the run every trial is
(finetune/config/identity.py), less the searched flags, plus the objective and the search space (a
trial RUNNING under another space could not be resumed under this one). `n_trials`, the sampler and the
pruner are not part of it: a study may grow, or be sampled another way.

It is recorded twice, before any trial: in `<output_dir>/study.json`, with the flags as given (as a
run's train_config.json records them), which binds the folder to one study; and in the study itself (an
Optuna user attribute), so a study in a shared --storage is joined only by the same sweep. The default
--study_name is `finetune-sweep-<digest of the identity>`: different sweeps never share a study by chance.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import optuna

from finetune.config.identity import _named, differences, run_identity, with_added_later
from finetune.config.train_config import TrainConfig, to_dict
from finetune.distributed.launch_env import launcher_world_size
from finetune.errors import ConfigError
from finetune.output.lock import release_lock, take_lock
from finetune.output.prerun import check_usable_folder, earlier_outputs, remove_earlier_run
from finetune.studies import claims
from finetune.studies.report import REPORT_FILE, RERUN_DIR
from finetune.studies.storage import JOURNAL_FILE, open_study
from finetune.studies.sweep_config import Param, SweepSpec
from finetune.training.checkpoint import complete_checkpoints

STUDY_FILE = "study.json"
IDENTITY_ATTR = "finetune_identity"
DEFAULT_STUDY = "finetune-sweep"


def join_study(base: TrainConfig, spec: SweepSpec, study_name: str | None, storage: str | None, metric: str,
               direction: str) -> tuple[optuna.Study, str]:  # fmt: skip
    """Rank 0, before any trial: the study this sweep is (created or joined) and its name, once its
    folder and its storage are found to hold this study and nothing else. A refusal changes nothing;
    an earlier single run in the folder is removed (--overwrite_output_dir) only after every check."""
    root = Path(base.output_dir)
    identity = study_identity(base, spec, metric, direction)
    name = study_name or default_study_name(identity)
    record = {"study_name": name, "storage": storage, "objective": identity["objective"],
              "search_space": identity["search_space"], "args": to_dict(base),
              "identity": identity}  # fmt: skip
    check_usable_folder(root, base.model_name_or_path)
    # Before the folder's lock file is made: a refusal leaves the folder as it was.
    check_study_folder(root, record, base.overwrite_output_dir, spec.path)
    study = open_study(spec, name, storage, direction, root) if storage is not None else None
    with claims.one_worker_at_a_time(root):  # workers of one folder check and record it one at a time
        replace = check_study_folder(root, record, base.overwrite_output_dir, spec.path)
        made = not (root / STUDY_FILE).exists()
        if made:  # before the journal: a journal in the folder without it is an older finetune's
            _write_json(root / STUDY_FILE, record)
        try:
            study = study or open_study(spec, name, storage, direction, root)
            check_study_identity(study, identity, name, storage, spec.path)
        except BaseException:
            if made:  # a refused start leaves the folder as it found it
                (root / STUDY_FILE).unlink(missing_ok=True)
            raise
        if replace:
            take_lock(root)  # never under a live run
            try:
                remove_earlier_run(root)
            finally:
                release_lock(root)
    return study, name


def study_identity(base: TrainConfig, spec: SweepSpec, metric: str, direction: str) -> dict:
    """The run identity every trial shares (the searched flags left out), the objective and the search
    space; as JSON gives it back (a storage returns lists, never tuples)."""
    searched = {p.name for p in spec.search_space}
    identity = {k: v for k, v in run_identity(base, launcher_world_size()).items() if k not in searched}
    identity["objective"] = f"{metric} ({direction})"
    identity["search_space"] = {p.name: _range(p) for p in spec.search_space}
    return json.loads(json.dumps(identity))


def default_study_name(identity: dict) -> str:
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return f"{DEFAULT_STUDY}-{digest}"


def check_study_folder(root: Path, record: dict, overwrite: bool, sweep_config: str | None) -> bool:
    """--output_dir holds this study (its study.json) or nothing of another run or study; whether an
    earlier single run's outputs are to be removed (--overwrite_output_dir)."""
    saved = _read_record(root)
    if saved is not None:
        if (saved["study_name"], saved["storage"]) == (record["study_name"], record["storage"]):
            return False  # this study's folder; the study's own record is compared next
        refuse_other_study(saved["identity"], record["identity"], f"--output_dir {root} holds a sweep",
                           "relaunch with its flags and search space, or choose another --output_dir",
                           "--output_dir", sweep_config)  # fmt: skip
        storage = f" --storage {saved['storage']}" if saved["storage"] else ""  # the same sweep, elsewhere
        raise ConfigError(
            f"--output_dir {root} holds the trials of study {saved['study_name']} "
            f"({_where(saved['storage'])}), this sweep is study {record['study_name']} "
            f"({_where(record['storage'])}); relaunch with --study_name {saved['study_name']}{storage}, "
            "or choose another --output_dir",
            flag="--output_dir",
        )
    trials = sorted(p.name for p in root.iterdir() if p.is_dir() and re.fullmatch(r"trial-\d+", p.name))
    older = [n for n in (REPORT_FILE, JOURNAL_FILE, RERUN_DIR) if (root / n).exists()] + trials[:1]
    if older:
        raise ConfigError(
            f"--output_dir {root} holds a sweep started by an older finetune ({older[0]}), which did not "
            f"record its settings ({STUDY_FILE}); finish it with that version, or choose another --output_dir"
        )
    found = [*(p.name for p in complete_checkpoints(root)[-1:]), *earlier_outputs(root)]
    if found and not overwrite:
        what = "a finished run" if "results.json" in found else "files of an earlier run or another model"
        raise ConfigError(
            f"--output_dir {root} holds {what} ({', '.join(found)}), which this sweep would write over or "
            "leave beside its own; choose another folder, or pass --overwrite_output_dir to remove them"
        )
    return bool(found)


def check_study_identity(study: optuna.Study, identity: dict, name: str, storage: str | None,
                         sweep_config: str | None) -> None:  # fmt: skip
    """The study in the storage is this sweep's: its recorded identity equals this one (recorded now
    if the study has none yet and no trial)."""
    saved = study.user_attrs.get(IDENTITY_ATTR)
    if saved is None:
        if study.get_trials(deepcopy=False):
            raise ConfigError(
                f"--study_name {name}: that study ({_where(storage)}) has trials but records no settings (it "
                "was made by an older finetune, or outside it); finish it with that version, or give "
                "another --study_name",
                flag="--study_name",
            )
        study.set_user_attr(IDENTITY_ATTR, identity)
        saved = study.user_attrs[IDENTITY_ATTR]  # read back: a worker of another sweep may have won
    refuse_other_study(saved, identity, f"--study_name {name} ({_where(storage)}) is a sweep",
                       "relaunch with its flags and search space, or give another --study_name (and "
                       "--output_dir)", "--study_name", sweep_config)  # fmt: skip


def refuse_other_study(saved: dict, now: dict, holder: str, fix: str, flag: str,
                       sweep_config: str | None) -> None:  # fmt: skip
    """One line naming what differs between the recorded identity and this sweep's."""
    differ = differences(saved, now)
    saved = with_added_later(saved, now)  # what an older record's missing entries amount to
    if differ == ["search_space"]:  # the YAML file is what changed
        then, this = (_space(space, saved["search_space"], now["search_space"]) for space in (saved, now))
        raise ConfigError(
            f"--sweep_config {sweep_config}: its search space differs from the study's ({holder} over "
            f"{then}; this file: {this}); restore it, or start a new study in another --output_dir",
            flag="--sweep_config",
        )
    if differ:
        then, this = (", ".join(_shown(key, values, saved, now) for key in differ) for values in (saved, now))
        raise ConfigError(f"{holder} of runs with {then}; this sweep's runs have {this}; {fix}", flag=flag)


def _shown(key: str, values: dict, saved: dict, now: dict) -> str:
    if key == "search_space":
        return "search space " + _space(values, saved["search_space"], now["search_space"])
    if key == "objective":
        return f"objective {values[key]}"
    return _named(key, values[key])


def _space(values: dict, saved: dict, now: dict) -> str:
    """The params whose ranges differ, as one side has them."""
    names = [n for n in {**saved, **now} if saved.get(n) != now.get(n)]
    return ", ".join(f"{n}: {values['search_space'].get(n, 'not searched')}" for n in names)


def _range(param: Param) -> str:
    """A searched flag's range in one string: `float 1e-05..0.001 log`, `categorical [16, 32]`."""
    if param.type == "categorical":
        return f"categorical {json.dumps(list(param.choices))}"
    step = f" step {param.step!r}" if param.step is not None else ""
    return f"{param.type} {param.low!r}..{param.high!r}" + (" log" if param.log else "") + step


def _where(storage: str | None) -> str:
    return f"--storage {storage}" if storage else "the journal file in --output_dir"


def _read_record(root: Path) -> dict | None:
    path = root / STUDY_FILE
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict) or not {"study_name", "storage", "identity"} <= set(record):
        raise ConfigError(
            f"--output_dir {root}: its {STUDY_FILE} is not a sweep's record of finetune's (damaged, or a "
            "file of yours); choose another --output_dir"
        )
    return record


def _write_json(path: Path, value: dict) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(value, indent=2))
    os.replace(temporary, path)

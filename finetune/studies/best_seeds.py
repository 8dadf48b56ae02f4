"""`--rerun_best_with_seeds N`: the sweep's honest number. The best trial's value was picked as the best
of many noisy runs, so it overstates what its parameters give; rerunning them with N fresh seeds (the
base --seed + 1 ... + N, never the seed the trial was picked with) in `<output_dir>/best_seeds/` gives
their mean ± std (`best_seeds/summary.json`, as `--seeds` writes it).

One worker reruns: the first to find the study finished takes the folder's claim (a dead worker's claim
is taken over, and its seed runs resume); a folder with a summary of the best trial's rerun is done. The
rerun follows the best: once the study has grown and another trial is best, the earlier rerun is set
aside (`best_seeds-trial-<n>/`, kept) and the new best's params are rerun in best_seeds/. Its record,
best_seeds/rerun.json, names the trial.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path

import optuna

from finetune.config.train_config import TrainConfig
from finetune.distributed.launch_env import launcher_rank
from finetune.studies import claims
from finetune.studies.report import FINISHED, RERUN_DIR, RERUN_RECORD, best_of
from finetune.studies.seeds import SUMMARY_FILE, run_seeds


def take_rerun(study: optuna.Study, n_trials: int, root: Path, n_seeds: int) -> dict | None:
    """Rank 0: the best trial's number and params when this worker is the one to rerun them: the study
    holds its n_trials finished trials, best_seeds/ holds no finished rerun of that trial, the claim is
    won. A rerun of an earlier best (the study grew) is set aside, kept, first. Else None."""
    if n_seeds <= 0 or sum(t.state in FINISHED for t in study.get_trials(deepcopy=False)) < n_trials:
        return None
    best, folder = best_of(study, root), root / RERUN_DIR
    if best is None:
        return None
    with claims.one_worker_at_a_time(root):  # a worker setting the folder aside is alone in it
        if not claims.claim(folder):
            return None  # a live worker reruns; it looks again at the best when it is done
        done = _read(folder / RERUN_RECORD)
        if done is not None and done["trial"] == best["number"] and (folder / SUMMARY_FILE).exists():
            claims.release(folder)
            seeds = json.loads((folder / SUMMARY_FILE).read_text()).get("seeds", [])
            if len(seeds) != n_seeds:  # a relaunch asking for another count: said, not silently ignored
                print(
                    f"--rerun_best_with_seeds {n_seeds}: {folder} already holds the rerun over "
                    f"{len(seeds)} seed(s) {seeds}; nothing rerun (remove {folder} to rerun with {n_seeds})",
                    flush=True,
                )
            return None
        earlier = [p for p in folder.iterdir() if p.name != claims.CLAIM_FILE]
        if earlier and (done is None or done["trial"] != best["number"]):
            _set_aside(folder, done, best["number"])
            if not claims.claim(folder):
                return None
        rerun = {"trial": best["number"], "params": best["params"]}
        (folder / RERUN_RECORD).write_text(json.dumps(rerun, indent=2))
        return rerun


def _set_aside(folder: Path, done: dict | None, best: int) -> None:
    """The rerun of an earlier best (or of a trial an older finetune did not record) renamed, whole,
    beside best_seeds/, which is then made afresh for the current best."""
    was = f"trial-{done['trial']}" if done is not None else "earlier"
    aside, n = folder.with_name(f"{RERUN_DIR}-{was}"), 2
    while aside.exists():
        aside, n = folder.with_name(f"{RERUN_DIR}-{was}-{n}"), n + 1
    os.rename(folder, aside)
    (aside / claims.CLAIM_FILE).unlink(missing_ok=True)  # this worker's own claim, moved with it
    folder.mkdir()
    whose = f"trial {done['trial']}'s params" if done is not None else "params it did not record"
    print(
        f"--rerun_best_with_seeds: the best trial is now {best}; {RERUN_DIR}/ held the rerun of {whose}: "
        f"kept as {aside.name}/, and trial {best}'s params are rerun in {RERUN_DIR}/",
        flush=True,
    )


def rerun_best(base: TrainConfig, params: dict, n_seeds: int, build=None) -> dict:
    """Collective: the best params over N fresh seeds in best_seeds/ (a seeds study); its summary.
    The caller's rank 0 then rewrites sweep.json, which reads the rerun back."""
    root = Path(base.output_dir)
    seeds = ",".join(str(base.seed + k) for k in range(1, n_seeds + 1))
    config = dataclasses.replace(
        base, **params, seeds=seeds, output_dir=str(root / RERUN_DIR), resume_from_checkpoint="auto",
        overwrite_output_dir=False,  # the sweep's flag is for its own folder; finished seeds are kept
    )  # fmt: skip
    # Rank 0 holds the claim: its heartbeat keeps workers on other hosts from taking the rerun over.
    with claims.Heartbeat(root / RERUN_DIR) if launcher_rank() == 0 else contextlib.nullcontext():
        summary = run_seeds(config, build)
    if launcher_rank() == 0:  # the claim's holder
        claims.release(root / RERUN_DIR)
    return summary


def _read(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "trial" in record else None

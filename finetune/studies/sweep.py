"""Hyperparameter sweeps with Optuna: `python finetune/sweep.py --sweep_config sweep.yaml [training flags]`
(also `python -m finetune.sweep`, `accelerate launch finetune/sweep.py`, `torchrun`). See docs/sweeps.md.
The command line, parsed before this module and its imports: studies/sweep_command.py.

Workers. The same command started N times (processes, Slurm array tasks, nodes) is N workers of one
study (Optuna storage: a journal file in --output_dir by default, or --storage URL; studies/joining.py
checks that the folder and the storage hold this study and nothing else). A worker loops:
look for a trial (under a flock of the output folder, so two workers never take the same one), run it
as an ordinary run in `<output_dir>/trial-<n>/`, tell the study; it stops once the study holds n_trials
finished trials (complete, pruned, failed), or every one left is running in another worker.

Killed workers (studies/claims.py). Rank 0 of the worker holds the trial folder's claim (pid, host) from
asking until telling. A RUNNING trial whose claim is dead is adopted by the next worker that looks: the
same params, the same folder, `--resume_from_checkpoint auto` (the run's exact resume; a run that had
finished is read back), then told once. Not Optuna's heartbeat: the journal storage has none, and its
retries are new trials in new folders that could not resume the old one's checkpoints.

DDP. Under a launcher with several processes every trial is a DDP run: rank 0 alone talks to the study
and broadcasts each trial's (number, params) to the others; all ranks train it. The process group is
made before the first trial and kept between trials (`run_config(keep_process_group=True)`).

Pruning. `--pruner` uses the run's own evaluations: `Run.on_evaluation` reports (step, value) and asks
Optuna whether to prune; rank 0 decides and broadcasts it, so every rank stops at the same step. A pruned
trial's run ends as early stopping ends one (what it wrote is kept) and is told PRUNED.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path

import optuna
import torch
from optuna.trial import TrialState

from finetune.config.train_config import TrainConfig, validation_rows
from finetune.distributed.accelerator import fresh_accelerate_state, leave_process_group
from finetune.distributed.launch_env import launcher_rank, launcher_world_size
from finetune.errors import ConfigError, TrainingFailed
from finetune.families import family_for
from finetune.output.tracking import trackers_for
from finetune.run import run_config, setup
from finetune.studies import claims
from finetune.studies.best_seeds import rerun_best, take_rerun
from finetune.studies.joining import join_study
from finetune.studies.report import FINISHED, export_best, trial_folder, write_report
from finetune.studies.storage import JOURNAL_FILE, sampler_for
from finetune.studies.sweep_config import Param, SweepSpec


def run_sweep(base: TrainConfig, spec: SweepSpec, study_name: str | None = None, storage: str | None = None,
              build=None, rerun_best_with_seeds: int = 0) -> dict:  # fmt: skip
    """Collective: this worker's part of the study; every check (metric, folder, study) before any trial;
    then, by one worker, the current best params over fresh seeds."""
    if base.seeds:  # a trial is one run: its value would be --seed's alone, while recorded as the seeds'
        raise ConfigError(
            "--seeds: a sweep trains each trial once, with --seed; drop --seeds (the best params over "
            "fresh seeds: --rerun_best_with_seeds N)",
            flag="--seeds",
        )
    metric, greater_is_better = objective(base)
    root = Path(base.output_dir)
    if launcher_world_size() > 1:  # the group the trials' broadcasts need, before the first Accelerator
        from accelerate import PartialState

        PartialState(cpu=not torch.cuda.is_available())
    direction = "maximize" if greater_is_better else "minimize"
    joined = _on_rank_zero(lambda: join_study(base, spec, study_name, storage, metric, direction))
    study = joined[0] if joined is not None else None
    study_name = _share(joined[1] if joined is not None else None)
    if "wandb" in trackers_for(base.report_to):
        os.environ.setdefault("WANDB_RUN_GROUP", study_name)  # one W&B group per study, one run per trial
    summary = {"study_name": study_name, "storage": storage or str(root / JOURNAL_FILE), "metric": metric,
               "direction": direction, "n_trials": spec.n_trials}  # fmt: skip
    report = {}
    try:
        while True:
            asked = _next_trial(study, spec, root) if study is not None else None
            trial = None if asked is None else asked[0]
            job = _share(None if asked is None else (trial.number, asked[1]))
            if job is None:
                break
            outcome = run_trial(base, *job, metric, trial, build)  # collective
            if study is not None:
                report = _tell(study, trial, job[1], outcome, root, summary, spec.n_trials, base.save_plots)
        n_seeds = rerun_best_with_seeds
        while True:  # until best_seeds/ holds the rerun of the best trial as the study has it now
            rerun = _share(take_rerun(study, spec.n_trials, root, n_seeds) if study is not None else None)
            if rerun is None:
                break
            rerun_best(base, rerun["params"], n_seeds, build)
            if study is not None:
                report = write_report(study, root, summary, base.save_plots)  # with the rerun's figures
    finally:
        leave_process_group()
    return report


def objective(base: TrainConfig) -> tuple[str, bool]:
    """The metric each trial is judged by and whether greater is better: the run's own choice
    (choose_metric, with its error for a metric the task does not produce), from the data's splits."""
    if not base.evaluates_training and base.uses_local_files and not validation_rows(base):
        raise ConfigError(  # --eval_strategy resolved to no for want of validation rows: say that
            "a sweep judges each trial on validation rows and this run has none; give --validation_file "
            "or --validation_split_percentage",
            flag="--validation_file",
        )
    if not base.evaluates_training:
        raise ConfigError(
            "--eval_strategy no: a sweep judges each trial by its evaluations; set --eval_strategy steps "
            "(--eval_steps N, which pruning also uses) or epoch",
            flag="--eval_strategy",
        )
    family = family_for(base.task_type)
    task, splits = family.load(base)
    chosen = family.choose_metric(base, task, splits)
    return chosen["metric_for_best_model"], chosen["greater_is_better"]


def suggest(trial: optuna.Trial, param: Param):
    """The trial's value of one flag (an adopted trial's recorded value: Optuna returns it again)."""
    if param.type == "categorical":
        return trial.suggest_categorical(param.name, list(param.choices))
    if param.type == "int":
        return trial.suggest_int(param.name, int(param.low), int(param.high), step=int(param.step or 1),
                                 log=param.log)  # fmt: skip
    return trial.suggest_float(param.name, param.low, param.high, step=param.step, log=param.log)


def _next_trial(study: optuna.Study, spec: SweepSpec, root: Path) -> tuple[optuna.Trial, dict] | None:
    """Rank 0: a dead worker's RUNNING trial (adopted), else a new one, with its params; None when the
    study has its n_trials (or the rest run in live workers)."""
    with claims.one_worker_at_a_time(root):
        while True:
            trials = study.get_trials(deepcopy=False)
            if sum(t.state in FINISHED for t in trials) >= spec.n_trials:
                return None
            running = (t for t in trials if t.state == TrialState.RUNNING)
            adopted = next((t for t in running if claims.claim(trial_folder(root, t.number))), None)
            if adopted is not None:
                print(f"trial {adopted.number}: its worker is gone; resuming it here", flush=True)
                trial = optuna.Trial(study, adopted._trial_id)
            elif len(trials) >= spec.n_trials:
                return None
            else:
                trial = study.ask()
                if spec.sampler != "grid":  # before the suggest_* calls, which draw the values
                    study.sampler = sampler_for(spec, trial.number)
                if not claims.claim(trial_folder(root, trial.number)):
                    continue  # a worker on another host adopted it between ask and claim: it runs it
            return trial, {p.name: suggest(trial, p) for p in spec.search_space}


def run_trial(base: TrainConfig, number: int, params: dict, metric: str, trial, build=None) -> dict:
    """Collective: one trial as an ordinary run in its folder; its outcome (state, value or reason).
    `trial` is rank 0's optuna.Trial (None on the other ranks)."""
    folder = trial_folder(Path(base.output_dir), number)
    pruned_at = []

    def on_evaluation(step: int, evaluation: dict) -> bool:
        """Collective: rank 0 reports and asks Optuna; every rank gets its answer."""
        prune = False
        if trial is not None:
            trial.report(float(evaluation[metric]), step)
            prune = trial.should_prune()
            if prune:
                print(f"trial {number}: pruned at the evaluation of step {step} ({metric} "
                      f"{evaluation[metric]:.4f})", flush=True)  # fmt: skip
        if _share(prune):
            pruned_at.append(step)
            return True
        return False

    def build_trial(args, identity):
        run = (build or setup)(args, identity)
        run.on_evaluation = on_evaluation
        return run

    heartbeat = claims.Heartbeat(folder) if trial is not None else contextlib.nullcontext()
    try:
        with heartbeat:
            results = run_config(
                trial_config(base, params, folder, number), build_trial, keep_process_group=True
            )
    except (ConfigError, TrainingFailed) as error:
        return {"state": TrialState.FAIL, "reason": str(error)}
    finally:
        fresh_accelerate_state()  # every rank: the next trial's Accelerator starts afresh
    if pruned_at:
        return {"state": TrialState.PRUNED, "pruned_at_step": pruned_at[-1]}
    return {"state": TrialState.COMPLETE, "value": float(results[metric])}


def trial_config(base: TrainConfig, params: dict, folder: Path, number: int) -> TrainConfig:
    """The base flags with the trial's params, in its folder, resuming whatever a killed worker left.
    A bad value is the ConfigError of the run's own checks (the trial fails, the sweep goes on)."""
    named = {"run_name": f"{base.run_name or 'trial'}-{number}"} if trackers_for(base.report_to) else {}
    # --overwrite_output_dir is the sweep's, for its own folder: a trial's folder is the study's, and a
    # finished trial relaunched is read back, never trained again.
    config = dataclasses.replace(base, **params, **named, output_dir=str(folder),
                                 resume_from_checkpoint="auto", overwrite_output_dir=False)  # fmt: skip
    # The model card's command: the flags given plus the trial's.
    object.__setattr__(config, "user_flags", {**getattr(base, "user_flags", {}), **params})
    return config


def _tell(study: optuna.Study, trial: optuna.Trial, params: dict, outcome: dict, root: Path, summary: dict,
          n_trials: int, charts: bool) -> dict:  # fmt: skip
    """Rank 0: the outcome into the study (once), the claim released, sweep.json rewritten (and its
    charts, with `charts`); the best model exported once the study has its n_trials finished trials."""
    state, folder = outcome["state"], trial_folder(root, trial.number)
    for key in ("reason", "pruned_at_step"):
        if key in outcome:
            trial.set_user_attr(key, outcome[key])
    told = next(t.state for t in study.get_trials(deepcopy=False) if t.number == trial.number)
    if told != TrialState.RUNNING:  # never counted twice
        print(f"trial {trial.number}: already told ({told.name}); not told again")
    else:
        # GridSampler.after_trial calls study.stop() once the grid is done, which raises outside
        # study.optimize; Optuna stores the outcome first (in a finally), so it is told all the same.
        with contextlib.suppress(RuntimeError):
            study.tell(trial, outcome.get("value"), state=None if state == TrialState.COMPLETE else state)
    claims.release(folder)
    said = f"{summary['metric']} {outcome['value']:.4f}" if "value" in outcome else outcome.get("reason", "")
    step = f" at step {outcome['pruned_at_step']}" if "pruned_at_step" in outcome else ""
    print(f"trial {trial.number} {state.name}{step}: {said} {params}", flush=True)
    report = write_report(study, root, summary, charts)
    if sum(t["state"] in ("COMPLETE", "PRUNED", "FAIL") for t in report["trials"]) >= n_trials:
        best = export_best(study, root)
        if best is not None:
            print(f"sweep done: best trial {best} ({report['best_trial']['value']}): {root.resolve()}")
    return report


def _share(value):
    """Collective: rank 0's `value` on every rank (as is with one process)."""
    if launcher_world_size() == 1 or not torch.distributed.is_initialized():
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def _on_rank_zero(make):
    """Collective: `make()` on rank 0 (None elsewhere); its ConfigError is raised on every rank."""
    value, problem = None, None
    if launcher_rank() == 0:
        try:
            value = make()
        except ConfigError as error:
            problem = (str(error), error.flag, error.fix)
    problem = _share(problem)
    if problem is not None:
        raise ConfigError(problem[0], flag=problem[1], fix=problem[2])
    return value

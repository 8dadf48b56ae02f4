"""Optuna sweeps (finetune/sweep.py): workers sharing a study, a killed worker's trial resumed exactly,
pruning, failed trials, sqlite storage, DDP trials. The tiny BERT, 4 steps per trial."""

import json
import subprocess
import time

import pytest
import torch

from finetune.errors import ConfigError
from finetune.mnli import main
from finetune.studies.sweep_command import sweep_main
from tests.helpers import PYTHON, REPO, reset_accelerate, tiny_args, weights
from tests.warm_ranks import run_ranks, run_warm, run_warm_apart

TRIAL = ["--max_train_steps", "4", "--max_train_samples", "64", "--eval_strategy", "steps",
         "--eval_steps", "2", "--checkpointing_steps", "2", "--logging_steps", "2"]  # fmt: skip


def sweep_yaml(tmp_path, text: str) -> str:
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return str(path)


def report(out) -> dict:
    return json.loads((out / "sweep.json").read_text())


@pytest.mark.subprocess
def test_two_workers_share_a_study_and_a_killed_workers_trial_resumes_exactly(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    out, note = tmp_path / "study", tmp_path / "killed.txt"
    config = sweep_yaml(tmp_path, "n_trials: 4\nsampler: random\nseed: 0\nsearch_space:\n"
                        "  learning_rate: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}\n")  # fmt: skip
    argv = [
        "--sweep_config",
        config,
        *tiny_args(tiny_model_dir, nli_files, out, *TRIAL, "--save_plots", "true"),
    ]
    # Two workers at once, forked warm (tests/warm_ranks.py): the probe SIGKILLs itself at step 3 of its
    # first trial (after checkpoint-2).
    killed, survivor = run_warm_apart([
        ("tests/probes/sweep_kill_at_step.py", argv, {"AT_STEP": "3", "KILL_NOTE": str(note)}),
        ("finetune/sweep.py", argv, {}),
    ])  # fmt: skip
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert survivor.returncode == 0, survivor.stderr[-3000:]
    out_1 = survivor.stdout
    capsys.readouterr()
    sweep_main(argv)  # the killed worker started again: it resumes the trial if the other one did not
    reset_accelerate()
    adopters = out_1 + capsys.readouterr().out

    trials = report(out)["trials"]
    assert sorted(t["number"] for t in trials) == [0, 1, 2, 3]  # each trial once, none asked twice
    assert {t["state"] for t in trials} == {"COMPLETE"}
    assert len({t["params"]["learning_rate"] for t in trials}) == 4
    best = report(out)["best_trial"]
    values = [t["value"] for t in trials]
    assert best["value"] == (max(values) if report(out)["direction"] == "maximize" else min(values))
    assert torch.equal(
        weights(out)["classifier.weight"], weights(out / f"trial-{best['number']}")["classifier.weight"]
    )
    assert (out / "sweep_history.png").is_file() and (out / "sweep_params.png").is_file()

    # The killed trial resumed from its checkpoint: the same weights as a run never interrupted.
    killed = next(t for t in trials if t["folder"] == note.read_text())
    folder = out / f"trial-{killed['number']}"
    assert f"trial {killed['number']}: its worker is gone; resuming it here" in adopters
    assert f"resuming from {folder / 'checkpoint-2'} at step 2" in adopters
    lr = str(killed["params"]["learning_rate"])
    main(tiny_args(tiny_model_dir, nli_files, tmp_path / "unbroken", *TRIAL, "--learning_rate", lr))
    unbroken, resumed = weights(tmp_path / "unbroken"), weights(folder)
    assert not [name for name in unbroken if not torch.equal(unbroken[name], resumed[name])]


def test_pruned_and_failed_trials_on_sqlite_and_refusals_before_any_trial(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    out = tmp_path / "study"
    # Grid order for seed 4: (1e-2, 16) completes, batch 0 fails twice, then 1e-9 learns nothing: pruned
    # at its first evaluation. Judged on its own 64 training rows, where 2 steps of 1e-2 lower the loss.
    config = sweep_yaml(tmp_path, "n_trials: 4\nsampler: grid\nseed: 4\npruner: median\n"
                        "pruner_startup_trials: 1\nsearch_space:\n"
                        "  learning_rate: {type: categorical, choices: [1.0e-2, 1.0e-9]}\n"
                        "  per_device_train_batch_size: {type: categorical, choices: [16, 0]}\n")  # fmt: skip
    storage = ["--storage", f"sqlite:///{tmp_path / 'study.db'}", "--study_name", "pruning"]
    memorized = {"train": nli_files["train"], "validation": nli_files["train"]}
    base = tiny_args(tiny_model_dir, memorized, out, *TRIAL, "--max_eval_samples", "64",
                     "--metric_for_best_model", "eval_loss")  # fmt: skip
    sweep_main(["--sweep_config", config, *storage, *base, "--rerun_best_with_seeds", "2"])
    reset_accelerate()
    by_number = {t["number"]: t for t in report(out)["trials"]}
    assert [by_number[n]["state"] for n in range(4)] == ["COMPLETE", "FAIL", "FAIL", "PRUNED"]
    assert "--per_device_train_batch_size" in by_number[1]["reason"]
    assert by_number[3]["pruned_at_step"] == 2 and by_number[3]["params"]["learning_rate"] == 1e-9
    assert report(out)["best_trial"]["number"] == 0 and report(out)["direction"] == "minimize"
    # The honest number: the best params again with fresh seeds (the base --seed 42 + 1, + 2).
    rerun = json.loads((out / "best_seeds" / "summary.json").read_text())
    assert rerun["seeds"] == [43, 44] and report(out)["rerun_best_with_seeds"]["seeds"] == [43, 44]
    for seed in (43, 44):
        trained = json.loads((out / "best_seeds" / f"seed-{seed}" / "train_config.json").read_text())
        assert (trained["learning_rate"], trained["per_device_train_batch_size"], trained["seed"]) == (
            1e-2,
            16,
            seed,
        )
    # Relaunched asking for another count: said in one line, the rerun kept.
    capsys.readouterr()
    sweep_main(["--sweep_config", config, *storage, *base, "--rerun_best_with_seeds", "3"])
    reset_accelerate()
    assert "already holds the rerun over 2 seed(s) [43, 44]; nothing rerun" in capsys.readouterr().out

    # Checked before any trial: the direction of the study joined, a metric the task does not produce.
    for flags, flag in ((["--greater_is_better", "true"], "--study_name"),
                        (["--metric_for_best_model", "eval_f1"], "--metric_for_best_model")):  # fmt: skip
        with pytest.raises(ConfigError) as error:
            sweep_main(["--sweep_config", config, *storage, *base, *flags])
        assert error.value.flag == flag
    assert len(report(out)["trials"]) == 4


@pytest.mark.multiprocess
def test_ddp_trials_train_the_same_params_on_both_ranks(tiny_model_dir, nli_files, tmp_path):
    out = tmp_path / "study"
    config = sweep_yaml(tmp_path, "n_trials: 2\nsampler: grid\nsearch_space:\n"
                        "  learning_rate: {type: categorical, choices: [3.0e-3, 1.0e-3]}\n")  # fmt: skip
    args = [
        "--sweep_config",
        config,
        "--rerun_best_with_seeds",
        "1",
        *tiny_args(tiny_model_dir, nli_files, out, *TRIAL),
    ]
    done = run_ranks(args, script="finetune/sweep.py")
    assert done.returncode == 0, done.stderr[-4000:]
    trials = report(out)["trials"]
    assert [t["state"] for t in trials] == ["COMPLETE", "COMPLETE"]
    for trial in trials:
        results = json.loads((out / f"trial-{trial['number']}" / "results.json").read_text())
        recorded = json.loads((out / f"trial-{trial['number']}" / "train_config.json").read_text())
        assert results["world_size"] == recorded["world_size"] == 2
        assert recorded["learning_rate"] == trial["params"]["learning_rate"]
        assert results["replicas_identical"]  # a rank with other params would have trained other weights
    rerun = json.loads((out / "best_seeds" / "seed-43" / "results.json").read_text())
    summary = json.loads((out / "best_seeds" / "summary.json").read_text())
    assert rerun["world_size"] == 2 and summary["seeds"] == [43]


@pytest.mark.subprocess
def test_ctrl_c_stops_a_worker_as_a_run_stops_and_its_trial_resumes(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    out, note = tmp_path / "study", tmp_path / "stopped.txt"
    config = sweep_yaml(tmp_path, "n_trials: 1\nsampler: grid\nsearch_space:\n"
                        "  learning_rate: {type: categorical, choices: [1.0e-3]}\n")  # fmt: skip
    argv = ["--sweep_config", config, *tiny_args(tiny_model_dir, nli_files, out, *TRIAL)]
    env = {"AT_STEP": "3", "KILL_NOTE": str(note), "SIGNAL": "INT"}
    stopped = run_warm(argv, script="tests/probes/sweep_kill_at_step.py", env=env)
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    assert "stopped by SIGINT after step 3" in stopped.stderr  # the run's own stop: a checkpoint
    assert (out / "trial-0" / "checkpoint-3").is_dir() and not (out / "trial-0" / "results.json").exists()
    capsys.readouterr()
    sweep_main(argv)  # the same command again: the trial resumes where the stop left it
    reset_accelerate()
    assert f"resuming from {out / 'trial-0' / 'checkpoint-3'} at step 3" in capsys.readouterr().out
    assert [(t["number"], t["state"]) for t in report(out)["trials"]] == [(0, "COMPLETE")]


@pytest.mark.subprocess
def test_workers_started_together_on_a_new_sqlite_database_both_join(tmp_path):
    """Two workers creating one new sqlite storage at once race to create its tables (SQLAlchemy's
    "table studies already exists" killed one with a traceback): both must join the study."""
    storage = f"sqlite:///{tmp_path / 'sweep.db'}"
    start = tmp_path / "start"
    workers = [
        subprocess.Popen([PYTHON, "tests/probes/open_study_together.py", storage, str(tmp_path / f"ready{i}"),
                          str(start)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]  # fmt: skip
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)) and time.monotonic() < deadline:
        time.sleep(0.05)
    start.touch()
    outputs = [w.communicate(timeout=120) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], [err[-2000:] for _, err in outputs]
    assert [out.strip() for out, _ in outputs] == ["joined", "joined"]

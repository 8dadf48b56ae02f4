"""accelerate_configs/slurm/multinode.sbatch on a real 2-node Slurm cluster (tests/e2e/slurm_cluster.py).

One process per node (PROCS_PER_NODE=1, gloo on CPU), as a user on a CPU cluster submits it; the
output folder has a space in its path, which the flags must carry through srun intact. Each job costs
about 25 s of CPU (a launcher and a rank per node, each importing torch): one classification job is both
the two-node world and the preempted one.
"""

import json
import subprocess
import time

import optuna
import pytest
import torch
from optuna.storages.journal import JournalFileBackend

from tests.e2e.test_sft import ONE_UPDATE, chat, first_update, reference_loss_and_norm, sft_args  # noqa: F401
from tests.helpers import (
    N_VALIDATION,
    REPO,
    free_port,
    tiny_args,
    weights,
    without_dropout,
)
from tests.warm_ranks import run_ranks

pytestmark = pytest.mark.slurm
# 10 steps of 32 pairs: no padded last batch (test_distributed.py); 18 steps asserted nothing more.
ROWS = ["--max_train_samples", "320"]
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}
SWEEP_TRIAL = ["--max_train_steps", "4", "--max_train_samples", "64", "--eval_strategy", "steps",
               "--eval_steps", "2", "--checkpointing_steps", "2", "--logging_steps", "2"]  # fmt: skip
PAUSE_AT = 7  # mid-epoch, mid log window (lines every 5 steps), no checkpoint before it


def submit(cluster, folder, args: list[str], **env: str) -> str:
    """`PROCS_PER_NODE=1 sbatch --nodes 2 multinode.sbatch [args]` from the repository root: the job id."""
    job_env = {**cluster.env, "PROCS_PER_NODE": "1", "MAIN_PORT": str(free_port()), **env}
    command = ["sbatch", "--parsable", "--nodes", "2", "--output", f"{folder}/job-%j.out",
               "accelerate_configs/slurm/multinode.sbatch", *args]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, env=job_env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def wait_until(cluster, job_id: str, ready, what: str, timeout: float = 180) -> dict:
    """Polls `scontrol show job` until `ready(job)`; on a timeout, cancels the job and fails with its log."""
    deadline = time.monotonic() + timeout
    while True:
        job = cluster.job(job_id)
        if ready(job):
            return job
        if time.monotonic() > deadline:
            cluster.run("scancel", "--full", job_id, check=False)
            raise AssertionError(f"job {job_id}: no {what} after {timeout} s: {job}\n{log_of(job)}")
        time.sleep(0.5)


def log_of(job: dict) -> str:
    try:
        with open(job["StdOut"]) as f:
            return f.read()
    except OSError:
        return ""


def finished(job: dict) -> bool:
    return job["JobState"] in FINAL_STATES


@pytest.fixture(scope="module")
def no_dropout_model(tiny_model_dir, tmp_path_factory):
    return without_dropout(tiny_model_dir, tmp_path_factory.mktemp("slurm-model") / "model")


def test_a_preempted_two_node_job_is_one_world_of_two_requeues_and_ends_bitwise_equal(
    slurm_cluster, no_dropout_model, nli_files, tmp_path
):
    """SIGTERM to the batch script (what --signal=B:TERM@60 sends before the time limit, or a
    preemption): the workers checkpoint the step they are at, the job requeues itself under the same
    id and resumes there. The job is one world of two, on both nodes; it ends on the bits of an unbroken
    run of two processes (forked warm: tests/warm_ranks.py), and each validation row evaluated once.

    That two ranks' updates are one process's at the same global batch is asserted without a scheduler
    by test_distributed.py (weights) and test_two_hosts.py (losses): a third run here would add nothing
    the bitwise equality with the unbroken two-rank run does not already pin."""
    out = tmp_path / "out dir"
    pause = {
        "SCRIPT": "tests/probes/pause_at_step.py",
        "PAUSE_AT_STEP": str(PAUSE_AT),
        "PAUSE_DIR": str(tmp_path),
    }
    job_id = submit(slurm_cluster, tmp_path, tiny_args(no_dropout_model, nli_files, out, *ROWS), **pause)
    both_paused = lambda job: finished(job) or all((tmp_path / f"paused-{r}").exists() for r in (0, 1))  # noqa: E731
    job = wait_until(slurm_cluster, job_id, both_paused, f"pause at step {PAUSE_AT}")
    assert job["JobState"] == "RUNNING", log_of(job)[-4000:]
    assert job["NodeList"] == "n[1-2]" and job["NumNodes"] == "2"
    slurm_cluster.run("scancel", "--signal=TERM", "--batch", job_id)

    job = wait_until(slurm_cluster, job_id, finished, "end after the requeue")
    log = log_of(job)
    assert (job["JobState"], job["ExitCode"], job["Restarts"]) == ("COMPLETED", "0:0", "1"), log[-4000:]
    assert (
        f"stopped by SIGTERM after step {PAUSE_AT}; checkpoint saved to {out / f'checkpoint-{PAUSE_AT}'}"
        in log
    )
    assert f"requeueing job {job_id}" in log and f"job {job_id} (restart 1)" in log
    assert f"resuming from {out / f'checkpoint-{PAUSE_AT}'} at step {PAUSE_AT}" in log
    results = json.loads((out / "results.json").read_text())
    assert results["world_size"] == 2 and results["replicas_identical"] is True
    assert json.loads((out / "train_config.json").read_text())["world_size"] == 2
    assert results["global_step"] == 10
    evaluated = {k: v for k, v in results.items() if k.startswith("eval_") and k.endswith("_samples")}
    assert evaluated and set(evaluated.values()) == {N_VALIDATION}  # padding of the last batch dropped

    unbroken = tmp_path / "unbroken"
    done = run_ranks(tiny_args(no_dropout_model, nli_files, unbroken, *ROWS))
    assert done.returncode == 0, done.stderr[-3000:]
    reference, resumed = weights(unbroken), weights(out)
    assert [n for n in reference if not torch.equal(reference[n], resumed[n])] == []


def test_sweep_array_workers_complete_a_study_each_trial_once(
    slurm_cluster, tiny_model_dir, nli_files, tmp_path
):
    """accelerate_configs/slurm/sweep_array.sbatch as a job array of 2 workers (one per node) sharing one
    study of 4 trials through its journal file: every trial finishes, each once."""
    out = tmp_path / "study"
    config = tmp_path / "sweep.yaml"
    config.write_text("n_trials: 4\nsampler: random\nseed: 0\nsearch_space:\n"
                      "  learning_rate: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}\n")  # fmt: skip
    command = ["sbatch", "--parsable", "--array", "0-1", "--output", f"{tmp_path}/worker-%A_%a.out",
               "accelerate_configs/slurm/sweep_array.sbatch", "--sweep_config", str(config),
               *tiny_args(tiny_model_dir, nli_files, out, *SWEEP_TRIAL)]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, env=slurm_cluster.env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    array = done.stdout.strip().split(";")[0]
    tasks = [wait_until(slurm_cluster, f"{array}_{i}", finished, "end") for i in (0, 1)]
    logs = "\n".join(log_of(task) for task in tasks)
    assert [(t["JobState"], t["ExitCode"]) for t in tasks] == [("COMPLETED", "0:0")] * 2, logs[-4000:]
    assert sorted(t["NodeList"] for t in tasks) == ["n1", "n2"]

    storage = optuna.storages.JournalStorage(JournalFileBackend(str(out / "optuna-journal.log")))
    name = json.loads((out / "sweep.json").read_text())["study_name"]  # finetune-sweep-<its digest>
    trials = optuna.load_study(study_name=name, storage=storage).get_trials()
    assert sorted(t.number for t in trials) == [0, 1, 2, 3]  # none asked twice
    assert {t.state for t in trials} == {optuna.trial.TrialState.COMPLETE}
    assert len({t.params["learning_rate"] for t in trials}) == 4
    for n in range(4):  # each trial run by one worker, once
        assert logs.count(f"trial {n} COMPLETE: ") == 1, logs[-4000:]
        assert (out / f"trial-{n}" / "results.json").is_file()


def test_a_causal_lm_job_on_two_nodes_trains_on_the_mean_over_every_target_token(
    slurm_cluster,
    chat,  # noqa: F811  (test_sft's fixture)
    tmp_path,
):
    """Generative fine-tuning through the same sbatch script: 2 nodes x 4 rows x 3 micro-batches make one
    update of the 24 conversations, whose logged loss and gradient norm are plain PyTorch's mean over every
    target token (tests/e2e/test_sft.py), and the job is one world of two."""
    out = tmp_path / "out dir"
    split = ("--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "3")
    job_id = submit(slurm_cluster, tmp_path, sft_args(chat, out, *ONE_UPDATE, *split))
    job = wait_until(slurm_cluster, job_id, finished, "end")
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), log_of(job)[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert results["world_size"] == 2 and results["train_samples"] == 24
    loss, norm = reference_loss_and_norm(chat)
    update = first_update(out)
    assert update["loss"] == pytest.approx(loss, rel=1e-5) and update["grad_norm"] == pytest.approx(
        norm, rel=1e-4
    )

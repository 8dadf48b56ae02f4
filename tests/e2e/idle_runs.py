"""The MiniLM fine-tunings, the suite's longest runs, which tests only read: each starts as collection
ends, a command line at SCHED_IDLE (Linux's "run only on a core nothing else wants"), and a test that
reads it waits for it to end.

Why: a run at SCHED_IDLE takes whatever CPU the other tests leave idle (Slurm's scheduling, rendezvous
and time-out waits, launchers sleeping while ranks start) and yields at once to everything else; in
process it held one pytest-xdist worker for its 3-4 minutes instead. (On 2 cores that idle time is small:
the cores were 95% busy through `make test` on a Zen 3, docs/log.md.)

Under pytest-xdist the first worker to create a run's folder starts it (the folder sits in the
session's temporary folder, which every worker shares), and any worker may read it: a worker that runs
out of tests exits while the run goes on. The session's end stops what still runs (`stop_all`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, SHARED_MNLI, minilm_dir

# Full fine-tuning of MiniLM on the shared real MNLI rows (test_minilm_mnli).
MINILM_STEPS = 100
# LoRA on MiniLM at 2e-3 on `make demo`'s generated NLI pairs: past 0.9 on every seed measured (test_lora).
LORA_STEPS = 60
_WAIT_S = 3600  # a run that takes longer is stuck: the test fails and says so


def _minilm_full(folder: Path) -> list[str]:
    """MINILM_STEPS steps x 32 at 2e-4, evaluated on the first 1,000 of the 9,815 matched rows (the
    accuracy to about ±0.016, one standard error), a training line every 50 steps."""
    if not SHARED_MNLI.is_dir():
        return []
    return [
        "--model_name_or_path", str(minilm_dir()),
        "--train_file", str(SHARED_MNLI / "train.jsonl"),
        "--validation_file", str(SHARED_MNLI / "validation_matched.jsonl"),
        "--max_train_steps", str(MINILM_STEPS), "--per_device_train_batch_size", "32",
        "--learning_rate", "2e-4", "--max_eval_samples", "1000",
        "--logging_steps", "50",
    ]  # fmt: skip


def _minilm_lora(folder: Path) -> list[str]:
    """LORA_STEPS steps x 32 of LoRA at 2e-3 on 3,000 generated pairs, evaluated on 600 others."""
    from finetune.demo_data import write_demo_dataset

    files = write_demo_dataset(folder / "data", n_train=3000, n_validation=600, seed=0)
    return [
        "--model_name_or_path", str(minilm_dir()),
        "--train_file", str(files["train"]), "--validation_file", str(files["validation"]),
        "--use_peft", "--learning_rate", "2e-3", "--max_train_steps", str(LORA_STEPS),
        "--per_device_train_batch_size", "32", "--logging_steps", "20",
    ]  # fmt: skip


# fixture name -> the flags of its run, given the run's folder ([]: it cannot run here, and its tests skip)
RUNS = {"minilm_full": _minilm_full, "minilm_lora": _minilm_lora}


def runs_folder(tmp_path_factory) -> Path:
    """The session's folder of idle runs: the same for every xdist worker (whose temporary folders are
    popen-gw<N> under the session's) and for the controller."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "idle-runs"


def start(names, folder: Path) -> None:
    """Starts each named run that no other worker has started."""
    for name in names:
        run = folder / name
        try:
            run.mkdir(parents=True)  # exists: another worker started it
        except FileExistsError:
            continue
        args = RUNS[name](run)
        if not args:
            (run / "exit_code").write_text("skip")
            continue
        output = ["--output_dir", str(run / "out"), "--report_to", "none", "--save_plots", "false"]
        command = [sys.executable, "-m", "finetune", *args, *output]
        # The shell writes the exit code when the run ends, for whichever worker waits.
        script = '"$@" > log 2>&1; echo $? > exit_code.part && mv exit_code.part exit_code'
        process = subprocess.Popen(
            ["sh", "-c", script, "sh", *command],
            cwd=run,
            start_new_session=True,  # stop_all ends the shell and the run together
            preexec_fn=_idle_priority,
            env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        )
        (run / "pid.part").write_text(str(process.pid))
        (run / "pid.part").rename(run / "pid")  # whole, for a worker reading it


def finished(name: str, tmp_path_factory) -> tuple[Path, dict]:
    """The run `name` once it has ended (waiting for it): (output_dir, results). Fails with the end of its
    log if it failed; skips where it cannot run."""
    run = runs_folder(tmp_path_factory) / name
    if not run.is_dir():  # not started at collection (a test called on its own by node id still is)
        start([name], run.parent)
    deadline, group = time.monotonic() + _WAIT_S, None
    while not (run / "exit_code").exists():
        if group is None and (run / "pid").exists():  # waited for: the tests' priority from now on
            group = int((run / "pid").read_text())
            _normal_priority(group)
        elif group is not None and not _alive(group) and not (run / "exit_code").exists():
            pytest.fail(f"the idle run {name} was killed: {_tail(run)}")
        if time.monotonic() > deadline:
            pytest.fail(f"the idle run {name} did not end in {_WAIT_S} s: {_tail(run)}")
        time.sleep(0.5)
    code = (run / "exit_code").read_text().strip()
    if code == "skip":
        pytest.skip("needs ../shared/data/mnli beside the checkout")
    assert code == "0", f"the idle run {name} exited {code}: {_tail(run)}"
    return run / "out", json.loads((run / "out" / "results.json").read_text())


def stop_all(folder: Path) -> None:
    """Stops every run still going (the session ended before a test read it, or was interrupted)."""
    for pid_file in folder.glob("*/pid"):
        if not (pid_file.parent / "exit_code").exists():
            with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)


def _idle_priority() -> None:
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux: the lowest priority there is
        os.nice(19)


def _normal_priority(group: int) -> None:
    """Every thread of the run's process group back to SCHED_OTHER: at SCHED_IDLE, a machine busy with
    anything else could starve the run a test is waiting for."""
    for _, task in _group_members(group, threads=True):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(task, os.SCHED_OTHER, os.sched_param(0))


def _group_members(group: int, threads: bool = False) -> list[tuple[str, int]]:
    """(state, pid) of each process in the process group `group` (with `threads`, of each thread)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/task/[0-9]*/stat" if threads else "[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after the name: state, ppid, pgrp
            if int(fields[2]) == group:
                members.append((fields[0], int(stat.parent.name)))
    return members


def _alive(group: int) -> bool:
    """Whether a process of the run's group is alive (not a zombie: its parent, a worker, need not reap)."""
    return any(state != "Z" for state, _ in _group_members(group))


def _tail(run: Path) -> str:
    log = run / "log"
    return log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"

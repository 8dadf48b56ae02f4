"""Runs that die (SIGKILL, SIGTERM, a crashed worker, a kill mid-write) and resume exactly."""

import json
import os
import pickle
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from finetune.config import ConfigError
from finetune.mnli import main
from tests.helpers import PYTHON, REPO, free_port, read_jsonl, run_cli, tiny_args, weights

BIN = os.path.dirname(PYTHON)
EPOCHS = ["--num_train_epochs", "8", "--checkpointing_steps", "10"]  # 38 steps/epoch on 1 rank, 19 on 2


def launcher(nproc: int, *extra: str) -> list[str]:
    if nproc == 1:
        return [PYTHON]
    return [
        os.path.join(BIN, "torchrun"),
        "--nproc_per_node",
        str(nproc),
        "--master_port",
        str(free_port()),
        *extra,
    ]


def start(command: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    with log.open("w") as f:
        return subprocess.Popen(
            command, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
            start_new_session=True,
        )  # fmt: skip


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, f"exited with {process.returncode} before {path.name} appeared"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)


def step_losses(output_dir: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_jsonl(output_dir / "metrics.jsonl") if "loss" in r]


def assert_bitwise_equal(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    differing = [name for name in wa if not torch.equal(wa[name], wb[name])]
    assert not differing, differing


@pytest.fixture(scope="module")
def unbroken(tiny_model_dir, nli_files, tmp_path_factory):
    """The reference for a world size: the same run, never interrupted (made once, on first use)."""
    made = {}

    def reference(nproc: int) -> Path:
        if nproc not in made:
            out = tmp_path_factory.mktemp(f"unbroken{nproc}") / "out"
            args = tiny_args(tiny_model_dir, nli_files, out, *EPOCHS)
            done = run_cli([*launcher(nproc), "finetune/mnli.py", *args])
            assert done.returncode == 0, done.stderr[-3000:]
            made[nproc] = out
        return made[nproc]

    return reference


WORLD_SIZES = pytest.mark.parametrize("nproc", [1, 2], ids=["1-process", "2-processes"])


@pytest.mark.multiprocess
@WORLD_SIZES
def test_sigkill_mid_epoch_then_auto_resume_is_bitwise_equal(
    nproc, unbroken, tiny_model_dir, nli_files, tmp_path
):
    reference = unbroken(nproc)
    out = tmp_path / "out"
    command = [*launcher(nproc), "finetune/mnli.py", *tiny_args(tiny_model_dir, nli_files, out, *EPOCHS)]
    process = start(command, tmp_path / "killed.log")
    wait_for(out / "checkpoint-30", process)  # step 30: mid-epoch on 1 rank (38/epoch) and on 2 (19/epoch)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (out / "results.json").exists(), "the run finished before the kill: nothing was tested"

    done = run_cli([*launcher(nproc), "finetune/mnli.py", *tiny_args(tiny_model_dir, nli_files, out, *EPOCHS),
                    "--resume_from_checkpoint", "auto"])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming from" in done.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["world_size"] == nproc
    assert_bitwise_equal(out, reference)
    assert step_losses(out) == step_losses(reference)  # before the kill, and replayed after it


def test_kill_while_writing_a_checkpoint_keeps_the_previous_one(
    unbroken, tiny_model_dir, nli_files, tmp_path
):
    reference = unbroken(1)  # one process is enough: the write is staged the same way for any world size
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, *EPOCHS)
    crashed = run_cli(
        [PYTHON, "tests/probes/crash_in_checkpoint_write.py", *args], env={"CRASH_IN_CHECKPOINT": "20"}
    )
    assert crashed.returncode == 1
    assert (out / ".checkpoint-20.partial" / "model.safetensors").exists()  # the half-written one
    assert not (out / "checkpoint-20").exists() and (out / "checkpoint-10" / "trainer_state.json").exists()

    done = run_cli([PYTHON, "finetune/mnli.py", *args, "--resume_from_checkpoint", "auto"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming from {out / 'checkpoint-10'} at step 10" in done.stdout
    assert_bitwise_equal(out, reference)
    assert not list(out.glob(".checkpoint-*.partial"))  # rewritten at step 20, then published


@pytest.mark.multiprocess
@WORLD_SIZES
def test_sigterm_checkpoints_exits_and_resumes_the_same_wandb_run(
    nproc, unbroken, tiny_model_dir, nli_files, tmp_path
):
    """Preemption: finish the step, save, exit 143 with one line; the relaunch continues exactly."""
    reference = unbroken(nproc)
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, *EPOCHS)
    args[args.index("--report_to") + 1] = "wandb"
    env = {"HOME": str(tmp_path), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    process = start([*launcher(nproc), "finetune/mnli.py", *args], tmp_path / "terminated.log", env)
    wait_for(out / "checkpoint-20", process)
    if nproc == 1:
        process.send_signal(signal.SIGTERM)
    else:  # only rank 1 is told; rank 0 must learn it from rank 1 and stop at the same step
        ranks = subprocess.run(
            ["pgrep", "-P", str(process.pid)], capture_output=True, text=True
        ).stdout.split()
        rank1 = [p for p in ranks if "RANK=1\0" in Path(f"/proc/{p}/environ").read_text()]
        os.kill(int(rank1[0]), signal.SIGTERM)
    process.wait(timeout=120)
    log = (tmp_path / "terminated.log").read_text()
    stopped = [line for line in re.split(r"[\r\n]", log) if line.startswith("stopped by SIGTERM after step")]
    assert stopped, log[-3000:]
    step = int(stopped[0].split()[5].rstrip(";"))
    assert f"checkpoint saved to {out / f'checkpoint-{step}'}" in stopped[0]
    if nproc == 1:  # torchrun reports a worker that exited 143 as a failure, with its own traceback
        assert process.returncode == 143 and "Traceback" not in log
    assert (out / f"checkpoint-{step}" / "trainer_state.json").exists()
    assert not (out / "results.json").exists()

    done = run_cli([*launcher(nproc), "finetune/mnli.py", *args, "--resume_from_checkpoint", "auto"], env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_bitwise_equal(out, reference)
    runs = sorted(p.name for p in (out / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and len({name.rsplit("-", 1)[1] for name in runs}) == 1  # one W&B run id


@pytest.mark.multiprocess
@pytest.mark.parametrize("rendezvous", ["static", "c10d"])
def test_torchrun_restarts_a_crashed_worker_and_resumes(tiny_model_dir, nli_files, tmp_path, rendezvous):
    """Rank 1 exits mid-epoch on the first attempt; the agent restarts both ranks, which resume.

    The restarted ranks must not read the dead attempt's addresses from the agent's store
    (pytorch/pytorch#135712): without `join_restarted_job` about half of these restarts fail."""
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--num_train_epochs", "4", "--checkpointing_steps", "10")
    command = [
        *launcher(2, "--max_restarts", "1", "--rdzv_backend", rendezvous),
        "tests/probes/die_once.py",
        *args,
        "--resume_from_checkpoint",
        "auto",
    ]
    done = run_cli(command)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "died_once").exists()
    assert "resuming from" in done.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["world_size"] == 2 and results["global_step"] == 4 * 19


def test_rotation_keeps_the_newest_and_the_best(tiny_model_dir, nli_files, tmp_path):
    """Validation labels shifted by one: the better the model learns, the worse it scores, so the
    first epoch is the best one and must survive --save_total_limit 1."""
    shifted = tmp_path / "shifted.jsonl"
    rows = [json.loads(line) for line in nli_files["validation"].read_text().splitlines()]
    shifted.write_text("".join(json.dumps({**r, "label": (r["label"] + 1) % 3}) + "\n" for r in rows))
    out = tmp_path / "out"
    files = {**nli_files, "validation": shifted}
    rotation = ["--num_train_epochs", "4", "--checkpointing_steps", "epoch", "--save_total_limit", "1"]
    results = main(tiny_args(tiny_model_dir, files, out, *rotation))
    assert results["best_step"] == 38
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-152", "checkpoint-38"]
    best, at_38 = weights(out / "best_model"), weights(out / "checkpoint-38")
    assert all(torch.equal(best[name], at_38[name]) for name in at_38)
    state = json.loads((out / "checkpoint-152" / "trainer_state.json").read_text())
    assert (state["best_step"], state["best_metric"]) == (38, results["best_metric"])


class _Exploit:
    def __reduce__(self):
        return (os.system, (f"touch {Path.cwd() / 'pwned'}",))


def test_resume_refuses_a_checkpoint_that_would_run_code(tiny_model_dir, nli_files, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    main(tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "5", "--checkpointing_steps", "5"))
    (out / "checkpoint-5" / "random_states_0.pkl").write_bytes(pickle.dumps(_Exploit()))
    with pytest.raises(ConfigError, match="refusing to unpickle"):
        main(
            tiny_args(
                tiny_model_dir, nli_files, out, "--max_train_steps", "6", "--resume_from_checkpoint", "auto"
            )
        )
    assert not (tmp_path / "pwned").exists()

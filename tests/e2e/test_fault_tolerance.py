"""Runs that die (SIGKILL, SIGTERM, a crashed worker, a kill mid-write) and resume exactly.

Every kill comes from inside the run, at a chosen optimizer step (tests/probes/signal_at_step.py),
so each run loses the same steps and the resumed run has the same work left every time.
"""

import json
import os
import pickle
import re
import time
from pathlib import Path

import pytest
import torch

from finetune.errors import ConfigError
from finetune.mnli import main
from finetune.training.checkpoint import file_checksum
from tests.helpers import PYTHON, free_port, read_jsonl, reset_accelerate, run_cli, tiny_args, weights
from tests.warm_ranks import run_ranks, run_warm

BIN = os.path.dirname(PYTHON)
# 200 rows: 13 steps an epoch on 1 rank, 7 on 2 (neither divides them: the last batch is short), a loss
# line every 2 steps; evaluated and checkpointed every 8 steps on 1 rank, every 4 on 2.
EVERY = {1: 8, 2: 4}
ROWS = ["--max_train_samples", "200", "--logging_steps", "2"]
# Killed or stopped after the checkpoint at 16 (1 rank, mid-epoch 2) or 8 (2 ranks, mid-epoch 2) and
# after a logged line (18, 10) that the resumed run must replace.
STOP_AT = {1: 19, 2: 11}
# Early stopping on eval_loss with a threshold no change of it reaches: the first evaluation sets the
# best and each later one counts, so with patience 2 the runs stop early, after the kill: at the third
# evaluation, 24 of 26 steps (1 rank) or 12 of 14 (2 ranks). A resumed run must carry the count on from
# its checkpoint to stop there too.
STOPS_EARLY_AT = {1: 24, 2: 12}


def training_args(nproc: int) -> list[str]:
    every = str(EVERY[nproc])
    return [*ROWS, "--num_train_epochs", "2", "--checkpointing_steps", every, "--eval_strategy", "steps",
            "--eval_steps", every, "--metric_for_best_model", "eval_loss", "--early_stopping_threshold", "10",
            "--early_stopping_patience", "2"]  # fmt: skip


def launcher(nproc: int, *extra: str) -> list[str]:
    if nproc == 1:
        return [PYTHON]
    port = str(free_port())
    return [os.path.join(BIN, "torchrun"), "--nproc_per_node", str(nproc), "--master_port", port, *extra]


def job(nproc: int, script: str, args: list[str], env: dict | None = None):
    """`python script`, or its 2 ranks under `accelerate launch`, forked warm (tests/warm_ranks.py): these
    tests are about the run's checkpoints and resume; a launcher's own part is tested with the real one."""
    if nproc == 1:
        return run_warm(args, script=script, env=env)
    return run_ranks(args, script=script, env=env)


def signal_at(step: int, name: str, ranks: str = "0,1") -> dict:
    """The environment of tests/probes/signal_at_step.py: SIG`name` at `step`, sent by `ranks`."""
    return {"AT_STEP": str(step), "SIGNAL": name, "RANKS": ranks}


def resume(nproc: int, args: list[str], capsys) -> str:
    """The same command plus --resume_from_checkpoint auto; its stdout. One process runs in this one."""
    args = [*args, "--resume_from_checkpoint", "auto"]
    if nproc == 1:
        capsys.readouterr()
        main(args)
        return capsys.readouterr().out
    done = job(nproc, "finetune/mnli.py", args)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def step_losses(output_dir) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_jsonl(output_dir / "metrics.jsonl") if "loss" in r]


def checkpoints(output_dir) -> list[str]:
    return sorted((p.name for p in output_dir.glob("checkpoint-*")), key=lambda name: int(name.split("-")[1]))


def assert_bitwise_equal(a, b) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    differing = [name for name in wa if not torch.equal(wa[name], wb[name])]
    assert not differing, differing


@pytest.fixture(scope="module")
def unbroken(tiny_model_dir, nli_files, tmp_path_factory):
    """The reference for a world size: the same run, never interrupted (made once, on first use).

    One process runs in this one: the same bits as `python finetune/mnli.py`, without its start-up.
    """
    made = {}

    def reference(nproc: int):
        if nproc not in made:
            out = tmp_path_factory.mktemp(f"unbroken{nproc}") / "out"
            args = tiny_args(tiny_model_dir, nli_files, out, *training_args(nproc))
            if nproc == 1:
                main(args)
                reset_accelerate()
            else:
                done = job(nproc, "finetune/mnli.py", args)
                assert done.returncode == 0, done.stderr[-3000:]
            made[nproc] = out
        return made[nproc]

    return reference


WORLD_SIZES = pytest.mark.parametrize(
    "nproc",
    [pytest.param(1, marks=pytest.mark.subprocess), pytest.param(2, marks=pytest.mark.multiprocess)],
    ids=["1-process", "2-processes"],
)


@WORLD_SIZES
def test_sigkill_mid_epoch_then_auto_resume_is_bitwise_equal(
    nproc, unbroken, tiny_model_dir, nli_files, tmp_path, capsys
):
    reference = unbroken(nproc)
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, *training_args(nproc))
    at, saved = STOP_AT[nproc], STOP_AT[nproc] // EVERY[nproc] * EVERY[nproc]
    # Every rank kills itself at step `at`, as a lost machine takes them all.
    killed = job(nproc, "tests/probes/signal_at_step.py", args, env=signal_at(at, "KILL"))
    assert killed.returncode != 0 and not (out / "results.json").exists()
    assert checkpoints(out)[-1] == f"checkpoint-{saved}"
    assert step_losses(out)[-1][0] == at // 2 * 2 > saved  # logged after the checkpoint: to be replaced

    state = json.loads((out / f"checkpoint-{saved}" / "trainer_state.json").read_text())
    assert state["early_stopping_patience_counter"] == saved // EVERY[nproc] - 1  # evaluated, checkpointed

    stdout = resume(nproc, args, capsys)
    assert f"resuming from {out / f'checkpoint-{saved}'} at step {saved}" in stdout
    results = json.loads((out / "results.json").read_text())
    expected = json.loads((reference / "results.json").read_text())
    assert results["world_size"] == nproc
    stopped = STOPS_EARLY_AT[nproc]  # not later: the count went on from the checkpoint's
    assert (
        (results["stopped_early"], results["early_stopping_step"])
        == (True, stopped)
        == (
            expected["stopped_early"],
            expected["global_step"],
        )
    )
    assert (results["best_evaluation"], results["last_evaluation"]) == (
        expected["best_evaluation"],
        expected["last_evaluation"],
    )
    assert_bitwise_equal(out, reference)
    assert_bitwise_equal(out / "best_model", reference / "best_model")
    assert step_losses(out) == step_losses(reference)  # before the kill, and replayed after it


@pytest.mark.subprocess
def test_kill_while_writing_a_checkpoint_keeps_the_previous_one(
    unbroken, tiny_model_dir, nli_files, tmp_path, capsys
):
    reference = unbroken(1)  # one process is enough: the write is staged the same way for any world size
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, *training_args(1))
    crashed = job(1, "tests/probes/crash_in_checkpoint_write.py", args, env={"CRASH_IN_CHECKPOINT": "16"})
    assert crashed.returncode == 1
    assert (out / ".checkpoint-16.partial" / "model.safetensors").exists()  # the half-written one
    assert not (out / "checkpoint-16").exists() and (out / "checkpoint-8" / "trainer_state.json").exists()

    assert f"resuming from {out / 'checkpoint-8'} at step 8" in resume(1, args, capsys)
    assert_bitwise_equal(out, reference)
    assert not list(out.glob(".checkpoint-*.partial"))  # rewritten at step 16, then published


@WORLD_SIZES
def test_sigterm_checkpoints_exits_and_resumes_the_same_wandb_run(
    nproc, unbroken, tiny_model_dir, nli_files, tmp_path
):
    """Preemption: finish the step, save, exit 143 with one line; the relaunch continues exactly."""
    reference = unbroken(nproc)
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, *training_args(nproc))
    args[args.index("--report_to") + 1] = "wandb"
    env = {"HOME": str(tmp_path), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    at = STOP_AT[nproc]
    told = signal_at(at, "TERM", ranks="1" if nproc == 2 else "0")  # rank 0 must learn it from rank 1
    stopped = job(nproc, "tests/probes/signal_at_step.py", args, env={**env, **told})
    log = stopped.stdout + stopped.stderr
    said = f"stopped by SIGTERM after step {at}; checkpoint saved to {out / f'checkpoint-{at}'};"
    lines = [line for line in re.split(r"[\r\n]", log) if line.startswith("stopped by")]
    assert len(lines) == 1 and lines[0].startswith(said), log[-3000:]  # one line, from rank 0
    assert "Traceback" not in log  # every rank exits 143; a launcher reports that as a failure (1)
    assert stopped.returncode == 143 if nproc == 1 else stopped.rank_returncodes == [143, 143]
    assert (out / f"checkpoint-{at}" / "trainer_state.json").exists()
    assert not (out / "results.json").exists()

    before_s = json.loads((out / f"checkpoint-{at}" / "trainer_state.json").read_text())["train_runtime_s"]

    done = job(nproc, "finetune/mnli.py", [*args, "--resume_from_checkpoint", "auto"], env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_bitwise_equal(out, reference)
    # Stopped mid log window (lines every 2 steps): the resumed run's lines and totals are the unbroken
    # run's (2 ranks sum the window's loss in another order: equal to rounding).
    losses, expected_losses = step_losses(out), step_losses(reference)
    assert [s for s, _ in losses] == [s for s, _ in expected_losses]
    assert [x for _, x in losses] == pytest.approx([x for _, x in expected_losses], rel=1e-6, abs=0)
    results = json.loads((out / "results.json").read_text())
    expected = json.loads((reference / "results.json").read_text())
    assert results["train_samples"] == expected["train_samples"]
    assert 0 < before_s < results["train_runtime_s"]  # both segments' training seconds
    runs = sorted(p.name for p in (out / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and len({name.rsplit("-", 1)[1] for name in runs}) == 1  # one W&B run id


@pytest.mark.multiprocess
def test_a_restarted_job_stopped_at_its_launcher_resumes_exactly(
    unbroken, tiny_model_dir, nli_files, tmp_path, capsys
):
    """`accelerate launch --max_restarts 1` (static rendezvous, its CPU config). On the first attempt rank 1
    raises mid-epoch 1 while rank 0 goes on into the next all-reduce: the agent ends the attempt (rank 0
    is not left waiting there), the error reaches the terminal, and both ranks restart from checkpoint-4.
    In the restarted attempt, `kill <accelerate launch's pid>` (a user, a scheduler): the launcher forwards
    SIGTERM to the workers, which finish their step, save one checkpoint and exit; the relaunch continues
    exactly, to the bits of a run never interrupted.

    The restarted ranks must not read the dead attempt's addresses from the agent's store
    (pytorch/pytorch#135712): without `join_restarted_job` about half of these restarts fail."""
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, *training_args(2))
    config = "accelerate_configs/cpu_multiprocess.yaml"
    accelerate = [os.path.join(BIN, "accelerate"), "launch", "--config_file", config, "--max_restarts", "1",
                  "--main_process_port", str(free_port())]  # fmt: skip
    # The launcher forwards its SIGTERM a few steps later or so: 3 steps before the early stop at 12.
    faults = {"RANK_TO_FAIL": "1", "AT": "6", "STOP_AT": "9"}
    started = time.monotonic()
    stopped = run_cli([*accelerate, "tests/probes/fail_then_stop.py", *args, "--resume_from_checkpoint",
                       "auto"], env=faults)  # fmt: skip
    # run_cli returned, so no worker holds its output pipes any more: every worker has exited.
    assert time.monotonic() - started < 180  # no wait for the process group's timeout
    log = stopped.stdout + stopped.stderr
    assert "injected failure on rank 1 at step 6" in stopped.stderr, log[-3000:]
    assert f"resuming from {out / 'checkpoint-4'} at step 4" in stopped.stdout  # only a restart resumes
    lines = [line for line in re.split(r"[\r\n]", log) if line.startswith("stopped by SIGTERM after step ")]
    assert stopped.returncode != 0 and len(lines) == 1, log[-3000:]
    step = int(lines[0].split()[5].rstrip(";"))
    assert (out / f"checkpoint-{step}" / "trainer_state.json").exists() and not (
        out / "results.json"
    ).exists()
    state = json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())
    assert state["identity"]["world_size"] == 2  # the restarted attempt's two real ranks
    resume(2, args, capsys)
    assert_bitwise_equal(out, unbroken(2))


@pytest.mark.multiprocess
def test_torchrun_restarts_a_killed_worker_and_resumes(tiny_model_dir, nli_files, tmp_path):
    """torchrun --max_restarts 1 under c10d rendezvous (the restart above is static's): rank 1 is SIGKILLed
    mid-epoch on the first attempt (the kernel's OOM killer: no Python runs); the agent restarts both
    ranks, which resume from their checkpoint."""
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, *ROWS, "--checkpointing_steps", "4")  # 1 epoch: 7 steps
    restarts = launcher(2, "--max_restarts", "1", "--rdzv_backend", "c10d")
    command = [*restarts, "tests/probes/signal_at_step.py", *args, "--resume_from_checkpoint", "auto"]
    done = run_cli(command, env=signal_at(6, "KILL", ranks="1"))  # on the first attempt only
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming from {out / 'checkpoint-4'} at step 4" in done.stdout  # only a restart resumes
    results = json.loads((out / "results.json").read_text())
    assert results["world_size"] == 2 and results["global_step"] == 7


def test_rotation_keeps_the_newest_and_the_best(tiny_model_dir, nli_files, tmp_path):
    """Validation labels shifted by one: the better the model learns, the worse it scores, so the
    first epoch is the best one and must survive --save_total_limit 1 (the second one must not)."""
    shifted = tmp_path / "shifted.jsonl"
    rows = [json.loads(line) for line in nli_files["validation"].read_text().splitlines()]
    shifted.write_text("".join(json.dumps({**r, "label": (r["label"] + 1) % 3}) + "\n" for r in rows))
    out = tmp_path / "out"
    files = {**nli_files, "validation": shifted}
    rotation = ["--num_train_epochs", "3", "--checkpointing_steps", "epoch", "--save_total_limit", "1"]
    results = main(tiny_args(tiny_model_dir, files, out, *rotation))
    assert results["best_step"] == 38
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-114", "checkpoint-38"]
    best, at_38 = weights(out / "best_model"), weights(out / "checkpoint-38")
    assert all(torch.equal(best[name], at_38[name]) for name in at_38)
    state = json.loads((out / "checkpoint-114" / "trainer_state.json").read_text())
    assert (state["best_step"], state["best_metric"]) == (38, results["best_metric"])


class _Exploit:
    def __reduce__(self):
        return (os.system, (f"touch {Path.cwd() / 'pwned'}",))


def test_resume_refuses_a_checkpoint_that_would_run_code(tiny_model_dir, nli_files, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    main(tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "5", "--checkpointing_steps", "5"))
    state = out / "checkpoint-5" / "random_states_0.pkl"
    exploit = pickle.dumps(_Exploit())  # padded to the size it replaces: a size check cannot tell
    state.write_bytes(exploit.ljust(state.stat().st_size, b"\0"))
    # A crafted checkpoint comes with a manifest that matches it: the checksum cannot tell either.
    manifest = out / "checkpoint-5" / "manifest.json"
    listed = json.loads(manifest.read_text())
    listed[state.name]["crc32"] = file_checksum(state)
    manifest.write_text(json.dumps(listed))
    with pytest.raises(ConfigError, match="refusing to unpickle"):
        main(
            tiny_args(
                tiny_model_dir, nli_files, out, "--max_train_steps", "6", "--resume_from_checkpoint", "auto"
            )
        )
    assert not (tmp_path / "pwned").exists()


def test_a_stop_signal_while_a_finished_run_closes_leaves_it_complete(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    """SIGTERM in the second after results.json, while the trackers and the process group close, cut
    the closing short ("Exception ignored ... Stopped", or exit 143 saying the run did not finish). Now
    the closing completes, one note says the run is complete, exit 0, and a relaunch reads it back; a
    second signal stops a closing that would hang. Predicting with the finished run keeps its
    predictions however the signal falls."""
    import signal

    from finetune.cli import cli
    from finetune.run import setup

    def signalled_while_closing(times: int):
        def build(*launch):
            run = setup(*launch)
            end_training = run.accelerator.end_training

            def signals_then_end():
                for _ in range(times):
                    os.kill(os.getpid(), signal.SIGTERM)  # handled at once, in this main thread
                end_training()

            run.accelerator.end_training = signals_then_end
            return run

        return build

    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "3")
    assert cli(args, signalled_while_closing(1)) == 0
    err = capsys.readouterr().err
    assert "note: SIGTERM arrived as the finished run closed" in err and "did not finish" not in err
    assert not (out / ".finetune.lock").exists()
    reset_accelerate()
    results = json.loads((out / "results.json").read_text())
    assert main([*args, "--resume_from_checkpoint", "auto"]) == results
    reset_accelerate()

    predict = [
        *args,
        "--resume_from_checkpoint",
        "auto",
        "--do_predict",
        "--test_file",
        str(nli_files["validation"]),
    ]
    assert cli(predict, signalled_while_closing(1)) == 0
    assert "note: SIGTERM arrived as the finished run closed" in capsys.readouterr().err
    assert len(read_jsonl(out / "predictions.jsonl")) == json.loads((out / "results.json").read_text())[
        "predict_samples"
    ] > 0 and not (out / ".predicting").exists()  # fmt: skip
    reset_accelerate()

    twice = tmp_path / "twice"
    assert (
        cli(tiny_args(tiny_model_dir, nli_files, twice, "--max_train_steps", "3"), signalled_while_closing(2))
        == 0
    )
    assert "note: SIGTERM arrived" in capsys.readouterr().err and (twice / "results.json").is_file()


@pytest.mark.parametrize("at", ["the export", "its checkpoint"])
def test_sigterm_during_the_export_of_a_run_without_checkpoints_loses_no_training(
    at, tiny_model_dir, nli_files, tmp_path, capsys
):
    """SIGTERM while the model is exported, in a run that asked for no checkpoints: the root held a
    config.json and no weights, and the relaunch trained again from step 0. Now the run first writes a
    checkpoint of its last step for the export (a signal while it is written stops the run once it is
    published): the relaunch with --resume_from_checkpoint auto trains nothing, exports the same weights
    and writes the same lines as a run never stopped, and leaves no checkpoint behind."""
    import signal

    from finetune.cli import cli
    from finetune.run import setup

    out = tmp_path / "out"

    def sigterm_at(*launch):
        run = setup(*launch)
        model = run.accelerator.unwrap_model(run.model)
        save_pretrained, save_state = model.save_pretrained, run.accelerator.save_state

        def export_stopped_midway(folder, *args, **kwargs):
            if Path(folder) == out:  # the export, not best_model/: config.json first, then the signal
                model.config.save_pretrained(folder)
                os.kill(os.getpid(), signal.SIGTERM)
            return save_pretrained(folder, *args, **kwargs)

        def signalled_while_saving(*args, **kwargs):  # the only checkpoint of the run
            os.kill(os.getpid(), signal.SIGTERM)
            return save_state(*args, **kwargs)

        if at == "the export":
            model.save_pretrained = export_stopped_midway
        else:
            run.accelerator.save_state = signalled_while_saving
        return run

    unbroken = tmp_path / "unbroken"
    main(tiny_args(tiny_model_dir, nli_files, unbroken, "--max_train_steps", "7"))
    reset_accelerate()
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "7")
    capsys.readouterr()
    assert cli(args, sigterm_at) == 143
    export = at == "the export"
    said = "stopped by SIGTERM; the run did not finish" if export else "stopped by SIGTERM after step 7"
    assert said in capsys.readouterr().err
    assert (out / "config.json").is_file() == export and not (out / "model.safetensors").exists()
    assert not (out / "results.json").exists()
    reset_accelerate()

    results = main([*args, "--resume_from_checkpoint", "auto"])
    assert f"resuming from {out / 'checkpoint-7'} at step 7" in capsys.readouterr().out  # nothing retrained
    assert results["global_step"] == 7 and (out / "results.json").is_file()
    untimed = [  # each line once, as in the unbroken run (its clock's figures aside)
        [{k: v for k, v in line.items() if not k.endswith(("_per_second", "_runtime_s"))} for line in lines]
        for lines in (read_jsonl(out / "metrics.jsonl"), read_jsonl(unbroken / "metrics.jsonl"))
    ]
    assert untimed[0] == untimed[1] and len(untimed[0]) == 3  # steps 5 and 7, then 7's evaluation
    assert_bitwise_equal(out, unbroken)
    assert checkpoints(out) == checkpoints(unbroken) == []  # the export's checkpoint is gone once finished
    expected = json.loads((unbroken / "results.json").read_text())
    assert results["train_samples"] == expected["train_samples"]
    assert results["best_evaluation"] == expected["best_evaluation"]


def finetune_launch(*script_and_args: str) -> list[str]:
    """`python -m finetune.launch` (accelerate launch's options) with the 2-process CPU config."""
    config = "accelerate_configs/cpu_multiprocess.yaml"
    return [PYTHON, "-m", "finetune.launch", "--config_file", config, "--main_process_port", str(free_port()),
            *script_and_args]  # fmt: skip


@pytest.mark.multiprocess
def test_a_launch_stopped_by_sigterm_exits_143_without_a_traceback(tiny_model_dir, nli_files, tmp_path):
    """SIGTERM during step 3 to rank 1 and, from rank 0, to the launcher (which forwards it): both ranks
    checkpoint step 3 and exit 143, and the launch exits 143 too, with no traceback, so a scheduler that
    requeues on 143 does. `accelerate launch` exits 1 here with torch elastic's ChildFailedError (every
    non-zero exit of a worker is a failure to its agent).

    One launch for the two targets (each took a launch of its own): a launch ended by its ranks' 143
    alone, the launcher not signalled, is asserted with real workers by
    test_only_ranks_stopped_by_a_signal_make_the_launch_exit_their_code[143,143-143] (rank 1 exits first,
    rank 0 is ended by the agent's SIGTERM); a stop rank 0 learns from rank 1 alone, by
    test_sigterm_checkpoints_exits_and_resumes_the_same_wandb_run[2-processes]; the launcher's forward
    alone stopping the workers, by test_a_restarted_job_stopped_at_its_launcher_resumes_exactly."""
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "8", "--checkpointing_steps", "50")
    told = {**signal_at(3, "TERM"), "TO_LAUNCHER": "0"}
    stopped = run_cli(finetune_launch("tests/probes/signal_at_step.py", *args), env=told)
    log = stopped.stdout + stopped.stderr
    assert stopped.returncode == 143 and "Traceback" not in log, log[-3000:]
    lines = [line for line in re.split(r"[\r\n]", log) if line.startswith("stopped by SIGTERM after step ")]
    # Rank 1 is signalled during step 3, the launcher too, which forwards it a step later or so: every
    # rank stops at the step they agree on, the first one signalled, the same on both.
    assert len(lines) == 1, log[-3000:]
    assert lines[0].startswith("stopped by SIGTERM after step 3; checkpoint saved to "), lines
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["identity"]["world_size"] == 2  # two real ranks stopped together
    assert not (out / "results.json").exists()


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("codes", "expected"),
    [("143,143", 143), ("130,130", 130), ("143,1", 1), ("0,1", 1)],
)
def test_only_ranks_stopped_by_a_signal_make_the_launch_exit_their_code(codes, expected):
    """Real workers, exits decided: a rank that failed (1) first is still the launch's failure, reported
    by torch elastic as accelerate launch reports it; only stopped ranks (143, 130) give their code."""
    done = run_cli(finetune_launch("tests/probes/exit_codes.py"), env={"CODES": codes, "DELAY_S": "1"})
    assert done.returncode == expected, done.stderr[-3000:]
    assert ("ChildFailedError" in done.stderr) == (expected == 1)

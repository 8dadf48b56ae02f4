"""Killed while writing a checkpoint, again and again: every relaunch with `auto` finds only complete
checkpoints, and the run that finally finishes holds the weights of a run never interrupted."""

import pytest
import torch

from finetune.mnli import main
from tests.helpers import PYTHON, reset_accelerate, run_cli, tiny_args, weights

FLAGS = ["--max_train_steps", "12", "--checkpointing_steps", "2", "--logging_steps", "2"]


@pytest.mark.subprocess
def test_five_kills_during_checkpoint_writes_then_bitwise_equal(tiny_model_dir, nli_files, tmp_path):
    unbroken = tmp_path / "unbroken"
    main(tiny_args(tiny_model_dir, nli_files, unbroken, *FLAGS))
    reset_accelerate()

    out = tmp_path / "out"
    args = [*tiny_args(tiny_model_dir, nli_files, out, *FLAGS), "--resume_from_checkpoint", "auto"]
    # Each relaunch resumes from the checkpoint before the one its predecessor died writing, and dies
    # writing the next: the process exits halfway through the weights file (as a SIGKILL would).
    for kill, step in enumerate((4, 6, 8, 10, 12), start=1):
        done = run_cli([PYTHON, "tests/probes/crash_in_checkpoint_write.py", *args],
                       env={"CRASH_IN_CHECKPOINT": str(step)})  # fmt: skip
        assert done.returncode == 1, f"kill {kill}: {done.stderr[-2000:]}"
        assert (out / f".checkpoint-{step}.partial").is_dir() and not (out / f"checkpoint-{step}").exists()
        assert (out / f"checkpoint-{step - 2}" / "trainer_state.json").is_file()
        if kill > 1:
            assert f"resuming from {out / f'checkpoint-{step - 4}'}" in done.stdout

    results = main(args)
    assert results["global_step"] == 12
    a, b = weights(unbroken), weights(out)
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert not list(out.glob(".checkpoint-*.partial"))

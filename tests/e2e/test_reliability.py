"""Killed while writing a checkpoint, again and again: every relaunch with `auto` finds only complete
checkpoints, and the run that finally finishes holds the weights of a run never interrupted.

Each death is a `Died` raised from accelerate's save-state hook after half the weights file is
written: the folder is left exactly as a kill at that moment leaves it (tests/test_fault_tolerance.py
kills a real process the same way), and nothing of the run's own error handling sees it.
"""

from pathlib import Path

import pytest
import torch

from finetune.mnli import main
from finetune.run import setup
from tests.helpers import reset_accelerate, tiny_args, weights

FLAGS = ["--max_train_steps", "12", "--checkpointing_steps", "2", "--logging_steps", "2"]


class Died(BaseException):
    """Not an Exception: no handler of the run's may catch it, as none can catch SIGKILL."""


def dies_writing(step: int):
    def build(*launch):
        run = setup(*launch)

        def half_a_weights_file(models, weights, output_dir):
            if Path(output_dir).name == f".checkpoint-{step}.partial":
                Path(output_dir, "model.safetensors").write_bytes(b"\x00" * 1000)
                raise Died

        run.accelerator.register_save_state_pre_hook(half_a_weights_file)
        return run

    return build


def test_five_deaths_during_checkpoint_writes_then_bitwise_equal(tiny_model_dir, nli_files, tmp_path, capsys):
    unbroken = tmp_path / "unbroken"
    main(tiny_args(tiny_model_dir, nli_files, unbroken, *FLAGS))
    reset_accelerate()

    out = tmp_path / "out"
    args = [*tiny_args(tiny_model_dir, nli_files, out, *FLAGS), "--resume_from_checkpoint", "auto"]
    # Each relaunch resumes from the checkpoint before the one its predecessor died writing, and dies
    # writing the next.
    for death, step in enumerate((4, 6, 8, 10, 12), start=1):
        capsys.readouterr()
        with pytest.raises(Died):
            main(args, dies_writing(step))
        reset_accelerate()
        assert (out / f".checkpoint-{step}.partial").is_dir() and not (out / f"checkpoint-{step}").exists()
        assert (out / f"checkpoint-{step - 2}" / "trainer_state.json").is_file()
        if death > 1:
            assert f"resuming from {out / f'checkpoint-{step - 4}'}" in capsys.readouterr().out

    results = main(args)
    assert results["global_step"] == 12
    a, b = weights(unbroken), weights(out)
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert not list(out.glob(".checkpoint-*.partial"))

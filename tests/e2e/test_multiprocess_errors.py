"""Errors on the ranks of a job, said where the user reads them, once. (An error on one rank of two
ending the attempt promptly: the restart under `accelerate launch` in tests/e2e/test_fault_tolerance.py.)"""

import pytest

from tests.helpers import PYTHON, run_cli, tiny_args
from tests.warm_ranks import run_ranks

pytestmark = pytest.mark.multiprocess


def test_a_full_disk_on_two_ranks_is_one_line(tiny_model_dir, nli_files, tmp_path):
    """A checkpoint write that fails on every rank (RLIMIT_FSIZE, as a full disk): finetune's one
    line, and no traceback from finetune's code."""
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "4", "--checkpointing_steps", "2")
    done = run_ranks(args, timeout=240, file_size_limit_kib=6000)
    assert done.returncode != 0
    errors = [
        line for line in done.stderr.splitlines() if line.startswith("error: writing checkpoint-2 failed")
    ]
    assert errors, done.stderr[-3000:]
    assert "is the disk full?" in errors[0]
    frames = [line for line in done.stderr.splitlines() if line.strip().startswith("File ")]
    assert not [f for f in frames if "/finetune/" in f], done.stderr[-3000:]


def test_an_error_every_rank_meets_is_said_once(tiny_model_dir, nli_files, tmp_path):
    """Both ranks read the same bad file and fail the same way: one line, not one per rank."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"premise": "a", "hypothesis": "b", "label": "maybe"}\n' * 4)
    args = tiny_args(tiny_model_dir, {**nli_files, "train": bad}, tmp_path / "out")
    done = run_ranks(args, timeout=240)
    assert done.returncode != 0
    said = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(said) == 1 and "label value(s) 'maybe'" in said[0], done.stderr[-3000:]


def test_a_failed_one_process_launch_exits_with_its_code_and_one_line(tiny_model_dir, nli_files, tmp_path):
    """`python -m finetune.launch --num_processes 2` without a config: accelerate's simple launcher starts
    one process, which refuses in one line and exits 2; the launch exits 2 too, with no traceback, where
    `accelerate launch` adds its CalledProcessError traceback and exits 1 (tests/e2e/test_first_hour.py)."""
    out = tmp_path / "out"
    command = [PYTHON, "-m", "finetune.launch", "--num_processes", "2", "finetune/mnli.py"]
    done = run_cli(
        [*command, *tiny_args(tiny_model_dir, nli_files, out)], env={"HF_HOME": str(tmp_path / "hf")}
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "asked for 2 processes but started 1" in errors[0], done.stderr[-2000:]
    assert not out.exists()

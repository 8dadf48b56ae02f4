"""Errors on one rank of two end the whole job, promptly, with the error where the user reads it."""

import os
import time

import pytest

from tests.helpers import PYTHON, free_port, run_cli, tiny_args
from tests.warm_ranks import run_ranks

pytestmark = pytest.mark.multiprocess
TORCHRUN = [os.path.join(os.path.dirname(PYTHON), "torchrun"), "--nproc_per_node", "2"]


def test_an_exception_on_one_rank_ends_the_job(tiny_model_dir, nli_files, tmp_path):
    """Rank 1 raises at step 5 while rank 0 waits in the next all-reduce: the launcher must end the
    job with the error, not leave rank 0 waiting forever (the call's timeout would fail this test)."""
    out = tmp_path / "out"
    command = [*TORCHRUN, "--master_port", str(free_port()), "tests/probes/raise_on_rank.py",
               *tiny_args(tiny_model_dir, nli_files, out)]  # fmt: skip
    started = time.monotonic()
    done = run_cli(command, env={"RANK_TO_FAIL": "1", "AT": "5"}, timeout=240)
    assert done.returncode != 0
    assert time.monotonic() - started < 180
    assert "injected failure on rank 1 at step 5" in done.stderr
    assert not (out / "results.json").exists()


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

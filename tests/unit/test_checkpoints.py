"""Pieces of checkpoint trust without a run: the output folder's lock (the model's identity:
tests/unit/test_identity.py).

Resumes and refusals of real runs: tests/e2e/test_checkpoints.py."""

from finetune.output.lock import take_lock
from tests.helpers import snapshot


def test_only_rank_0_takes_the_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    take_lock(tmp_path)
    assert snapshot(tmp_path) == {}

"""Pieces of checkpoint trust without a run: the output folder's lock, the model's identity.

Resumes and refusals of real runs: tests/e2e/test_checkpoints.py."""

from finetune.lock import take_lock
from tests.e2e.test_bad_input import snapshot


def test_only_rank_0_takes_the_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    take_lock(tmp_path)
    assert snapshot(tmp_path) == {}


def test_a_model_named_by_another_path_is_the_same_model(tiny_model_dir, monkeypatch):
    from finetune.checkpoint import same_model

    monkeypatch.chdir(tiny_model_dir.parent)
    shapes = " (999 parameters, shapes 0123456789ab)"
    assert same_model(f"{tiny_model_dir}{shapes}", f"{tiny_model_dir.name}{shapes}")
    assert not same_model(f"{tiny_model_dir}{shapes}", f"{tiny_model_dir}{shapes.replace('0123', '9999')}")
    assert not same_model(f"elsewhere{shapes}", f"{tiny_model_dir.name}{shapes}")

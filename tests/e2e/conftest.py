"""Fixtures of the e2e tier only: finished runs that several tests read, made once per session."""

from __future__ import annotations

import contextlib
import os

import pytest

import tests.frozen_imports  # noqa: F401  (imports, then gc.freeze(): collections skip them)
from tests.helpers import SHARED_MNLI, minilm_dir, reset_accelerate

# x 32 pairs at 1.5e-4: MiniLM well past chance (0.557 on 3,000 rows, AMX Xeon; 200 steps at 1e-4 0.580,
# 150 at 1e-4 0.532, 100 at 2e-4 0.507), in 40 s instead of 53.
MINILM_STEPS = 150


@contextlib.contextmanager
def every_core():
    """A real model's step gains from every core (tests otherwise run one thread: conftest.py)."""
    import torch

    threads = torch.get_num_threads()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # another worker shares the cores: no more threads
        yield
        return
    torch.set_num_threads(os.cpu_count())
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def minilm_args(output_dir, *extra: str) -> list[str]:
    """Pretrained MiniLM on the shared real MNLI rows: MINILM_STEPS steps x 32, evaluated on the
    matched rows, a training line every 50 steps."""
    return [
        "--model_name_or_path", str(minilm_dir()),
        "--train_file", str(SHARED_MNLI / "train.jsonl"),
        "--validation_file", str(SHARED_MNLI / "validation_matched.jsonl"),
        "--output_dir", str(output_dir),
        "--max_train_steps", str(MINILM_STEPS),
        "--per_device_train_batch_size", "32",
        "--logging_steps", "50",
        "--report_to", "none",
        *extra,
    ]  # fmt: skip


@pytest.fixture(scope="session")
def minilm_full(tmp_path_factory):
    """One full fine-tuning of MiniLM (`minilm_args`, learning rate 1.5e-4): (output_dir, results).
    Read by test_minilm_mnli and, as the baseline LoRA is measured against, by test_lora."""
    if not SHARED_MNLI.is_dir():
        pytest.skip("needs ../shared/data/mnli beside the checkout")
    from finetune.mnli import main

    out = tmp_path_factory.mktemp("minilm") / "full"
    with every_core():
        # 3,000 of the 9,815 matched rows: the accuracy to about ±0.01 (one standard error).
        results = main(minilm_args(out, "--learning_rate", "1.5e-4", "--max_eval_samples", "3000"))
    reset_accelerate()
    return out, results


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real 2-node Slurm cluster on this machine (tests/e2e/slurm_cluster.py), stopped at the end.

    Skipped with one line where it cannot run (not root, not installed); in CI (CI_REQUIRE_SLURM=1)
    that is a failure, so a broken install cannot pass as skipped tests."""
    from tests.e2e.slurm_cluster import ENABLE, SlurmCluster, missing

    why = missing()
    if why:
        if os.environ.get("CI_REQUIRE_SLURM") == "1":
            pytest.fail(f"CI_REQUIRE_SLURM=1 but {why}. {ENABLE}")
        pytest.skip(f"{ENABLE} ({why})")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def wandb_env(monkeypatch, tmp_path):
    """No W&B login on this machine, whatever its user has: no key, no ~/.netrc, W&B's mode unset."""
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc key
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    return monkeypatch

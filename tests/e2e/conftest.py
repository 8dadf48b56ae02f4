"""Fixtures of the e2e tier only: finished runs that several tests read, made once per session."""

from __future__ import annotations

import os

import pytest

import tests.frozen_imports  # noqa: F401  (imports, then gc.freeze(): collections skip them)
from tests.e2e import idle_runs


@pytest.fixture(scope="session")
def minilm_full(tmp_path_factory):
    """Full fine-tuning of the packaged MiniLM on the shared real MNLI rows, an idle run
    (tests/e2e/idle_runs.py): (output_dir, results)."""
    return idle_runs.finished("minilm_full", tmp_path_factory)


@pytest.fixture(scope="session")
def minilm_lora(tmp_path_factory):
    """LoRA on the packaged MiniLM with generated NLI pairs, an idle run: (output_dir, results)."""
    return idle_runs.finished("minilm_lora", tmp_path_factory)


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

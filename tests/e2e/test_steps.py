"""A run of fractional epochs stops where the plan says. The plan alone: tests/unit/test_steps.py."""

import json

from finetune.mnli import main
from tests.helpers import tiny_args


def test_a_run_of_fractional_epochs_stops_at_the_planned_step(tiny_model_dir, nli_files, tmp_path):
    """600 rows, 16 a micro-batch, 2 per update: 38 micro-batches, 19 updates an epoch; 1.5 epochs
    is ceil(28.5) = 29 updates, 10 of them (20 micro-batches) in the second epoch."""
    out = tmp_path / "out"
    extra = ("--num_train_epochs", "1.5", "--gradient_accumulation_steps", "2", "--logging_steps", "1")
    results = main(tiny_args(tiny_model_dir, nli_files, out, *extra))
    assert results["global_step"] == 29
    plan = json.loads((out / "train_config.json").read_text())["plan"]
    assert (plan["updates_per_epoch"], plan["total_updates"], plan["num_epochs"]) == (19, 29, 2)
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in logged if "loss" in r]
    assert [r["step"] for r in trained] == list(range(1, 30))  # every update once, none past 29
    assert trained[-1]["epoch"] == round(1 + 20 / 38, 4)
    assert "--num_train_epochs 1.5" in (out / "README.md").read_text()

"""--calibrate temperature end to end: an overconfident tiny BERT (64 rows, 20 epochs) is calibrated on
its validation rows (the task is MNLI: eval_matched_* keys); the exported model keeps every prediction
and gives softmax(logits / T).

The metrics, the fit and the baking alone: tests/unit/test_calibration.py."""

from __future__ import annotations

import json

import pytest
import torch

from finetune.mnli import main
from tests.helpers import read_jsonl, reset_accelerate, tiny_args

OVERFIT = [
    "--max_train_samples", "64", "--num_train_epochs", "20", "--learning_rate", "5e-3",
    "--eval_strategy", "steps", "--eval_steps", "80", "--do_predict",
]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tiny_model_dir, nli_files, tmp_path_factory):
    """The same overfitting run without and with --calibrate temperature: {name: (output_dir, results)}."""
    found = {}
    for name, extra in (("plain", []), ("calibrated", ["--calibrate", "temperature"])):
        output_dir = tmp_path_factory.mktemp(name) / "out"
        test_file = ["--test_file", str(nli_files["validation"])]
        found[name] = (
            output_dir,
            main(tiny_args(tiny_model_dir, nli_files, output_dir, *OVERFIT, *test_file, *extra)),
        )
        reset_accelerate()
    return found


def test_calibration_lowers_ece_and_keeps_every_prediction(runs):
    (plain_dir, plain), (out, calibrated) = runs["plain"], runs["calibrated"]
    temperature = calibrated["calibration_temperature"]
    assert temperature > 1  # the memorizing model was overconfident
    assert (
        calibrated["eval_matched_ece_after_calibration"] < calibrated["eval_matched_ece_before_calibration"]
    )
    assert (
        calibrated["eval_matched_nll_after_calibration"] < calibrated["eval_matched_nll_before_calibration"]
    )
    assert calibrated["eval_matched_ece_before_calibration"] == pytest.approx(
        plain["eval_matched_ece"], abs=1e-6
    )
    assert calibrated["eval_matched_accuracy"] == plain["eval_matched_accuracy"]
    assert json.loads((out / "results.json").read_text())["calibration_temperature"] == temperature
    before, after = read_jsonl(plain_dir / "predictions.jsonl"), read_jsonl(out / "predictions.jsonl")
    assert [p["label"] for p in after] == [p["label"] for p in before]
    assert max(max(p["probabilities"].values()) for p in after) < max(
        max(p["probabilities"].values()) for p in before
    )
    assert (out / "reliability_diagram.png").stat().st_size > 0
    assert f"T = {temperature:.4f}" in (out / "README.md").read_text()
    recorded = json.loads((out / "train_config.json").read_text())
    assert recorded["identity"]["calibrate"] == "temperature"
    assert "calibration_temperature" not in plain and plain["eval_matched_brier"] > 0  # MNLI's key names


def test_the_pipeline_gives_softmax_of_the_logits_divided_by_t(runs, nli_files):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    (plain_dir, _), (out, calibrated) = runs["plain"], runs["calibrated"]
    rows = read_jsonl(nli_files["validation"])[:8]
    pairs = [{"text": r["premise"], "text_pair": r["hypothesis"]} for r in rows]
    classify = pipeline("text-classification", model=str(out), top_k=None, device="cpu")
    scores = classify(pairs)
    tokenizer = AutoTokenizer.from_pretrained(plain_dir)
    model = AutoModelForSequenceClassification.from_pretrained(plain_dir).eval()
    encoded = tokenizer(
        [r["premise"] for r in rows], [r["hypothesis"] for r in rows], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        expected = (model(**encoded).logits / calibrated["calibration_temperature"]).softmax(dim=-1)
    label = model.config.label2id
    got = torch.tensor(
        [[next(s["score"] for s in row if label[s["label"]] == k) for k in range(3)] for row in scores]
    )
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.multiprocess
def test_two_processes_fit_the_temperature_of_every_row_and_bake_it_on_both(
    tiny_model_dir, nli_files, tmp_path
):
    """2 ranks: the T baked on both (identical replicas) is the T one process fits on the same model's
    logits of every validation row (151: the ranks' padding rows dropped)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from finetune.metrics.calibration import fit_temperature
    from tests.e2e.test_distributed import two_process

    out = tmp_path / "out"
    flags = [*OVERFIT[:-1], "--num_train_epochs", "5", "--calibrate", "temperature"]  # no --do_predict
    two_process(tiny_args(tiny_model_dir, nli_files, out, *flags))
    results = json.loads((out / "results.json").read_text())
    assert results["world_size"] == 2 and results["replicas_identical"] is True
    assert results["eval_matched_samples"] == 151
    rows = read_jsonl(nli_files["validation"])
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    encoded = tokenizer(
        [r["premise"] for r in rows], [r["hypothesis"] for r in rows],
        truncation=True, max_length=64, padding=True, return_tensors="pt",
    )  # fmt: skip
    temperature = results["calibration_temperature"]
    with torch.no_grad():
        before = model(**encoded).logits * temperature  # the model before baking
    labels = torch.tensor([r["label"] for r in rows])
    assert fit_temperature(before, labels) == pytest.approx(temperature, rel=1e-3)

"""--calibrate temperature end to end: an overconfident tiny BERT (64 rows, 20 epochs) is calibrated on
its validation rows (the task is MNLI: eval_matched_* keys); the exported model keeps every prediction
and gives softmax(logits / T). Multi-label: one T for every label's sigmoid, every label kept.

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


def noisy_tagged_files(folder) -> dict:
    """tests/e2e/test_multilabel.py's tagged rows (64 to train, 120 to validate), each tag flipped 15% of
    the time: a model that memorizes them is confidently wrong on some."""
    import random

    from tests.e2e.test_multilabel import TAGS, tagged_row

    rng = random.Random(0)
    files = {}
    for split, n in (("train", 64), ("validation", 120)):
        rows = [tagged_row(rng) for _ in range(n)]
        noisy = [[tag for tag in TAGS if (tag in tags) != (rng.random() < 0.15)] for _, tags in rows]
        files[split] = folder / f"{split}.jsonl"
        lines = [
            json.dumps({"text": text, "tags": tags}) for (text, _), tags in zip(rows, noisy, strict=True)
        ]
        files[split].write_text("\n".join(lines) + "\n")
    return files


def test_multi_label_calibration_lowers_ece_and_keeps_every_label(tiny_model_dir, tmp_path):
    """One T for every label, on a tiny BERT memorizing noisy tags: the mean ECE goes down; predictions.jsonl
    and `pipeline` give sigmoid(z / T) of the model before baking (z = the exported logits x T), so every
    label at 0.5 stays as the uncalibrated model gave it."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    files, out = noisy_tagged_files(tmp_path), tmp_path / "out"
    flags = ["--task_name", "custom", "--text_columns", "text", "--label_column", "tags", "--do_predict"]
    flags += ["--test_file", str(files["validation"]), "--calibrate", "temperature"]
    results = main(tiny_args(tiny_model_dir, files, out, *OVERFIT[:-1], *flags))
    temperature = results["calibration_temperature"]
    assert temperature > 1  # overconfident
    assert results["eval_ece_after_calibration"] < results["eval_ece_before_calibration"]
    assert results["eval_ece_before_calibration"] == pytest.approx(results["eval_ece"], abs=1e-6)
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    names = [model.config.id2label[k] for k in range(model.config.num_labels)]
    for name in names:  # each label's too
        assert (
            f"eval_ece_{name}_after_calibration" in results
            and f"eval_brier_{name}_before_calibration" in results
        )
    texts = [row["text"] for row in read_jsonl(files["validation"])]
    encoded = AutoTokenizer.from_pretrained(out)(
        texts, truncation=True, max_length=64, padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        uncalibrated = model(**encoded).logits * temperature
    predictions = read_jsonl(out / "predictions.jsonl")
    assert sum(len(p["labels"]) for p in predictions) > 0 and (out / "reliability_diagram.png").is_file()
    assert [p["labels"] for p in predictions] == [
        [name for name, z in zip(names, row, strict=True) if z >= 0] for row in uncalibrated.tolist()
    ]
    got = torch.tensor([[p["probabilities"][name] for name in names] for p in predictions])
    torch.testing.assert_close(got, (uncalibrated / temperature).sigmoid(), rtol=1e-4, atol=1e-5)
    classify = pipeline("text-classification", model=str(out), top_k=None, device="cpu")  # sigmoid
    scores = [{s["label"]: s["score"] for s in row} for row in classify(texts[:8])]
    scored = torch.tensor([[row[name] for name in names] for row in scores])
    torch.testing.assert_close(scored, got[:8], rtol=1e-4, atol=1e-5)

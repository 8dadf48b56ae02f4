"""--calibrate temperature end to end: an overconfident tiny BERT (64 rows, 20 epochs) is calibrated on
its validation rows (the task is MNLI: eval_matched_* keys); the exported model keeps every prediction
and gives softmax(logits / T), and results.json's eval_* keys are its figures (the ones before T under
names of their own, the fit split's also held out by cross-fitting). Multi-label: one T for every
label's sigmoid, every label kept. A model with no confidence signal: T at its limit, said.

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
    for name, extra in (
        ("plain", []),
        ("calibrated", ["--calibrate", "temperature", "--save_plots", "true"]),
    ):
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
    assert temperature > 1 and calibrated["calibration_temperature_at_bound"] is False  # overconfident
    before = calibrated["eval_matched_ece_before_calibration"]
    assert calibrated["eval_matched_ece"] < before
    assert calibrated["eval_matched_ece_after_calibration_held_out"] < before
    assert calibrated["eval_matched_loss"] < calibrated["eval_matched_loss_before_calibration"]
    assert calibrated["eval_matched_accuracy"] == plain["eval_matched_accuracy"]
    assert json.loads((out / "results.json").read_text())["calibration_temperature"] == temperature
    before, after = read_jsonl(plain_dir / "predictions.jsonl"), read_jsonl(out / "predictions.jsonl")
    assert [p["label"] for p in after] == [p["label"] for p in before]
    assert max(max(p["probabilities"].values()) for p in after) < max(
        max(p["probabilities"].values()) for p in before
    )
    assert (out / "reliability_diagram.png").stat().st_size > 0
    card = (out / "README.md").read_text()
    assert f"T = {temperature:.4f}" in card and "in-sample" in card and "held out" in card
    recorded = json.loads((out / "train_config.json").read_text())
    assert recorded["identity"]["calibrate"] == "temperature"
    assert "calibration_temperature" not in plain and plain["eval_matched_brier"] > 0  # MNLI's key names


def test_the_headline_figures_are_the_exported_models(runs, nli_files, tmp_path):
    """Every eval_* figure of results.json is what evaluating the exported folder gives (ECE, Brier and
    loss those of the calibrated model); the uncalibrated model's keep names of their own, equal to
    the same run's without --calibrate."""
    (_, plain), (out, calibrated) = runs["plain"], runs["calibrated"]
    evaluated = main(tiny_args(out, nli_files, tmp_path / "evaluated", "--do_train", "false"))
    figures = {
        k: v
        for k, v in evaluated.items()
        if k.startswith("eval_") and not k.endswith("_runtime_s") and not isinstance(v, bool)
    }
    assert {"eval_matched_ece", "eval_matched_brier", "eval_matched_loss", "eval_loss"} <= figures.keys()
    for key, value in figures.items():
        assert calibrated[key] == pytest.approx(value, abs=1e-5), key
    for key in ("eval_matched_ece", "eval_matched_brier", "eval_matched_loss", "eval_loss"):
        assert calibrated[f"{key}_before_calibration"] == pytest.approx(plain[key], abs=1e-6), key
        assert abs(calibrated[key] - plain[key]) > 1e-3, key  # calibration changed it


def evaluation_order_logits(model_dir, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's logits and labels of `rows` in evaluation order: by token length (max_length 64),
    ties in file order."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    premises, hypotheses = [r["premise"] for r in rows], [r["hypothesis"] for r in rows]
    lengths = [
        len(ids) for ids in tokenizer(premises, hypotheses, truncation=True, max_length=64)["input_ids"]
    ]
    order = sorted(range(len(rows)), key=lengths.__getitem__)
    encoded = tokenizer(
        premises, hypotheses, truncation=True, max_length=64, padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        logits = model(**encoded).logits
    return logits[order], torch.tensor([rows[i]["label"] for i in order])


def cross_fitted_ece(model_dir, rows: list[dict], temperature: float) -> float:
    """The held-out ECE of a calibrated model (its logits x T: the model before calibration): rows
    alternate between 2 folds in evaluation order, each divided by the T fit on the other."""
    from finetune.metrics.calibration import fit_temperature, single_label_calibration

    logits, labels = evaluation_order_logits(model_dir, rows)
    logits = logits * temperature
    scaled = torch.empty_like(logits)
    scaled[0::2] = logits[0::2] / fit_temperature(logits[1::2], labels[1::2])
    scaled[1::2] = logits[1::2] / fit_temperature(logits[0::2], labels[0::2])
    return single_label_calibration(scaled, labels)["ece"]


def test_the_fit_splits_figures_are_also_held_out(runs, nli_files):
    """ECE after calibration on rows T did not see: each half of the validation rows scored with the T
    fit on the other half (the headline, the exported model's, is in-sample: the rows T was fit on)."""
    out, calibrated = runs["calibrated"]
    held_out = calibrated["eval_matched_ece_after_calibration_held_out"]
    rows = read_jsonl(nli_files["validation"])
    assert held_out == pytest.approx(
        cross_fitted_ece(out, rows, calibrated["calibration_temperature"]), abs=1e-4
    )
    assert len(calibrated["calibration_temperature_per_fold"]) == 2
    assert calibrated["calibration_fit_split"] == "validation_matched"


def test_a_model_with_no_confidence_signal_says_t_is_at_its_limit(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    """Validated on the 64 rows it memorized, each label moved to the next class: the model is wrong on
    them however sure it is, so the NLL falls as T grows and T stops at the search's limit, 100. The run
    says so in one line, results.json in a field, the card in a line."""
    rows = read_jsonl(nli_files["train"])[:64]
    files = {"train": tmp_path / "train.jsonl", "validation": tmp_path / "shifted.jsonl"}
    files["train"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    files["validation"].write_text(
        "".join(json.dumps({**r, "label": (r["label"] + 1) % 3}) + "\n" for r in rows)
    )
    out = tmp_path / "out"
    results = main(tiny_args(tiny_model_dir, files, out, *OVERFIT[:-1], "--calibrate", "temperature"))
    assert results["calibration_temperature"] == pytest.approx(100.0)
    assert results["calibration_temperature_at_bound"] is True
    assert json.loads((out / "results.json").read_text())["calibration_temperature_at_bound"] is True
    noted = [line for line in capsys.readouterr().out.splitlines() if "upper limit" in line]
    assert noted == [
        "--calibrate temperature: T = 100 is the upper limit of the search (0.01-100): the validation NLL "
        "still falls as T grows, so the model's logits carry no confidence signal (a near-chance model); "
        "its calibrated probabilities are all close to 1 / the number of labels"
    ]
    assert "T is the limit of its search range, not an estimate" in (out / "README.md").read_text()


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
    # The folds: the same rows as one process takes them (evaluation order, not the ranks' shards).
    held_out = results["eval_matched_ece_after_calibration_held_out"]
    assert held_out == pytest.approx(cross_fitted_ece(out, rows, temperature), abs=1e-4)


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
    flags += ["--test_file", str(files["validation"]), "--calibrate", "temperature", "--save_plots", "true"]
    results = main(tiny_args(tiny_model_dir, files, out, *OVERFIT[:-1], *flags))
    temperature = results["calibration_temperature"]
    assert temperature > 1  # overconfident
    assert results["eval_ece"] < results["eval_ece_before_calibration"]
    assert results["eval_ece_after_calibration_held_out"] < results["eval_ece_before_calibration"]
    assert results["eval_loss"] < results["eval_loss_before_calibration"]
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    names = [model.config.id2label[k] for k in range(model.config.num_labels)]
    for name in names:  # each label's too
        assert f"eval_ece_{name}" in results and f"eval_brier_{name}_before_calibration" in results
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

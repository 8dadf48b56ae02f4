"""Label order, label cells, class weights, label smoothing and classification scores, in process.

Runs with other heads and labels: tests/e2e/test_labels.py."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
import torch

from tests.helpers import refused
from tests.task_data import unbalanced_topics

ROBERTA_MNLI_ORDER = ("contradiction", "neutral", "entailment")  # roberta-large-mnli's head


def _custom_file(folder, name, cells):
    path = folder / name
    path.write_text("".join(json.dumps({"text": f"row {i}", "label": c}) + "\n" for i, c in enumerate(cells)))
    return str(path)


def test_label_order_decision():
    from finetune.data.labels import REGRESSION_HEAD, settle_label_order
    from finetune.data.tasks import GLUE_TASKS

    mnli = GLUE_TASKS["mnli"]
    for head in (None, ("LABEL_0", "LABEL_1", "LABEL_2")):  # no head, or one nobody trained
        assert settle_label_order(mnli, head, False, True, "m") == (mnli, False)
    task, replaced = settle_label_order(mnli, ("CONTRADICTION", "Neutral", "entailment"), False, False, "m")
    assert task.label_names == ROBERTA_MNLI_ORDER and not replaced
    assert settle_label_order(mnli, ("a", "b", "c"), True, True, "m") == (mnli, True)
    assert settle_label_order(mnli, ("LABEL_0",), False, False, "m") == (mnli, True)  # generic, other size
    with pytest.raises(ValueError, match="its head predicts one regression score, the task's labels are"):
        settle_label_order(mnli, REGRESSION_HEAD, False, True, "m")


def test_balanced_class_weights_weight_the_training_loss(tiny_model_dir, tmp_path):
    from finetune.config.train_config import TrainConfig
    from finetune.data.splits import load_splits
    from finetune.families.sequence_classification.evaluation import loss_sum

    rng = random.Random(1)
    train = tmp_path / "train.jsonl"
    rows = unbalanced_topics(rng, 200)
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = dict(task_name="custom", text_columns="text", label_column="topic", train_file=str(train))
    config = TrainConfig(**common, validation_split_percentage=10, class_weights="balanced",
                         model_name_or_path=str(tiny_model_dir))  # fmt: skip
    task, splits = load_splits(config)
    counts = [sum(r["topic"] == name for r in rows) for name in task.label_names]
    trained_on = [splits["train"]["label"].count(i) for i in range(3)]  # the rows left for training
    assert task.class_weights == pytest.approx([180 / (3 * c) for c in trained_on])
    # Seeded and stratified: each class gives 10% of its rows, the same ones for the same seed.
    labels = splits["validation"]["label"]
    assert [labels.count(i) for i in range(3)] == [round(c / 10) for c in counts]
    assert load_splits(config)[1]["validation"]["text"] == splits["validation"]["text"]
    assert len(splits["train"]) + len(splits["validation"]) == 200
    logits, targets = torch.randn(5, 3), torch.tensor([0, 1, 2, 1, 1])
    expected = sum(
        task.class_weights[t] * torch.nn.functional.cross_entropy(logits[i : i + 1], targets[i : i + 1])
        for i, t in enumerate(targets.tolist())
    )
    torch.testing.assert_close(loss_sum(logits, targets, task), expected)


def test_label_smoothing_is_hf_trainers_and_single_label_only(tiny_model_dir, tmp_path):
    from transformers.trainer_pt_utils import LabelSmoother

    from finetune.config.train_config import TrainConfig
    from finetune.data.splits import load_splits
    from finetune.families.sequence_classification.evaluation import loss_sum

    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in unbalanced_topics(random.Random(2), 50)))
    config = TrainConfig(task_name="custom", text_columns="text", label_column="topic", train_file=str(train),
                         validation_split_percentage=10, label_smoothing_factor=0.1,
                         model_name_or_path=str(tiny_model_dir))  # fmt: skip
    task, _ = load_splits(config)
    logits, targets = torch.randn(5, 3), torch.tensor([0, 1, 2, 1, 1])
    smoothed = LabelSmoother(epsilon=0.1)({"logits": logits}, targets)  # the batch's mean
    torch.testing.assert_close(loss_sum(logits, targets, task) / 5, smoothed)
    scores = tmp_path / "scores.jsonl"
    scores.write_text("".join(json.dumps({"text": f"row {i}", "score": i / 7}) + "\n" for i in range(20)))
    regression = dataclasses.replace(config, train_file=str(scores), label_column="score")
    with refused("--label_smoothing_factor"):
        load_splits(regression)


def test_classification_scores_agree_with_sklearn():
    import numpy as np
    from sklearn.metrics import confusion_matrix, f1_score, precision_recall_fscore_support

    from finetune.metrics.classification import multi_label_scores, single_label_scores

    rng = np.random.default_rng(0)
    truth, guess = rng.integers(0, 4, 200), rng.integers(0, 3, 200)  # class 3 is never predicted
    scores = single_label_scores(guess, truth, ("a", "b", "c", "d"))
    precision, recall, f1, support = precision_recall_fscore_support(
        truth, guess, labels=range(4), zero_division=0
    )
    for i, name in enumerate("abcd"):
        got = [scores[f"{kind}_{name}"] for kind in ("precision", "recall", "f1", "support")]
        assert got == pytest.approx([precision[i], recall[i], f1[i], support[i]])
    assert scores["f1_macro"] == pytest.approx(f1_score(truth, guess, average="macro", zero_division=0))
    assert scores["confusion_matrix"] == confusion_matrix(truth, guess, labels=range(4)).tolist()
    truth, guess = rng.integers(0, 2, (100, 5)), rng.integers(0, 2, (100, 5))
    scores = multi_label_scores(guess, truth)
    assert scores["f1_micro"] == pytest.approx(f1_score(truth, guess, average="micro"))
    assert scores["f1_macro"] == pytest.approx(f1_score(truth, guess, average="macro"))


def test_label_cells_as_users_write_them(tmp_path, capsys):
    """JSON booleans are two classes; an empty label is named by row, before any training; whole-number
    floats stay a regression (as in HF's run_classification.py), and the task line says how to get classes."""
    from finetune.config.train_config import TrainConfig
    from finetune.data.splits import load_splits
    from finetune.errors import ConfigError

    def load(cells):
        path = _custom_file(tmp_path, f"{len(list(tmp_path.iterdir()))}.jsonl", cells)
        return load_splits(TrainConfig(task_name="custom", text_columns="text", train_file=path,
                                       validation_file=path))  # fmt: skip

    task, splits = load([True, False, True, False])
    assert task.label_names == ("False", "True") and splits["train"]["label"] == [1, 0, 1, 0]
    with pytest.raises(ConfigError, match=r"\.jsonl: row 2 has an empty label; give every row one"):
        load(["spam", "ham", None])
    with pytest.raises(ConfigError, match=r"\.jsonl: row 1 has no number as its label \(empty, NaN or inf\)"):
        load([0.5, None, 2.5])
    task, _ = load([0.0, 1.0, 1.0, 0.0])
    assert task.is_regression and task.summary() == (
        "task: custom, regression (one score per row; the labels 0.0, 1.0 are floats; write them as integers "
        "or names for classes)"
    )
    assert load([0.5, 1.25, 3.0])[0].summary() == "task: custom, regression (one score per row)"

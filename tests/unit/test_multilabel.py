"""Multi-label custom data: lists of labels per row, sigmoid + BCE, micro/macro F1, pipeline scores."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from finetune.metrics.classification import multi_label_scores


def test_label_cells_mix_lists_single_labels_and_separated_text(tmp_path):
    from finetune.config.train_config import TrainConfig
    from finetune.data.splits import load_splits

    train = tmp_path / "train.jsonl"
    cells = [["Sports", "politics"], "weather", [], None, "sports"]
    train.write_text("".join(json.dumps({"text": f"row {i}", "tags": c}) + "\n" for i, c in enumerate(cells)))
    validation = tmp_path / "validation.tsv"
    validation.write_text("text\ttags\nrow a\tweather;SPORTS\nrow b\t\n")
    config = TrainConfig(task_name="custom", text_columns="text", label_column="tags", label_separator=";",
                         train_file=str(train), validation_file=str(validation))  # fmt: skip
    task, splits = load_splits(config)
    assert task.multi_label and task.label_names == ("Sports", "politics", "weather")
    assert splits["train"]["label"] == [[1, 1, 0], [0, 0, 1], [0, 0, 0], [0, 0, 0], [1, 0, 0]]
    assert splits["validation"]["label"] == [[1, 0, 1], [0, 0, 0]]


def test_separated_labels_in_a_csv_make_the_task_multi_label(tmp_path):
    """datasets reads a CSV's text column as large_string, a JSONL's as string: both are label text."""
    from finetune.config.train_config import TrainConfig
    from finetune.data.splits import load_splits

    train, validation = tmp_path / "train.csv", tmp_path / "validation.csv"
    train.write_text("text,tags\nrow 0,sports|politics\nrow 1,tech\nrow 2,politics|tech\n")
    validation.write_text("text,tags\nrow a,tech|sports\n")
    config = TrainConfig(task_name="custom", text_columns="text", label_column="tags",
                         train_file=str(train), validation_file=str(validation))  # fmt: skip
    task, splits = load_splits(config)
    assert task.multi_label and task.label_names == ("politics", "sports", "tech")
    assert splits["train"]["label"] == [[1, 1, 0], [0, 0, 1], [1, 0, 1]]
    assert splits["validation"]["label"] == [[0, 1, 1]]
    assert task.summary() == (
        "task: custom, multi-label, 3 labels: politics, sports, tech "
        "(label cells split on --label_separator '|')"
    )
    # A class name that holds the separator: --label_separator none keeps each cell one label.
    validation.write_text("text,tags\nrow a,sports|politics\n")
    task, splits = load_splits(replace(config, label_separator="none"))
    assert not task.multi_label and task.label_names == ("politics|tech", "sports|politics", "tech")
    assert splits["train"]["label"] == [1, 2, 0]
    assert task.summary() == "task: custom, single-label, 3 labels: politics|tech, sports|politics, tech"


def test_multi_label_loss_is_bce_per_label():
    from finetune.data.tasks import custom_task
    from finetune.families.sequence_classification.evaluation import loss_sum

    task = custom_task(("text",), ("a", "b", "c"), multi_label=True)
    logits, labels = torch.randn(4, 3), torch.tensor([[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]]).float()
    mean_per_row = torch.nn.BCEWithLogitsLoss()(logits, labels)  # transformers' multi-label loss
    torch.testing.assert_close(loss_sum(logits, labels, task), 4 * mean_per_row)


def test_multi_label_scores():
    truth = [[1, 0, 1], [0, 1, 0], [0, 0, 0], [1, 1, 0]]
    guess = [[1, 0, 0], [0, 1, 0], [0, 0, 0], [1, 1, 1]]
    scores = multi_label_scores(guess, truth)
    # label a: tp 2; b: tp 2; c: fn 1, fp 1 -> F1 1, 1, 0; micro: 2*4 / (2*4 + 2)
    assert scores == pytest.approx({"f1_micro": 0.8, "f1_macro": 2 / 3, "exact_match": 0.5})

"""Multi-label custom data, end to end: a run trains with sigmoid scores; mistakes refused in one line.

The label cells, loss and scores alone: tests/unit/test_multilabel.py."""

from __future__ import annotations

import csv
import itertools
import json
import random

import pytest
import torch

from finetune.metrics.classification import multi_label_scores
from finetune.mnli import cli, main
from tests.helpers import read_jsonl, reset_accelerate, tiny_args

TAGS = {
    "sports": ["football", "tennis", "goal"],
    "politics": ["election", "senate", "vote"],
    "weather": ["rain", "snow", "storm"],
}
NEUTRAL = ["today", "people", "city", "morning", "report", "the", "new", "said"]


def tagged_row(rng: random.Random) -> tuple[str, list[str]]:
    """Three words, one per tag: a word of that tag when the row has it (p=0.4), else a neutral one."""
    tags = [tag for tag in TAGS if rng.random() < 0.4]
    words = [rng.choice(TAGS[tag] if tag in tags else NEUTRAL) for tag in TAGS]
    return " ".join(words), tags


def best_constant_f1_micro(rows) -> float:
    """What a model predicting the same label set for every row reaches at best."""
    names = list(TAGS)
    truth = [[name in tags for name in names] for _, tags in rows]
    return max(
        multi_label_scores([list(guess)] * len(rows), truth)["f1_micro"]
        for guess in itertools.product((False, True), repeat=len(names))
    )


@pytest.fixture(scope="module")
def tagged_files(tmp_path_factory):
    """Train as JSONL lists, validation as CSV with `|`-separated labels, a test file of text only."""
    folder = tmp_path_factory.mktemp("tagged")
    rng = random.Random(0)
    train, validation = [tagged_row(rng) for _ in range(480)], [tagged_row(rng) for _ in range(120)]
    (folder / "train.jsonl").write_text(
        "".join(json.dumps({"text": t, "tags": tags}) + "\n" for t, tags in train)
    )
    with (folder / "validation.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "tags"])
        writer.writerows([text, "|".join(tags)] for text, tags in validation)
    (folder / "test.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t, _ in validation[:10]))
    return {"train": folder / "train.jsonl", "validation": folder / "validation.csv",
            "test": folder / "test.jsonl", "validation_rows": validation}  # fmt: skip


FLAGS = ["--task_name", "custom", "--text_columns", "text", "--label_column", "tags"]


@pytest.fixture(scope="module")
def wider_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny BERT at hidden size 64 with 4 heads: hidden 32 with 2 heads learns two of the three
    tags and misses the third. Its head is transformers' default: 2 labels, LABEL_0 and LABEL_1."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    folder = tmp_path_factory.mktemp("wider-bert")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    sizes = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    config = BertConfig(vocab_size=tokenizer.vocab_size, max_position_embeddings=128, **sizes)
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_multi_label_data_trains_with_sigmoid_scores(wider_model_dir, tagged_files, tmp_path):
    out = tmp_path / "out"
    args = [*FLAGS, "--num_train_epochs", "8", "--do_predict", "--test_file", str(tagged_files["test"])]
    # The model's generic 2-label head is replaced by a 3-label one.
    results = main(tiny_args(wider_model_dir, tagged_files, out, *args))
    assert best_constant_f1_micro(tagged_files["validation_rows"]) < 0.6
    assert results["eval_f1_micro"] > 0.9, results
    assert results["eval_f1_macro"] > 0.9 and results["eval_exact_match"] > 0.8, results
    assert results["eval_samples"] == 120

    config = json.loads((out / "config.json").read_text())
    assert config["problem_type"] == "multi_label_classification"
    assert list(config["id2label"].values()) == ["politics", "sports", "weather"]
    predictions = read_jsonl(out / "predictions.jsonl")
    assert len(predictions) == 10
    for prediction in predictions:
        probabilities = prediction["probabilities"]
        assert probabilities.keys() == set(TAGS)
        assert prediction["labels"] == [n for n, p in probabilities.items() if p >= 0.5]

    # transformers' pipeline reads problem_type and applies independent sigmoids, not a softmax.
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    text = "goal senate snow"
    scores = pipeline("text-classification", model=str(out), top_k=None)([text])[0]
    by_label = {s["label"]: s["score"] for s in scores}
    model, tokenizer = (
        AutoModelForSequenceClassification.from_pretrained(out),
        AutoTokenizer.from_pretrained(out),
    )
    with torch.no_grad():
        logits = model(**tokenizer(text, return_tensors="pt")).logits[0]
    expected = dict(zip(config["id2label"].values(), logits.sigmoid().tolist(), strict=True))
    assert by_label == pytest.approx(expected, abs=1e-5)
    assert sum(by_label.values()) > 1.5  # all three tags are in the text: far from a softmax's 1

    # Evaluating the saved model reads its labels and problem_type from its config.json.
    reset_accelerate()
    files = {"validation": tagged_files["validation"]}
    args = ["--model_name_or_path", str(out), "--validation_file", str(files["validation"]), *FLAGS,
            "--do_train", "false", "--output_dir", str(tmp_path / "eval"), "--report_to", "none"]  # fmt: skip
    again = main(args)
    assert again["eval_f1_micro"] == pytest.approx(results["eval_f1_micro"])


def test_empty_label_lists_everywhere_are_refused_before_the_model_loads(tmp_path, capsys):
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"text": f"row {i}", "tags": []}) + "\n" for i in range(5)))
    files = {"train": train, "validation": train}
    # No model at that path: the data error comes first.
    assert cli(tiny_args(tmp_path / "no-model", files, tmp_path / "out", *FLAGS)) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: --train_file") and "every row has an empty label list" in error


def test_class_weights_are_refused_for_multi_label(tiny_model_dir, tagged_files, tmp_path, capsys):
    args = [*FLAGS, "--class_weights", "balanced"]
    assert cli(tiny_args(tiny_model_dir, tagged_files, tmp_path / "out", *args)) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--class_weights is for single-label classification" in error

"""The model's own labels, metrics of custom classification, class weights, a carved validation split."""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch

from finetune.mnli import cli, main
from tests.helpers import read_jsonl, reset_accelerate, tiny_args, weights
from tests.task_data import unbalanced_topics

MNLI_ORDER = ("entailment", "neutral", "contradiction")
ROBERTA_MNLI_ORDER = ("contradiction", "neutral", "entailment")  # roberta-large-mnli's head


def _with_head(model_dir, folder, names, order=None):
    """A copy of a model whose head predicts `names`; `order` permutes the trained head's rows, so
    the copy scores exactly what the original does, under another id order."""
    shutil.copytree(model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["id2label"] = dict(enumerate(names))
    config["label2id"] = {name: i for i, name in enumerate(names)}
    (folder / "config.json").write_text(json.dumps(config))
    if order is not None:
        from safetensors.torch import save_file

        state = weights(folder)
        for key in ("classifier.weight", "classifier.bias"):
            state[key] = state[key][list(order)].contiguous()
        save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def reordered(trained, tmp_path_factory):
    """The trained MNLI model with its head ordered contradiction, neutral, entailment."""
    order = [MNLI_ORDER.index(name) for name in ROBERTA_MNLI_ORDER]
    return _with_head(trained[0], tmp_path_factory.mktemp("head") / "model", ROBERTA_MNLI_ORDER, order)


def test_a_head_in_another_label_order_scores_what_the_model_scores(trained, reordered, nli_files, tmp_path):
    # The files hold GLUE's class ids (0 = entailment): they are mapped onto the head's ids.
    results = main(tiny_args(reordered, nli_files, tmp_path / "eval", "--do_train", "false"))
    assert results["eval_matched_accuracy"] == trained[1]["eval_matched_accuracy"]
    reset_accelerate()
    # Fine-tuning it further (a step too small to change a prediction) keeps the head's order.
    out = tmp_path / "more"
    args = ["--max_train_steps", "1", "--learning_rate", "1e-12", "--warmup_ratio", "0"]
    results = main(tiny_args(reordered, nli_files, out, *args))
    assert results["eval_matched_accuracy"] == trained[1]["eval_matched_accuracy"]
    saved = json.loads((out / "config.json").read_text())
    assert tuple(saved["id2label"].values()) == ROBERTA_MNLI_ORDER


def test_a_head_with_other_labels_needs_ignore_mismatched_sizes(trained, nli_files, tmp_path, capsys):
    other = _with_head(trained[0], tmp_path / "other", ("sports", "politics", "weather"))
    for extra in ((), ("--do_train", "false")):
        assert cli(tiny_args(other, nli_files, tmp_path / "out", *extra)) == 2
        error = capsys.readouterr().err.strip().splitlines()[-1]  # progress bars come before it
        assert error.startswith("error: ") and "sports/politics/weather" in error
        assert "entailment/neutral/contradiction" in error
        assert ("--ignore_mismatched_sizes" in error) == (not extra)
    out = tmp_path / "replaced"
    args = ["--ignore_mismatched_sizes", "--max_train_steps", "1", "--learning_rate", "1e-12"]
    main(tiny_args(other, nli_files, out, *args))
    saved = json.loads((out / "config.json").read_text())
    assert tuple(saved["id2label"].values()) == MNLI_ORDER
    before, after = weights(other), weights(out)
    # A new head (freshly initialized, not the old rows relabelled); the encoder as it was.
    assert not torch.allclose(before["classifier.weight"], after["classifier.weight"], atol=1e-3)
    torch.testing.assert_close(before["bert.pooler.dense.weight"], after["bert.pooler.dense.weight"])


def test_a_classifier_and_a_regression_model_swap_heads_only_when_asked(trained, nli_files, tmp_path, capsys):
    """An MNLI model fine-tuned on scores (STS-B after MNLI), and the regression model back on labels."""
    scores = tmp_path / "scores.jsonl"
    rows = read_jsonl(nli_files["train"])
    scores.write_text("".join(json.dumps({**r, "label": r["label"] * 2.5}) + "\n" for r in rows))
    flags = ["--task_name", "custom", "--text_columns", "premise,hypothesis", "--max_train_steps", "2"]
    files = {"train": scores, "validation": scores}
    assert cli(tiny_args(trained[0], files, tmp_path / "refused", *flags)) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --model_name_or_path {trained[0]}: its head predicts entailment/neutral/contradiction, "
        "the task predicts one regression score; pass --ignore_mismatched_sizes to replace the head with a "
        "new one"
    )
    regression = tmp_path / "regression"
    results = main(tiny_args(trained[0], files, regression, *flags, "--ignore_mismatched_sizes"))
    assert "eval_pearson" in results
    saved = json.loads((regression / "config.json").read_text())
    assert saved["problem_type"] == "regression" and len(saved["id2label"]) == 1
    reset_accelerate()
    back = ["--max_train_steps", "2"]
    assert cli(tiny_args(regression, nli_files, tmp_path / "refused-back", *back)) == 2
    assert "its head predicts one regression score, the task's labels are" in capsys.readouterr().err
    results = main(tiny_args(regression, nli_files, tmp_path / "back", *back, "--ignore_mismatched_sizes"))
    assert "eval_matched_accuracy" in results


def test_custom_classification_metrics_class_weights_and_a_carved_validation_split(tiny_model_dir, tmp_path):
    rng = random.Random(0)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in unbalanced_topics(rng, 300)))
    out = tmp_path / "out"
    flags = ["--task_name", "custom", "--text_columns", "text", "--label_column", "topic"]
    flags += ["--validation_split_percentage", "20", "--class_weights", "balanced"]
    flags += ["--metric_for_best_model", "eval_f1_weather", "--num_train_epochs", "3", "--save_plots", "true"]
    args = tiny_args(tiny_model_dir, {"train": train, "validation": ""}, out, *flags)
    at = args.index("--validation_file")
    del args[at : at + 2]  # one data file only
    results = main(args)
    names = ("politics", "sports", "weather")
    confusion = results["eval_confusion_matrix"]
    assert confusion["labels"] == list(names)
    assert sum(map(sum, confusion["matrix"])) == results["eval_samples"] == 60  # 20% of 300, per class
    assert [sum(row) for row in confusion["matrix"]] == [results[f"eval_support_{n}"] for n in names]
    for name in names:
        assert {f"eval_{k}_{name}" for k in ("precision", "recall", "f1")} <= results.keys()
    assert results["eval_f1_macro"] == pytest.approx(sum(results[f"eval_f1_{n}"] for n in names) / 3)
    assert results["eval_accuracy"] > 0.9, results  # the topic word decides it
    assert results["best_metric"] is not None
    saved = json.loads((out / "results.json").read_text())
    assert saved["eval_confusion_matrix"] == confusion
    assert (out / "confusion_matrix.png").stat().st_size > 0
    card = (out / "README.md").read_text()
    assert "| sports |" in card and "confusion_matrix.png" in card
    trained_with = json.loads((out / "train_config.json").read_text())
    assert trained_with["metric_for_best_model"] == "eval_f1_weather"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--class_weights", "1,x"], "--class_weights must be 'balanced' or a comma list"),
        (["--class_weights", "1,2"], "--class_weights has 2 weights; give one per label"),
        (["--validation_split_percentage", "0"], "--validation_split_percentage must be in 1..99"),
        (["--validation_split_percentage", "10", "--validation_file", "v.jsonl"], "no --validation_file"),
        (["--metric_for_best_model", "eval_f1_nope"], "--metric_for_best_model eval_f1_nope"),
    ],
)
def test_label_flag_mistakes(tiny_model_dir, tmp_path, capsys, flags, message):
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in unbalanced_topics(random.Random(2), 40)))
    args = ["--model_name_or_path", str(tiny_model_dir), "--train_file", str(train), "--task_name", "custom",
            "--text_columns", "text", "--label_column", "topic", "--output_dir", str(tmp_path / "out"),
            "--report_to", "none"]  # fmt: skip
    if "--validation_file" not in flags and flags[:1] != ["--validation_split_percentage"] and flags:
        args += ["--validation_split_percentage", "25"]
    assert cli(args + flags) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]  # progress bars come before it
    assert error.startswith("error: ") and message in error, error


def test_a_checkpoint_resumes_only_with_the_same_class_weights(tiny_model_dir, tmp_path, capsys):
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in unbalanced_topics(random.Random(3), 64)))
    flags = ["--task_name", "custom", "--text_columns", "text", "--label_column", "topic"]
    flags += ["--max_train_steps", "2", "--checkpointing_steps", "2"]
    first = tmp_path / "first"
    main(tiny_args(tiny_model_dir, {"train": train, "validation": train}, first, *flags))
    reset_accelerate()
    resume = ["--resume_from_checkpoint", str(first / "checkpoint-2"), "--class_weights", "balanced"]
    files = {"train": train, "validation": train}
    args = tiny_args(tiny_model_dir, files, tmp_path / "second", *flags, *resume)
    assert cli(args) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--class_weights none; this run has --class_weights balanced" in error, error


def test_class_weights_are_read_in_the_task_lines_order_and_recorded_beside_their_labels(
    tiny_model_dir, tmp_path
):
    rng = random.Random(0)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in unbalanced_topics(rng, 60)))
    out = tmp_path / "out"
    flags = ["--task_name", "custom", "--text_columns", "text", "--label_column", "topic"]
    flags += ["--class_weights", "1,50,1", "--max_train_steps", "2", "--eval_strategy", "no"]
    main(tiny_args(tiny_model_dir, {"train": train, "validation": train}, out, *flags))
    recorded = json.loads((out / "train_config.json").read_text())["class_weights_by_label"]
    assert recorded == {"politics": 1.0, "sports": 50.0, "weather": 1.0}  # the task line's order
    assert (
        "- class weights: {'politics': 1.0, 'sports': 50.0, 'weather': 1.0}"
        in (out / "README.md").read_text()
    )

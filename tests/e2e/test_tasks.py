"""Every GLUE task shape, custom columns, evaluate-only and predict modes, model card, curves, trackers."""

import csv
import json
import random

import pytest
import torch

from finetune.data.tasks import GLUE_TASKS
from finetune.mnli import main
from tests.helpers import N_VALIDATION, read_jsonl, reset_accelerate, tiny_args
from tests.task_data import unbalanced_topics, write_task_files
from tests.warm_ranks import run_ranks


@pytest.fixture(scope="module")
def tiny_encoder_dir(tiny_model_dir, tmp_path_factory):
    """The tiny BERT without a classification head, as a pretrained base model comes."""
    from transformers import AutoTokenizer, BertModel

    folder = tmp_path_factory.mktemp("tiny-encoder")
    BertModel.from_pretrained(tiny_model_dir).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    return folder


def task_args(model_dir, files, output_dir, *extra):
    return tiny_args(
        model_dir, files, output_dir, "--num_train_epochs", "6", "--learning_rate", "3e-3", *extra
    )


@pytest.mark.parametrize(
    ("task_name", "shape", "metrics"),
    [
        ("cola", "single", {"eval_matthews_correlation": 0.6}),
        ("sst2", "single", {"eval_accuracy": 0.8}),
        # Pair and regression floors are above what one sentence alone allows (0.75/0.67, 0.71).
        ("mrpc", "pair", {"eval_f1": 0.85, "eval_accuracy": 0.9}),
        ("qqp", "pair", {"eval_f1": 0.85, "eval_accuracy": 0.9}),
        ("stsb", "regression", {"eval_pearson": 0.85, "eval_spearmanr": 0.8}),
    ],
)
def test_each_task_shape_trains_and_reports_the_glue_metrics(
    tiny_encoder_dir, tmp_path, task_name, shape, metrics
):
    files = write_task_files(tmp_path, shape, 480, 101, GLUE_TASKS[task_name].text_columns)
    out = tmp_path / "out"
    results = main(task_args(tiny_encoder_dir, files, out, "--task_name", task_name))
    scores = {k: v for k, v in results.items() if k.startswith("eval_")}
    del scores["eval_samples"], scores["eval_runtime_s"]
    assert scores.pop("eval_loss") > 0  # every task reports its loss too
    if shape != "regression":  # and every classification task its calibration (ECE, multi-class Brier)
        assert 0 <= scores.pop("eval_ece") <= 1 and 0 <= scores.pop("eval_brier") <= 2
    assert scores.keys() == metrics.keys()
    assert all(scores[k] > floor for k, floor in metrics.items()), scores
    assert results["eval_samples"] == 101
    config = json.loads((out / "config.json").read_text())
    task = GLUE_TASKS[task_name]
    if task.is_regression:
        assert len(config["id2label"]) == 1 and config["problem_type"] == "regression"
    else:
        assert list(config["id2label"].values()) == list(task.label_names)
    assert (
        json.loads((out / "train_config.json").read_text())["metric_for_best_model"] == task.metric_keys()[0]
    )


def test_custom_columns_and_inferred_labels(tiny_encoder_dir, tmp_path, capsys):
    """A CSV with its own column names and word labels: names inferred, sorted, saved in id2label;
    the saved model then evaluates the file on its own, its label names read back from it."""
    files = write_task_files(tmp_path, "single", 480, 101)
    for split, path in list(files.items()):
        rows = read_jsonl(path)
        files[split] = tmp_path / f"reviews_{split}.csv"
        with files[split].open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["id", "review", "verdict"])
            writer.writeheader()
            writer.writerows(
                {"id": i, "review": r["sentence"], "verdict": ["thumbs down", "thumbs up"][r["label"]]}
                for i, r in enumerate(rows)
            )
    out = tmp_path / "out"
    custom = ["--task_name", "custom", "--text_columns", "review", "--label_column", "verdict"]
    results = main(task_args(tiny_encoder_dir, files, out, *custom))
    assert results["eval_accuracy"] > 0.8 and results["eval_samples"] == 101
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "thumbs down", "1": "thumbs up"}
    reset_accelerate()

    again = main(
        [
            "--task_name", "custom", "--text_columns", "review", "--label_column", "verdict",
            "--model_name_or_path", str(out), "--validation_file", str(files["validation"]),
            "--do_train", "false", "--output_dir", str(tmp_path / "eval"), "--report_to", "none",
            "--mixed_precision", "no", "--max_length", "64",
        ]
    )  # fmt: skip
    assert again["eval_accuracy"] == results["eval_accuracy"]
    assert again["eval_samples"] == 101
    assert "evaluation only: per_device_eval_batch=64" in capsys.readouterr().out  # no training plan
    (logged,) = read_jsonl(tmp_path / "eval" / "metrics.jsonl")  # the evaluation, as training logs it
    assert logged["step"] == 0 and logged["eval_accuracy"] == again["eval_accuracy"]


def test_model_card_and_training_curves(trained, tiny_model_dir):
    from PIL import Image

    out, results = trained
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\n")
    assert f"| eval_matched_accuracy | {results['eval_matched_accuracy']:.4f} |" in card
    assert str(tiny_model_dir) in card and "--learning_rate 0.003" in card  # in the command alone:
    prose = [line for line in card.splitlines() if not line.startswith("accelerate launch ")]
    assert not [line for line in prose if str(tiny_model_dir) in line]  # not this disk's layout
    assert f"`{tiny_model_dir.name}` (a local folder) fine-tuned on **mnli**" in card
    assert "base_model:" not in card  # a folder's name is no Hub id
    assert "hardware: 1 × cpu" in card and "s training over the whole run" in card
    assert "![loss, learning rate and evaluation metrics](training_curves.png)" in card
    with Image.open(out / "training_curves.png") as image:
        image.verify()
    with Image.open(out / "training_curves.png") as image:
        assert image.format == "PNG" and image.size == (1200, 400)


def test_save_plots_false_draws_no_chart_and_the_card_links_none(tiny_model_dir, tmp_path, capsys):
    """A custom single-label task, which draws training_curves.png and confusion_matrix.png by default."""
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in unbalanced_topics(random.Random(0), 48)))
    out = tmp_path / "out"
    flags = ["--task_name", "custom", "--text_columns", "text", "--label_column", "topic"]
    flags += ["--max_train_steps", "2", "--save_plots", "false"]
    results = main(tiny_args(tiny_model_dir, {"train": train, "validation": train}, out, *flags))
    assert "eval_confusion_matrix" in results and (out / "README.md").is_file()
    assert not list(out.glob("*.png"))
    assert "![" not in (out / "README.md").read_text()
    assert "training_curves.png" not in capsys.readouterr().out


def test_training_curves_put_eval_loss_beside_the_training_loss(trained, tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from finetune.output.plots import plot_training_curves

    out, _ = trained
    drawn = []
    monkeypatch.setattr(plt, "close", drawn.append)  # keeps the figure to read its lines
    plot_training_curves(out / "metrics.jsonl", tmp_path / "curves.png", ["eval_matched_accuracy"])
    loss_axis, _, eval_axis = drawn[0].axes
    lines = {line.get_label(): line for line in loss_axis.get_lines()}
    records = read_jsonl(out / "metrics.jsonl")
    evaluated = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
    assert sorted(lines) == ["eval_loss", "loss"] and evaluated
    assert list(zip(*lines["eval_loss"].get_data(), strict=True)) == evaluated
    assert [line.get_label() for line in eval_axis.get_lines()] == ["eval_matched_accuracy"]


def without_labels(source, target):
    target.write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "label"}) + "\n" for r in read_jsonl(source))
    )
    return target


@pytest.mark.multiprocess
def test_two_processes_evaluate_as_one_and_predict_every_row_once_in_input_order(
    trained, nli_files, tmp_path
):
    """151 rows over 2 ranks × batches of 8, run length-sorted: the evaluation counts every row once
    and scores what one process scores; one prediction per row, in file order, each equal to the
    model applied to that row alone."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model_dir, _ = trained
    test_file = without_labels(nli_files["validation"], tmp_path / "unlabeled.jsonl")
    out = tmp_path / "predict"
    command = [
        "--model_name_or_path", str(model_dir),
        "--do_train", "false", "--validation_file", str(nli_files["validation"]), "--do_predict",
        "--test_file", str(test_file), "--per_device_eval_batch_size", "8", "--output_dir", str(out),
        "--report_to", "none", "--mixed_precision", "no", "--max_length", "64",
    ]  # fmt: skip
    done = run_ranks(command)
    assert done.returncode == 0, done.stderr[-3000:]
    two = json.loads((out / "results.json").read_text())
    one = main(tiny_args(model_dir, nli_files, tmp_path / "one", "--do_train", "false",
                         "--per_device_eval_batch_size", "8"))  # fmt: skip
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert one["eval_matched_samples"] == two["eval_matched_samples"] == N_VALIDATION
    assert one["eval_matched_accuracy"] == two["eval_matched_accuracy"]
    predictions = read_jsonl(out / "predictions.jsonl")
    assert [p["row"] for p in predictions] == list(range(N_VALIDATION))

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    rows = read_jsonl(test_file)
    for row, prediction in zip(rows, predictions, strict=True):
        with torch.no_grad():
            inputs = tokenizer(
                row["premise"], row["hypothesis"], truncation=True, max_length=64, return_tensors="pt"
            )
            probabilities = model(**inputs).logits.softmax(-1)[0]
        names = ("entailment", "neutral", "contradiction")
        assert prediction["label"] == names[int(probabilities.argmax())]
        expected = torch.tensor([prediction["probabilities"][n] for n in names])
        torch.testing.assert_close(expected, probabilities, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("report_to", "wandb", "tensorboard"),
    # tensorboard alone: test_tensorboard_tracker_writes_events, which reads back what was logged.
    [("none", False, False), ("wandb", True, False), ("all", True, True)],
)
def test_tracker_selection(tiny_model_dir, nli_files, tmp_path, report_to, wandb, tensorboard):
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "5")
    main([*args[: args.index("--report_to")], "--report_to", report_to])
    assert bool(list(out.glob("wandb/offline-run-*/run-*.wandb"))) == wandb
    assert bool(list(out.rglob("events.out.tfevents.*"))) == tensorboard


def test_model_card_command_is_what_the_user_gave(trained, tiny_model_dir, nli_files):
    """Rerun elsewhere, the card's command must not force this machine's resolved choices."""
    from finetune.config.parser import parse_config
    from finetune.config.train_config import to_dict

    out, _ = trained
    card = (out / "README.md").read_text()
    command = next(line for line in card.splitlines() if line.startswith("accelerate launch "))
    argv = command.split()[4:]  # accelerate launch -m finetune ...
    given = tiny_args(tiny_model_dir, nli_files, out, "--num_train_epochs", "3", "--save_plots", "true")
    # Every flag given with another value than its default; 3 epochs and charts are the defaults.
    assert {a for a in argv if a.startswith("--")} == {a for a in given if a.startswith("--")} - {
        "--num_train_epochs",
        "--save_plots",
    }
    assert "--learning_rate 0.003" in command and "--per_device_train_batch_size 16" in command
    resolved = json.loads((out / "train_config.json").read_text())
    assert (resolved["padding_free"], resolved["dropout_kernel"]) != ("auto", "auto")  # setup did resolve
    for name in (
        "padding_free", "pad_to_multiple_of", "keep_freed_memory", "dropout_kernel", "attn_implementation",
        "dataset_config_name", "project_name", "metric_for_best_model", "greater_is_better",
        "load_best_model_at_end",
    ):  # fmt: skip
        assert f"--{name} " not in command
    # The command reproduces the run's settings.
    assert to_dict(parse_config(argv)) == to_dict(parse_config(given))


def test_the_card_names_a_base_model_as_others_can_find_it(tmp_path):
    """A Hub id as given (and in base_model:); a local folder by its name; a Hub cache snapshot by the
    repo it holds; a GGUF file after either."""
    from finetune.output.card import base_model_name

    assert base_model_name("org/model") == ("`org/model`", "org/model")
    folder = tmp_path / "my-model"
    folder.mkdir()
    assert base_model_name(str(folder)) == ("`my-model` (a local folder)", None)
    assert base_model_name(str(folder / "..")) == (f"`{tmp_path.name}` (a local folder)", None)
    snapshot = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    assert base_model_name(str(snapshot)) == ("`HuggingFaceTB/SmolLM2-135M`", "HuggingFaceTB/SmolLM2-135M")
    assert base_model_name(str(folder), "m.Q4_1.gguf") == (
        "`my-model` (a local folder), GGUF file `m.Q4_1.gguf`,",
        None,
    )

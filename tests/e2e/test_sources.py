"""Rows from a dataset by --dataset_name (a local folder of data files stands in for a Hub id) and
from parquet files: split names, the dataset's own label names (ClassLabel), one-line refusals."""

from __future__ import annotations

import json

import pytest
from datasets import ClassLabel, Dataset, Features, List, Value, load_dataset

from finetune.mnli import cli, main
from tests.helpers import read_jsonl, reset_accelerate, tiny_args

TOPICS = ("World", "Sports", "Business", "Sci/Tech")  # ag_news' order: not sorted
WORDS = {"World": "summit", "Sports": "football", "Business": "shares", "Sci/Tech": "software"}


@pytest.fixture(scope="module")
def news_folder(tmp_path_factory):
    """A Hub-style dataset folder: train and test parquet files whose labels are ClassLabel ids,
    single-label (`label`) and multi-label (`tags`)."""
    features = Features({
        "text": Value("string"),
        "label": ClassLabel(names=list(TOPICS)),
        "tags": List(ClassLabel(names=["long", "short"])),
    })  # fmt: skip

    def rows(n, offset):
        ids = [(i + offset) % 4 for i in range(n)]
        return {
            "text": [f"news about {WORDS[TOPICS[t]]} number {i}" for i, t in enumerate(ids)],
            "label": ids,
            "tags": [[0, 1] if t == 0 else [t % 2] for t in ids],
        }

    folder = tmp_path_factory.mktemp("news")
    Dataset.from_dict(rows(96, 0), features=features).to_parquet(folder / "train.parquet")
    Dataset.from_dict(rows(20, 1), features=features).to_parquet(folder / "test.parquet")
    return folder


def dataset_args(model_dir, folder, out, *extra):
    args = tiny_args(model_dir, {"train": "", "validation": ""}, out, "--max_train_steps", "4")
    for flag in ("--train_file", "--validation_file"):  # the dataset instead of files
        at = args.index(flag)
        del args[at : at + 2]
    return [*args, "--task_name", "custom", "--dataset_name", str(folder), "--text_columns", "text", *extra]


def test_a_dataset_folder_trains_with_its_own_label_names(tiny_model_dir, news_folder, tmp_path, capsys):
    out = tmp_path / "out"
    flags = ["--validation_split_name", "test", "--do_predict", "true", "--ignore_mismatched_sizes"]
    results = main(dataset_args(tiny_model_dir, news_folder, out, *flags))
    assert (
        "task: custom, single-label, 4 labels: World, Sports, Business, Sci/Tech" in capsys.readouterr().out
    )
    assert results["eval_samples"] == 20
    saved = json.loads((out / "config.json").read_text())
    assert tuple(saved["id2label"].values()) == TOPICS  # the dataset's id order, not sorted
    predictions = read_jsonl(out / "predictions.jsonl")
    assert len(predictions) == 20 and {p["label"] for p in predictions} <= set(TOPICS)
    card = (out / "README.md").read_text()
    assert f"- local data: `{news_folder}`" in card
    assert "datasets:" not in card  # the card's Hub metadata names Hub datasets only


def test_a_saved_dataset_folder_trains_as_its_training_split(tiny_model_dir, news_folder, tmp_path, capsys):
    """`Dataset.save_to_disk`'s folder (load_dataset refuses it, asking for load_from_disk): its rows are
    the training split, a validation split carved from them."""
    saved = tmp_path / "saved"
    load_dataset("parquet", data_files=str(news_folder / "train.parquet"), split="train").save_to_disk(saved)
    flags = ["--validation_split_percentage", "25", "--ignore_mismatched_sizes"]
    results = main(dataset_args(tiny_model_dir, saved, tmp_path / "out", *flags))
    assert results["eval_samples"] == 24  # 25% of its 96 rows
    assert "4 labels: World, Sports, Business, Sci/Tech" in capsys.readouterr().out


def test_multi_label_class_ids_and_a_carved_validation_split(tiny_model_dir, news_folder, tmp_path, capsys):
    out = tmp_path / "out"
    flags = ["--label_column", "tags", "--validation_split_percentage", "25", "--ignore_mismatched_sizes"]
    results = main(dataset_args(tiny_model_dir, news_folder, out, *flags))
    assert "task: custom, multi-label, 2 labels: long, short\n" in capsys.readouterr().out
    assert results["eval_samples"] == 24 and "eval_f1_micro" in results


def test_a_parquet_file_keeps_its_label_names(tiny_model_dir, news_folder, tmp_path):
    files = {"train": news_folder / "train.parquet", "validation": news_folder / "test.parquet"}
    flags = ["--task_name", "custom", "--text_columns", "text", "--max_train_steps", "2"]
    main(tiny_args(tiny_model_dir, files, tmp_path / "out", *flags, "--ignore_mismatched_sizes"))
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert tuple(saved["id2label"].values()) == TOPICS


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "has no split 'validation' (it has train, test); name one with --validation_split_name or carve "
             "one with --validation_split_percentage"),
        (["--validation_split_name", "test", "--train_split_name", "all"], "has no split 'all'"),
        (["--validation_split_name", "test", "--text_columns", "body"], ":train lacks column(s) body; found"),
    ],
)  # fmt: skip
def test_dataset_mistakes_are_one_line(tiny_model_dir, news_folder, tmp_path, capsys, flags, message):
    capsys.readouterr()
    assert cli(dataset_args(tiny_model_dir, news_folder, tmp_path / "out", *flags)) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"error: --dataset_name {news_folder}") or "lacks" in error, error
    assert message in error


def test_an_unreachable_dataset_is_one_line(tiny_model_dir, tmp_path, capsys):
    """conftest sets HF_DATASETS_OFFLINE, as on a machine without the Hub."""
    args = dataset_args(tiny_model_dir, "nyu-mll/glue", tmp_path / "out")
    args = args[: args.index("--task_name")]  # MNLI from the Hub, the default
    reset_accelerate()
    capsys.readouterr()
    assert cli(args) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith("error: --task_name mnli reads nyu-mll/glue (--dataset_name): cannot load it (")
    )
    assert cli([*args, "--task_name", "custom", "--text_columns", "premise"]) == 2
    assert "--task_name custom: give local files (--train_file, --validation_file) or --dataset_name" in (
        capsys.readouterr().err
    )


def test_a_dataset_without_validation_trains_when_nothing_is_evaluated(tiny_model_dir, news_folder, tmp_path):
    out = tmp_path / "out"
    results = main(
        dataset_args(tiny_model_dir, news_folder, out, "--eval_strategy", "no", "--ignore_mismatched_sizes")
    )
    assert results["global_step"] == 4 and "eval_accuracy" not in results


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--dataset_name", "{folder}/train.parquet"], "train.parquet is a file: give it as --train_file"),
        (["--dataset_name", "./no/such/folder"], "--dataset_name ./no/such/folder: no such folder"),
        (
            ["--train_file", "{folder}/train.parquet"],
            "--dataset_name and local files (--train_file, ...) name two",
        ),
        (["--validation_split_name", "train"], "--validation_split_name train is the training split"),
    ],
)
def test_dataset_flags_that_would_be_ignored_or_misread_are_refused(
    tiny_model_dir, news_folder, tmp_path, capsys, flags, message
):
    flags = [f.format(folder=news_folder) for f in flags]
    capsys.readouterr()
    assert cli(dataset_args(tiny_model_dir, news_folder, tmp_path / "out", *flags)) == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_split_files_with_other_class_label_orders_are_refused(tiny_model_dir, tmp_path, capsys):
    """The same id would be another label in each file: it trained to a loss near 0 and scored 0."""
    for split, names in (("train", ["neg", "pos"]), ("validation", ["pos", "neg"])):
        features = Features({"text": Value("string"), "label": ClassLabel(names=names)})
        rows = {"text": [f"row {i}" for i in range(8)], "label": [i % 2 for i in range(8)]}
        Dataset.from_dict(rows, features=features).to_parquet(tmp_path / f"{split}.parquet")
    files = {"train": tmp_path / "train.parquet", "validation": tmp_path / "validation.parquet"}
    flags = ["--task_name", "custom", "--text_columns", "text", "--ignore_mismatched_sizes"]
    capsys.readouterr()
    assert cli(tiny_args(tiny_model_dir, files, tmp_path / "out", *flags)) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {files['validation']}: its ClassLabel names ['pos', 'neg'] are not those of "
        f"{files['train']} ['neg', 'pos']; save the splits with one ClassLabel"
    )

"""Rows a run can't learn from, and labels as users write them (issue 32, cases 3, 5, 6, 7): named in
one line before any training, or merged with a notice; class weights recorded beside their labels."""

from __future__ import annotations

import csv
import json
import re

import pytest

from finetune.config.train_config import TrainConfig
from finetune.data.splits import load_splits
from finetune.errors import ConfigError


def write_rows(path, rows: list[dict]) -> str:
    if path.suffix == ".csv":
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def load(train: str, **flags):
    flags = {
        "task_name": "custom",
        "text_columns": "text",
        "train_file": train,
        "validation_file": train,
        **flags,
    }
    return load_splits(TrainConfig(**flags))


def test_labels_that_differ_only_in_case_or_spaces_are_one_class(tmp_path):
    cells = ["positive", "Positive", "negative", " positive ", "neutral", "positive"]
    task, splits = load(
        write_rows(tmp_path / "t.jsonl", [{"text": f"r{i}", "label": c} for i, c in enumerate(cells)])
    )
    assert task.label_names == ("negative", "neutral", "positive")  # as most rows write it
    assert splits["train"]["label"] == [2, 2, 0, 2, 1, 2]
    assert "one class: Positive = positive" in task.summary()


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_one_float_among_integer_labels_is_refused_naming_the_row(tmp_path, suffix):
    rows = [{"text": f"r{i}", "label": label} for i, label in enumerate([0, 1, 2, 1, 2.0, 0])]
    with pytest.raises(ConfigError) as refused:
        load(write_rows(tmp_path / f"t{suffix}", rows))
    assert "row 4 has the label 2.0 among integer labels" in str(refused.value)
    assert "write it as an integer" in refused.value.fix
    # All floats stay a regression; all integers are classes.
    floats = [{"text": f"r{i}", "label": float(i % 3)} for i in range(6)]
    assert load(write_rows(tmp_path / f"f{suffix}", floats))[0].is_regression
    ints = [{"text": f"r{i}", "label": i % 3} for i in range(6)]
    assert load(write_rows(tmp_path / f"i{suffix}", ints))[0].label_names == ("0", "1", "2")


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"text": None, "label": "a"}, "row 2 has no text in 'text' (missing or null)"),
        ({"label": "a"}, "row 2 has no text in 'text' (missing or null)"),
        ({"text": "   ", "label": "a"}, "row 2 has empty text in 'text'"),
    ],
)
def test_a_row_without_text_is_refused_naming_it(tmp_path, row, expected):
    rows = [{"text": "good", "label": "a"}, {"text": "bad", "label": "b"}, row]
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load(write_rows(tmp_path / "t.jsonl", rows))


def test_a_prediction_row_without_text_is_refused_and_one_empty_side_of_a_pair_is_kept(tmp_path):
    good = write_rows(tmp_path / "t.jsonl", [{"a": "x", "b": "y", "label": c} for c in "ab"])
    test = write_rows(
        tmp_path / "test.jsonl", [{"a": "x", "b": "y"}, {"a": "", "b": "y"}, {"a": " ", "b": ""}]
    )
    with pytest.raises(ConfigError, match=r"test\.jsonl: row 2 has empty text in 'a' and 'b'"):
        load(good, text_columns="a,b", do_predict=True, test_file=test)
    one_side = write_rows(tmp_path / "one.jsonl", [{"a": "x", "b": "y"}, {"a": "", "b": "y"}])
    _, splits = load(good, text_columns="a,b", do_predict=True, test_file=one_side)
    assert len(splits["test"]) == 2


def test_a_folder_of_mixed_formats_is_one_whole_line(tmp_path):
    """datasets' own sentence is long: the line keeps whole words and still ends with the fix."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    write_rows(folder / "train.jsonl", [{"text": "a", "label": "x"}, {"text": "b", "label": "y"}])
    write_rows(folder / "validation.csv", [{"text": "a", "label": "x"}, {"text": "b", "label": "y"}])
    with pytest.raises(ConfigError) as refused:
        load_splits(TrainConfig(task_name="custom", text_columns="text", dataset_name=str(folder)))
    message = str(refused.value)
    assert (
        refused.value.fix
        == "give a folder of data files of one format (.jsonl, .csv, .parquet) named by split"
    )
    detail = message.split("cannot load it (", 1)[1].rsplit("); ", 1)[0]
    assert detail.endswith(("('csv', {})}", "('json', {})}", " ...")), detail  # whole, or cut between words


def test_a_null_after_a_column_of_numbers_is_still_found(tmp_path):
    rows = [
        {"id": 1, "text": "a", "label": "x"},
        {"id": 2, "text": "b", "label": "y"},
        {"id": 3, "label": "x"},
    ]
    with pytest.raises(ConfigError, match=re.escape("row 2 has no text in 'text' (missing or null)")):
        load(write_rows(tmp_path / "t.jsonl", rows), text_columns="id,text")

"""GLUE tasks' columns and task flag mistakes, without a run. Runs of each task: tests/e2e/test_tasks.py."""

import json

import pytest

from finetune.data.tasks import GLUE_TASKS
from tests.helpers import refused


def test_the_other_glue_tasks_load_with_their_columns(tmp_path):
    """qnli, rte, wnli and mnli: their own column names and label names, read from local files."""
    from finetune.config.train_config import TrainConfig
    from finetune.data.splits import load_splits

    for name in ("qnli", "rte", "wnli", "mnli"):
        task = GLUE_TASKS[name]
        rows = [{task.text_columns[0]: "a b", task.text_columns[1]: "c", "label": task.label_names[-1]}] * 3
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        loaded, splits = load_splits(
            TrainConfig(task_name=name, train_file=str(path), validation_file=str(path))
        )
        assert loaded == task
        assert splits["train"]["label"] == [len(task.label_names) - 1] * 3
        assert set(splits) == {"train", *task.validation_splits[:1]}


@pytest.mark.parametrize(
    ("flags", "flag", "fix"),
    [
        (["--task_name", "sst3"], "--task_name", "choose one of cola, sst2,"),
        (["--task_name", "custom"], "--task_name", "--text_columns"),
        (
            ["--task_name", "sst2", "--validation_mismatched_file", "x.jsonl"],
            "--validation_mismatched_file",
            None,
        ),
        (["--text_columns", "a,b,c"], "--text_columns", "takes 1 or 2"),
        (["--push_to_hub"], "--push_to_hub", None),
        (["--do_train", "false", "--train_file", "t.jsonl"], "--do_train", "--validation_file"),
        (
            ["--do_predict", "--train_file", "t.jsonl", "--validation_file", "v.jsonl"],
            "--do_predict",
            "--test_file",
        ),
    ],
)
def test_task_flag_mistakes(flags, flag, fix, tmp_path, monkeypatch):
    from finetune.config.parser import parse_config

    monkeypatch.chdir(tmp_path)  # the files named exist: paths are checked before how they combine
    for name in ("t.jsonl", "v.jsonl", "x.jsonl"):
        (tmp_path / name).write_text('{"sentence": "a", "label": 0}\n')
    with refused(flag, fix):
        parse_config(flags)

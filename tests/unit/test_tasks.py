"""GLUE tasks' columns and task flag mistakes, without a run. Runs of each task: tests/e2e/test_tasks.py."""

import json

import pytest

from finetune.data.tasks import GLUE_TASKS
from finetune.errors import ConfigError


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
    ("flags", "message"),
    [
        (["--task_name", "sst3"], "--task_name: invalid choice: .sst3. \\(choose from .cola., .sst2."),
        (["--task_name", "custom"], "--task_name custom needs --text_columns"),
        (["--task_name", "sst2", "--validation_mismatched_file", "x.jsonl"], "for MNLI only"),
        (["--text_columns", "a,b,c"], "--text_columns takes 1 or 2"),
        (["--push_to_hub"], "--push_to_hub needs the Hub; HF_HUB_OFFLINE is set"),
        (["--do_train", "false", "--train_file", "t.jsonl"], "--do_train false: give --validation_file"),
        (
            ["--do_predict", "--train_file", "t.jsonl", "--validation_file", "v.jsonl"],
            "--do_predict .* --test_file",
        ),
    ],
)
def test_task_flag_mistakes(flags, message):
    from finetune.config.parser import parse_config

    with pytest.raises(ConfigError, match=message):
        parse_config(flags)

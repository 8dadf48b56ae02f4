"""A refusal carries the flag and the fix as fields (errors.ConfigError), so callers and tests need not
parse its wording; these are the fields of the refusals a user meets first."""

from __future__ import annotations

import pytest

from finetune.config.parser import parse_config
from finetune.errors import ConfigError

GOOD = ["--train_file", "t.jsonl", "--validation_file", "v.jsonl"]


@pytest.mark.parametrize(
    ("argv", "flag", "fix"),
    [
        (["--learning_rate", "0"], "--learning_rate", "--learning_rate must be > 0"),
        (["--warmup_ratio", "1.5"], "--warmup_ratio", "--warmup_ratio must be in [0, 1)"),
        (["--max_steps", "10"], "--max_steps", "use --max_train_steps N"),
        (["--learning_rte", "1"], "--learning_rte", "see --help for the flags"),
        (
            ["--overwrite_output_dir", "--resume_from_checkpoint", "auto"],
            "--overwrite_output_dir",
            "give one",
        ),
        (["--eval_steps", "5"], "--eval_steps", "add --eval_strategy steps or drop --eval_steps"),
        (["--task_name", "custom"], "--task_name", "--task_name needs --text_columns"),
        (["--lora_target_modules", "all-linear", "query"], "--lora_target_modules", "give all-linear alone"),
        (["--text_columns", "a,b,c"], "--text_columns", "--text_columns takes 1 or 2 comma-separated names"),
        (
            ["--torch_dtype", "float16"],
            "--torch_dtype",
            "use float32 with --mixed_precision fp16, or bfloat16",
        ),
        (["--eval_strategy", "no", "--load_best_model_at_end"], "--load_best_model_at_end", "steps or epoch"),
        (
            ["--validation_file", "v.xlsx"],
            "--validation_file",
            "use one of .jsonl, .json, .csv, .tsv, .parquet",
        ),
    ],
)
def test_a_refusal_names_the_flag_and_the_fix(argv, flag, fix):
    with pytest.raises(ConfigError) as refused:
        parse_config([*GOOD, *argv])
    assert refused.value.flag == flag
    assert fix in refused.value.fix


def test_explicit_fields_win_over_the_wording():
    error = ConfigError("the file x.csv: no label column", flag="--label_column", fix="name the column")
    assert (error.flag, error.fix, str(error)) == (
        "--label_column",
        "name the column",
        "the file x.csv: no label column",
    )

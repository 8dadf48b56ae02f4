"""LoRA's flags checked at parse time. LoRA runs: tests/e2e/test_lora.py."""

import pytest

from finetune.errors import ConfigError


def test_lora_flags_are_checked():
    for flags, message in [
        (["--lora_r", "0"], "--lora_r and --lora_alpha must be positive"),
        (["--lora_dropout", "1"], r"--lora_dropout must be in \[0, 1\)"),
        (["--lora_target_modules", "all-linear", "query"], "--lora_target_modules: give all-linear alone"),
        (["--use_peft", "--do_train", "false"], "--use_peft trains new adapters, --do_train false trains"),
    ]:
        with pytest.raises(ConfigError, match=message):
            from finetune.config.parser import parse_config

            parse_config(["--train_file", "a.jsonl", "--validation_file", "b.jsonl", *flags])

"""LoRA's flags checked at parse time. LoRA runs: tests/e2e/test_lora.py."""

from tests.helpers import refused


def test_lora_flags_are_checked():
    for flags, flag, fix in [
        (["--lora_r", "0"], "--lora_r", "must be positive"),
        (["--lora_dropout", "1"], "--lora_dropout", "in [0, 1)"),
        (["--lora_target_modules", "all-linear", "query"], "--lora_target_modules", "give all-linear alone"),
        (["--use_peft", "--do_train", "false"], "--use_peft", None),
    ]:
        with refused(flag, fix):
            from finetune.config.parser import parse_config

            parse_config(["--train_file", "a.jsonl", "--validation_file", "b.jsonl", *flags])

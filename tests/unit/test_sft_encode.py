"""The causal-LM encoding's cache key: whatever decides the tokens, the EOS id that ends each text row
included, makes a new key, so a changed tokenizer never reads rows encoded for another."""

from __future__ import annotations

import copy

from accelerate import Accelerator

from finetune.config.train_config import TrainConfig
from finetune.data.sources import load_data_file
from finetune.families.causal_lm.data import LmTask, encode_splits
from tests.chat_models import IM_START, chatml_tokenizer


def test_a_changed_eos_token_is_a_new_encoding_not_the_cached_one(tmp_path):
    config = TrainConfig(task_type="causal_lm", train_file=str(tmp_path / "t.jsonl"),
                         validation_file=str(tmp_path / "v.jsonl"), max_length=32)  # fmt: skip
    (tmp_path / "t.jsonl").write_text('{"text": "red green"}\n{"text": "blue"}\n')
    rows = load_data_file(str(tmp_path / "t.jsonl"), ())  # file-backed: datasets caches what it maps
    first = chatml_tokenizer()
    second = copy.deepcopy(first)
    second.eos_token = IM_START  # as a user fixing a base model's tokenizer_config.json would
    encoded = [
        encode_splits(
            LmTask("text", "every token"), {"train": rows}, tokenizer, config, Accelerator(cpu=True)
        )
        for tokenizer in (first, second)
    ]
    ends = [[ids[-1] for ids in split["train"]["input_ids"]] for split in encoded]
    assert ends == [[first.eos_token_id] * 2, [second.eos_token_id] * 2]
    assert first.eos_token_id != second.eos_token_id

"""--pad_to_multiple_of: few batch shapes for compiled code, CPU batches as before by default."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from finetune.config.train_config import TrainConfig
from finetune.data.batching import PadCollator, VarlenCollator, resolve_pad_to_multiple_of
from finetune.errors import ConfigError
from tests.helpers import minilm_dir, refused


def features(*lengths: int) -> list[dict]:
    return [
        {
            "input_ids": list(range(1, n + 1)),
            "token_type_ids": [0] * n,
            "attention_mask": [1] * n,
            "labels": i,
        }
        for i, n in enumerate(lengths)
    ]


def test_cpu_pads_to_the_longest_pair_and_cuda_to_a_multiple_of_8_by_default():
    assert resolve_pad_to_multiple_of("auto", on_gpu=False) == "1"
    assert resolve_pad_to_multiple_of("auto", on_gpu=True) == "8"
    assert resolve_pad_to_multiple_of("32", on_gpu=False) == "32"
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    assert PadCollator(tokenizer, 1, 128)(features(5, 37))["input_ids"].shape == (2, 37)


def test_buckets_are_multiples_capped_at_max_length():
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    collate = PadCollator(tokenizer, 32, 100)
    widths = {n: collate(features(3, n))["input_ids"].shape[1] for n in (5, 32, 33, 90, 97, 100)}
    assert widths == {5: 32, 32: 32, 33: 64, 90: 96, 97: 100, 100: 100}


@pytest.mark.parametrize("value", ["0", "-8", "eight"])
def test_bad_pad_to_multiple_of_is_refused(value):
    with refused("--pad_to_multiple_of", "positive integer or auto"):
        TrainConfig(pad_to_multiple_of=value)


def test_varlen_batch_packs_real_tokens_with_their_bounds():
    """Three pairs of 3, 5 and 2 tokens, buckets of 4: one row of 10 real tokens and 2 padding ones
    (a multiple of 4 x 3 pairs) in 3 padding segments (1, 1, 0), positions restarting in every
    segment, bounds built on the CPU, the kernel's longest segment fixed at --max_length."""
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    batch = VarlenCollator(tokenizer, 4, max_length=64, position_offset=0)(features(3, 5, 2))
    assert batch["input_ids"].shape == (1, 12)
    assert batch["input_ids"][0].tolist() == [1, 2, 3, 1, 2, 3, 4, 5, 1, 2] + [tokenizer.pad_token_id] * 2
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 0, 0]
    assert batch["attention_mask"].sum() == 10
    assert batch["cu_seq_lens_q"].tolist() == [0, 3, 8, 10, 11, 12, 12]
    assert batch["cu_seq_lens_q"].dtype == torch.int32
    assert batch["max_length_q"] == 64
    assert batch["labels"].tolist() == [0, 1, 2]
    shapes = {
        VarlenCollator(tokenizer, 4, 64)(features(*n))["input_ids"].shape for n in [(3, 5, 2), (4, 4, 4)]
    }
    assert shapes == {(1, 12)}
    exact = VarlenCollator(tokenizer, 1, 64)(features(3, 5, 2))
    assert exact["input_ids"].shape == (1, 10)
    assert exact["cu_seq_lens_q"].tolist() == [0, 3, 8, 10, 10, 10, 10]


def test_evaluation_batch_defaults_to_the_devices_and_keeps_the_tokens_per_batch():
    """--per_device_eval_batch_size unset: 256 pairs on CUDA and 64 on CPU at --max_length 128, fewer for
    longer rows (the same tokens per batch, at least 8); a given batch is kept on every device."""
    from finetune.config.resolved import eval_batch_size

    assert eval_batch_size(TrainConfig(), "cuda") == 256
    assert eval_batch_size(TrainConfig(), "cpu") == 64
    assert eval_batch_size(TrainConfig(max_length=512), "cuda") == 64
    assert eval_batch_size(TrainConfig(max_length=8192), "cpu") == 8
    assert eval_batch_size(TrainConfig(per_device_eval_batch_size=12), "cuda") == 12
    with pytest.raises(ConfigError) as refused:
        TrainConfig(per_device_eval_batch_size=0)
    assert refused.value.flag == "--per_device_eval_batch_size"

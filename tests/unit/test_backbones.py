"""Loading flags of any backbone, without a run: dtype rules and refusals of half-precision weights.

Each family's runs: tests/e2e/test_backbones.py."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForSequenceClassification,
)

from finetune.config.train_config import TrainConfig
from finetune.model.options import loading_options, refuse_checkpoint_dtype
from tests.helpers import SHARED_MNLI, refused

pytestmark = pytest.mark.skipif(not SHARED_MNLI.is_dir(), reason="the decoders' BPE trains on shared MNLI")


def test_bfloat16_weights_are_refused_where_the_device_has_no_bf16():
    config = TrainConfig(torch_dtype="bfloat16")
    with refused("--torch_dtype", "float32"):
        loading_options(config, "cuda", bf16_native=False)
    assert loading_options(config, "cuda", bf16_native=True)["dtype"] is torch.bfloat16
    assert loading_options(TrainConfig(), "cpu", bf16_native=False)["dtype"] is torch.float32  # the default


def test_float16_weights_are_for_inference_only():
    with refused("--torch_dtype", "use float32"):
        TrainConfig(torch_dtype="float16")
    inference = TrainConfig(torch_dtype="float16", do_train=False, validation_file="v.jsonl")
    assert inference.torch_dtype == "float16"


def test_auto_dtype_follows_the_rules_of_an_explicit_one(half_precision_bert):
    """--torch_dtype auto takes the checkpoint's dtype, and refuses what the explicit dtype would."""
    config = TrainConfig(torch_dtype="auto", model_name_or_path="m")
    bf16 = AutoModelForSequenceClassification.from_pretrained(
        half_precision_bert[torch.bfloat16], dtype="auto"
    )
    with refused("--torch_dtype"):
        refuse_checkpoint_dtype(bf16, config, "cpu", bf16_native=False)
    refuse_checkpoint_dtype(bf16, config, "cpu", bf16_native=True)
    refuse_checkpoint_dtype(bf16.float(), config, "cpu", bf16_native=False)

"""Every CPU-dependent `auto` under the probes of every CPU class this project's machines come in.

The rules read the CPU through one probe point, `finetune.speed.hardware.cpu_features`; here it answers
as each class would, so each class's choices are checked on any machine. The e2e tests take their
expectations from the same rules applied to the machine they run on, never from one CPU class.
"""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from finetune.config.resolved import eval_batch_size
from finetune.config.train_config import TrainConfig
from finetune.distributed.accelerator import resolve_mixed_precision
from finetune.speed import hardware
from finetune.speed.hardware import CpuFeatures, cpu_class
from finetune.speed.malloc import resolve_keep_freed_memory
from finetune.speed.packed_dropout import resolve_dropout_kernel
from finetune.speed.padding_free import resolve_padding_free

CLASSES = {
    "AMX": CpuFeatures(amx=True, avx512_bf16=True, avx512=True, avx2=True),  # Sapphire Rapids and later Xeons
    "AVX512-BF16": CpuFeatures(
        amx=False, avx512_bf16=True, avx512=True, avx2=True
    ),  # Zen 4, Zen 5, Cooper Lake
    "AVX-512": CpuFeatures(amx=False, avx512_bf16=False, avx512=True, avx2=True),  # Skylake to Ice Lake Xeons
    "AVX2": CpuFeatures(amx=False, avx512_bf16=False, avx512=False, avx2=True),  # Zen 2, Zen 3
}

# What each class resolves for a BERT encoder on CPU with every flag at its default. bf16 only where the
# CPU multiplies it natively (emulated bf16 trains 2-4x slower than fp32); keeping freed memory pays in
# bf16 only; padding-free pays except where AMX makes padded matmuls cheap (docs/benchmarks.md).
EXPECTED = {
    "AMX": {"mixed_precision": "bf16", "keep_freed_memory": "true", "padding_free": "false"},
    "AVX512-BF16": {"mixed_precision": "bf16", "keep_freed_memory": "true", "padding_free": "true"},
    "AVX-512": {"mixed_precision": "no", "keep_freed_memory": "false", "padding_free": "true"},
    "AVX2": {"mixed_precision": "no", "keep_freed_memory": "false", "padding_free": "true"},
}


@pytest.fixture
def bert():
    config = BertConfig(
        vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8
    )
    return BertForSequenceClassification(config)


@pytest.mark.parametrize("name", CLASSES)
def test_each_cpu_class_resolves_every_cpu_rule(name, bert, monkeypatch):
    monkeypatch.setattr(hardware, "cpu_features", lambda: CLASSES[name])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    # What every AVX-512 CPU answers, native bf16 or not: not the signal to go by.
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    precision = resolve_mixed_precision("auto")
    resolved = {
        "mixed_precision": precision,
        "keep_freed_memory": resolve_keep_freed_memory("auto", "cpu", precision),
        "padding_free": resolve_padding_free(TrainConfig(), bert, "cpu"),
    }
    assert resolved == EXPECTED[name]
    assert cpu_class() == name
    # The same on every class: packed dropout wherever the architecture takes it, and the CPU's
    # evaluation batch.
    assert resolve_dropout_kernel("auto", "cpu", bert) == "packed"
    assert eval_batch_size(TrainConfig(), "cpu") == 64
    # Flags the user set win on every class.
    assert resolve_mixed_precision("no") == "no"
    assert resolve_padding_free(TrainConfig(padding_free="false"), bert, "cpu") == "false"
    assert resolve_keep_freed_memory("true", "cpu", "no") == "true"


@pytest.mark.parametrize("name", CLASSES)
def test_a_launcher_that_asks_for_a_precision_wins_on_every_class(name, monkeypatch):
    monkeypatch.setattr(hardware, "cpu_features", lambda: CLASSES[name])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert resolve_mixed_precision("auto") == "bf16"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")  # a config without one leaves it to auto
    assert resolve_mixed_precision("auto") == EXPECTED[name]["mixed_precision"]

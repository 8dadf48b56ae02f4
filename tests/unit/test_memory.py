"""Gradient checkpointing trains layers behind frozen embeddings (as under LoRA), in process.

Runs with memory controls: tests/e2e/test_memory.py."""

from __future__ import annotations

import torch
from transformers import AutoModelForSequenceClassification

from finetune.speed.memory import enable_gradient_checkpointing
from tests.helpers import (
    without_dropout,
)


def test_gradient_checkpointing_trains_layers_behind_frozen_embeddings(tiny_model_dir, tmp_path):
    # Under LoRA no input of a checkpointed layer requires grad; reentrant checkpointing would then
    # give the layers no gradient at all.
    model = AutoModelForSequenceClassification.from_pretrained(
        without_dropout(tiny_model_dir, tmp_path / "m")
    )
    enable_gradient_checkpointing(model)
    model.train()
    model.get_input_embeddings().weight.requires_grad_(False)
    batch = {"input_ids": torch.randint(1000, 2000, (2, 9)), "labels": torch.tensor([0, 2])}
    model(**batch).loss.backward()
    assert model.is_gradient_checkpointing
    layer_grads = [p.grad for n, p in model.named_parameters() if ".layer." in n]
    assert layer_grads and all(g is not None and g.abs().sum() > 0 for g in layer_grads)
    assert model.get_input_embeddings().weight.grad is None

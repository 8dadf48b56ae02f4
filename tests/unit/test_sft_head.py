"""The output layer at the target tokens only (`batches.head_at`): the same summed loss, per-row losses and
gradients as every token's logits, for plain and packed batches; a model whose output layer is not the
logits' last step keeps its full logits."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from finetune.families.causal_lm.batches import (
    POSITIONS,
    CausalLmCollator,
    head_at,
    heads_at_targets,
    row_losses,
    target_loss,
)
from finetune.families.causal_lm.conversations import IGNORE
from tests.chat_models import build_tiny_lm


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    return AutoModelForCausalLM.from_pretrained(
        build_tiny_lm("llama", tmp_path_factory.mktemp("head") / "llama")
    )


def batch_of(rows: int = 5, seed: int = 0) -> dict:
    """Rows of varied lengths, each with a prompt that is no target: padded on the right by the collator."""
    rng = random.Random(seed)
    features = []
    for _ in range(rows):
        length, prompt = rng.randint(4, 20), rng.randint(1, 3)
        ids = [rng.randint(5, 60) for _ in range(length)]
        features.append({"input_ids": ids, "labels": [IGNORE] * prompt + ids[prompt:]})
    return CausalLmCollator(pad_token_id=0)(features)


def loss_and_grads(model, batch: dict, hooked: bool):
    model.zero_grad()
    labels, positions = batch["labels"], batch[POSITIONS]
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with head_at(model if hooked else None, positions):
        logits = model(**inputs).logits
    summed, count = target_loss(logits, labels, positions)
    summed.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    with torch.no_grad(), head_at(model if hooked else None, positions):
        per_row = row_losses(model(**inputs).logits, labels, positions)
    return logits.shape, float(summed), float(count), grads, per_row


def test_the_output_layer_at_the_targets_gives_the_same_losses_and_gradients(tiny_lm):
    assert heads_at_targets(tiny_lm)
    batch = batch_of()
    targets = int((batch["labels"] != IGNORE).sum())
    full, trimmed = loss_and_grads(tiny_lm, batch, hooked=False), loss_and_grads(tiny_lm, batch, hooked=True)
    assert full[0] == (*batch["input_ids"].shape, tiny_lm.config.vocab_size)
    assert trimmed[0] == (1, targets, tiny_lm.config.vocab_size)  # only the targets' logits were made
    assert trimmed[1] == pytest.approx(full[1], rel=1e-6) and trimmed[2] == full[2] == targets
    assert full[3].keys() == trimmed[3].keys()
    for name, grad in full[3].items():
        torch.testing.assert_close(trimmed[3][name], grad, rtol=1e-5, atol=1e-7, msg=name)
    torch.testing.assert_close(trimmed[4][0], full[4][0], rtol=1e-6, atol=1e-9)
    assert torch.equal(trimmed[4][1], full[4][1])


def test_an_output_layer_that_is_not_the_logits_last_step_keeps_every_tokens_logits(tiny_lm, monkeypatch):
    """Here the layer `get_output_embeddings` names is not the one the forward calls: the hook never runs,
    the check sees every token's logits, and the model keeps them."""
    elsewhere = torch.nn.Linear(tiny_lm.config.hidden_size, tiny_lm.config.vocab_size, bias=False)
    monkeypatch.setattr(tiny_lm, "get_output_embeddings", lambda: elsewhere)
    assert not heads_at_targets(tiny_lm)
    monkeypatch.setattr(tiny_lm, "get_output_embeddings", lambda: None)
    assert not heads_at_targets(tiny_lm)


def test_the_check_passes_for_an_attention_that_runs_only_on_the_gpu(tiny_lm):
    """The check runs before the model reaches its device: an attention kernel that refuses CPU tensors
    (as flash attention does) must not turn the output layer back to every token, and the model keeps
    the attention it asked for."""
    from transformers import AttentionInterface

    def cuda_only(*args, **kwargs):
        raise RuntimeError("FlashAttention only supports CUDA tensors")

    AttentionInterface.register("test_cuda_only", cuda_only)
    asked = tiny_lm.config._attn_implementation
    tiny_lm.config._attn_implementation = "test_cuda_only"
    try:
        assert heads_at_targets(tiny_lm)
        assert tiny_lm.config._attn_implementation == "test_cuda_only"
    finally:
        tiny_lm.config._attn_implementation = asked

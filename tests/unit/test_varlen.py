"""--padding_free varlen: packed real tokens, attention per pair; the same function as the padded model."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoTokenizer, RobertaConfig, RobertaForSequenceClassification

from finetune.data.batching import PadCollator, VarlenCollator
from finetune.speed.attention import use_varlen_attention, varlen_position_offset


def pairs(tokenizer):
    texts = [
        ("A man plays a guitar on the corner of a busy street.", "A person makes music."),
        ("Two dogs run.", "Animals are asleep in a basket by the fire."),
        ("The sign is half open.", "A sign."),
    ]
    return [{**tokenizer(a, b), "labels": i} for i, (a, b) in enumerate(texts)]


def logits_and_grads(model, batch):
    model.zero_grad()
    labels = batch.pop("labels")
    logits = model(**batch).logits
    torch.nn.functional.cross_entropy(logits, labels).backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def tiny_roberta(tokenizer):
    config = RobertaConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=64, max_position_embeddings=130,
                           num_labels=3, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    return RobertaForSequenceClassification(config)


@pytest.mark.parametrize("architecture", ["bert", "roberta"])
def test_varlen_logits_and_gradients_equal_the_padded_models(architecture, tiny_model_dir):
    """Pairs of different lengths, buckets of 8 (so padding segments exist too): the packed model
    (CPU reference attention in place of torch's CUDA kernel) gives the padded model's logits and
    gradients. Dropout off: torch's kernel has no attention dropout."""
    from transformers import AutoModelForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    if architecture == "bert":
        padded = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir)
    else:
        padded = tiny_roberta(tokenizer)
    padded.eval()
    packed = copy.deepcopy(padded)
    use_varlen_attention(packed)
    features = pairs(tokenizer)
    padded_batch = PadCollator(tokenizer, 8, 64)(copy.deepcopy(features))
    varlen_batch = VarlenCollator(tokenizer, 8, 64, varlen_position_offset(packed))(copy.deepcopy(features))
    assert varlen_batch["attention_mask"].sum() < varlen_batch["input_ids"].shape[1]  # padding segments too
    expected_logits, expected_grads = logits_and_grads(padded, padded_batch)
    logits, grads = logits_and_grads(packed, varlen_batch)
    torch.testing.assert_close(logits, expected_logits, atol=1e-5, rtol=1e-4)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_varlen_on_cuda_in_fp32_is_refused_before_training(tiny_model_dir):
    """torch's CUDA varlen kernel (FlashAttention) takes bf16/fp16 only: fp32 attention is refused with
    the flag and the fix, instead of failing at the first forward; bf16 and CPU runs pass."""
    from transformers import AutoModelForSequenceClassification

    from finetune.errors import ConfigError
    from finetune.speed.attention import check_varlen_precision

    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir)
    with pytest.raises(ConfigError) as refused:
        check_varlen_precision(model, "cuda", "no")
    assert refused.value.flag == "--padding_free" and "--mixed_precision bf16" in refused.value.fix
    check_varlen_precision(model, "cuda", "bf16")
    check_varlen_precision(model.to(torch.bfloat16), "cuda", "no")
    check_varlen_precision(model, "cpu", "no")

"""Packed dropout: the masks torch's dropout would draw in distribution, from the same generator."""

import math

import pytest
import torch
from torch import nn
from transformers import BertConfig, BertForSequenceClassification

from finetune.speed.packed_dropout import LEVELS, PackedDropout, packed_dropout, use_packed_dropout


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_drops_a_fraction_p_independently_and_keeps_the_mean(p):
    torch.manual_seed(0)
    out = packed_dropout(torch.ones(1000, 1000), p)
    dropped = round(p * LEVELS)
    rate = dropped / LEVELS
    assert abs(rate - p) <= 0.5 / LEVELS
    zero = out == 0
    sigma = math.sqrt(rate * (1 - rate) / out.numel())
    assert abs(zero.float().mean().item() - rate) < 5 * sigma
    assert torch.equal(out[~zero], torch.full_like(out[~zero], LEVELS / (LEVELS - dropped)))
    # Neighbours share a 64-bit draw: their masks must still be independent (both dropped: p^2).
    both = (zero[:, :-1] & zero[:, 1:]).float().mean().item()
    assert abs(both - rate**2) < 5 * math.sqrt(rate**2 * (1 - rate**2) / zero[:, 1:].numel())
    assert abs(out.mean().item() - 1) < 0.01


def test_masks_follow_torch_seed_and_differ_between_calls():
    x = torch.ones(64, 40)
    torch.manual_seed(3)
    first, second = packed_dropout(x, 0.1), packed_dropout(x, 0.1)
    torch.manual_seed(3)
    assert torch.equal(packed_dropout(x, 0.1), first)
    assert not torch.equal(first, second)


def test_gradient_flows_through_kept_elements_only():
    x = torch.randn(32, 24, requires_grad=True)
    out = packed_dropout(x, 0.3)
    out.sum().backward()
    kept = out != 0
    assert torch.equal(x.grad[~kept], torch.zeros_like(x.grad[~kept]))
    scale = LEVELS / (LEVELS - round(0.3 * LEVELS))
    assert torch.allclose(x.grad[kept], torch.full_like(x.grad[kept], scale))


def test_edge_probabilities_and_evaluation_mode():
    x = torch.randn(8, 8)
    assert packed_dropout(x, 0.0) is x
    assert torch.equal(packed_dropout(x, 1.0), torch.zeros_like(x))
    assert PackedDropout(0.5).eval()(x) is x


def tiny_bert(**overrides) -> BertForSequenceClassification:
    config = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, num_labels=3, **overrides,
    )  # fmt: skip
    torch.manual_seed(0)
    return BertForSequenceClassification(config)


def padded_batch() -> dict:
    torch.manual_seed(1)
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[0, 5:] = mask[2, 9:] = 0
    return {"input_ids": torch.randint(0, 100, (4, 12)), "attention_mask": mask}


def test_swapped_model_keeps_its_weights_and_evaluates_identically():
    reference, model = tiny_bert(), tiny_bert().eval()  # as from_pretrained returns it
    use_packed_dropout(model)
    assert not any(m.training for m in model.modules())
    assert not [m for m in model.modules() if type(m) is nn.Dropout]
    assert all(m.p == 0.1 for m in model.modules() if isinstance(m, PackedDropout))
    assert model.state_dict().keys() == reference.state_dict().keys()
    batch = padded_batch()
    with torch.no_grad():
        assert torch.allclose(model.eval()(**batch).logits, reference.eval()(**batch).logits, atol=1e-6)


def test_training_attention_is_the_same_function_with_padding():
    """Dropout below 1/65536 drops nothing but still takes the training path (explicit softmax over
    scores plus the additive padding mask): it must equal torch's fused attention in evaluation."""
    reference = tiny_bert(hidden_dropout_prob=0.0)
    model = tiny_bert(hidden_dropout_prob=0.0, attention_probs_dropout_prob=1e-9)
    use_packed_dropout(model)
    batch = padded_batch()
    with torch.no_grad():
        trained_path = model.train()(**batch).logits
        assert torch.allclose(trained_path, reference.eval()(**batch).logits, atol=1e-5)


def test_training_mode_drops_in_attention_and_hidden_states():
    model = tiny_bert()
    use_packed_dropout(model)
    batch = padded_batch()
    with torch.no_grad():
        evaluated = model.eval()(**batch).logits
        torch.manual_seed(5)
        a = model.train()(**batch).logits
        torch.manual_seed(5)
        b = model(**batch).logits
    assert torch.equal(a, b) and not torch.allclose(a, evaluated)


def test_lora_adapters_draw_their_dropout_packed_on_cpu(tiny_model_dir):
    """peft's `lora_dropout` is a plain nn.Dropout on every adapted layer's input; left to torch's
    draws it made a CPU LoRA step slower than full fine-tuning. build_model packs it too."""
    from accelerate import Accelerator

    from finetune.config.parser import parse_config
    from finetune.data.tasks import Task
    from finetune.families.sequence_classification.model import build_model

    args = parse_config(["--model_name_or_path", str(tiny_model_dir), "--train_file", "a.jsonl",
                         "--validation_file", "b.jsonl", "--use_peft", "--lora_dropout", "0.1"])  # fmt: skip
    task = Task("nli", ("premise", "hypothesis"), ("entailment", "neutral", "contradiction"), ("accuracy",))
    model, _, _, speed = build_model(args, task, Accelerator(cpu=True), {}, bf16_native=False)
    lora_dropouts = [m for name, m in model.named_modules() if "lora_dropout." in name]
    assert speed["dropout_kernel"] == "packed" and lora_dropouts
    assert all(type(m) is PackedDropout and m.p == 0.1 for m in lora_dropouts)
    assert not [m for m in model.modules() if type(m) is nn.Dropout]

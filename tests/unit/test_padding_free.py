"""Padding-free encoders: the same function as the padded model, computed on real tokens only."""

import pytest
import torch
from transformers import (
    AutoModelForSequenceClassification,
    BertConfig,
    DistilBertConfig,
    ElectraConfig,
    RobertaConfig,
    XLMRobertaConfig,
)

from finetune.config.train_config import TrainConfig
from finetune.errors import ConfigError
from finetune.speed.packed_dropout import use_packed_dropout
from finetune.speed.padding_free import resolve_padding_free, supports_padding_free, use_padding_free

TINY = {
    "vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 64, "num_labels": 3, "hidden_dropout_prob": 0.0,
}  # fmt: skip
CONFIGS = {
    "bert": BertConfig, "roberta": RobertaConfig, "xlm-roberta": XLMRobertaConfig, "electra": ElectraConfig,
}  # fmt: skip


def tiny(model_type: str, **overrides):
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(CONFIGS[model_type](**{**TINY, **overrides}))
    return model.train()


def padded_batch() -> dict:
    torch.manual_seed(1)
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[0, 5:] = mask[2, 9:] = mask[3, 2:] = 0
    return {"input_ids": torch.randint(3, 100, (4, 12)), "attention_mask": mask}


def logits_and_gradients(model, batch):
    model.zero_grad()
    logits = model(**batch).logits
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2, 1])).backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("model_type", list(CONFIGS))
@pytest.mark.parametrize("attention", ["sdpa", "packed dropout"])
def test_same_logits_and_gradients_as_the_padded_model(model_type, attention):
    # Attention dropout below 1/65536 drops nothing but takes packed dropout's explicit training path.
    overrides = {"attention_probs_dropout_prob": 1e-9 if attention == "packed dropout" else 0.0}
    reference, model = tiny(model_type, **overrides), tiny(model_type, **overrides)
    if attention == "packed dropout":
        use_packed_dropout(reference), use_packed_dropout(model)
    use_padding_free(model)
    batch = padded_batch()
    expected_logits, expected_gradients = logits_and_gradients(reference, batch)
    logits, gradients = logits_and_gradients(model, batch)
    assert torch.allclose(logits, expected_logits, atol=1e-5)
    assert gradients.keys() == expected_gradients.keys()
    for name, gradient in gradients.items():
        assert torch.allclose(gradient, expected_gradients[name], atol=1e-5), name
    with torch.no_grad():
        assert torch.allclose(model.eval()(**batch).logits, reference.eval()(**batch).logits, atol=1e-5)


def test_layers_see_real_tokens_rounded_up_to_a_multiple_and_a_full_batch_runs_as_it_is():
    rows_seen = {}
    for multiple in (1, 16, 50):
        model = tiny("bert")
        use_padding_free(model, rows_multiple=multiple)
        seen = rows_seen[multiple] = []
        feed_forward = model.bert.encoder.layer[0].intermediate.dense
        feed_forward.register_forward_hook(
            lambda _, args, out, seen=seen: seen.append(args[0].shape[:-1].numel())
        )
        batch = padded_batch()
        model(**batch)
        full = {"input_ids": batch["input_ids"], "attention_mask": torch.ones_like(batch["attention_mask"])}
        model(**full)
    assert int(padded_batch()["attention_mask"].sum()) == 28  # 5 + 12 + 9 + 2 real tokens of 4 x 12
    # 50 rounds 28 up past the grid's 48 tokens: the batch runs padded, as it is.
    assert rows_seen == {1: [28, 48], 16: [32, 48], 50: [48, 48]}


def test_auto_is_on_for_cpu_encoders_only_and_true_refuses_other_models(monkeypatch):
    import finetune.speed.hardware
    from finetune.speed.hardware import CpuFeatures

    no_amx = CpuFeatures(amx=False, avx512_bf16=False, avx512=False, avx2=True)
    monkeypatch.setattr(
        finetune.speed.hardware, "cpu_features", lambda: no_amx
    )  # AMX: tests/unit/test_cpu_classes
    bert = tiny("bert")
    assert resolve_padding_free(TrainConfig(), bert, "cpu") == "true"
    assert resolve_padding_free(TrainConfig(), bert, "cuda") == "false"
    assert resolve_padding_free(TrainConfig(torch_compile=True), bert, "cpu") == "false"
    assert resolve_padding_free(TrainConfig(padding_free="false"), bert, "cpu") == "false"
    assert resolve_padding_free(TrainConfig(padding_free="true"), bert, "cuda") == "true"
    distilbert = AutoModelForSequenceClassification.from_config(
        DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=2, hidden_dim=64, num_labels=3)
    )
    assert not supports_padding_free(distilbert)
    assert resolve_padding_free(TrainConfig(), distilbert, "cpu") == "false"
    with pytest.raises(ConfigError, match="--padding_free true") as refused:  # the flag, and the model
        resolve_padding_free(TrainConfig(padding_free="true"), distilbert, "cpu")
    assert "distilbert" in str(refused.value)

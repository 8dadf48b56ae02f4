"""--prefix_sharing: a pair's shared tokens run once, one row a pair, and give the padded layout's
log-probs and gradients; a model the layout would misread keeps the padded one."""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from finetune.errors import ConfigError
from finetune.families.causal_lm.conversations import IGNORE
from finetune.families.dpo.collate import PairCollator, SharedPrefixCollator, Targets, shares_prefixes
from finetune.families.dpo.family import _prefix_sharing, _without_dropout
from finetune.families.dpo.loss import sequence_logps
from tests.backbones import DECODERS, _decoder_config


def tiny_llama(attention: str = "sdpa", **extra) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation=attention,
                         **extra)  # fmt: skip
    return LlamaForCausalLM(config)


def pair(row: int, prompt: list[int], chosen: list[int], rejected: list[int]) -> dict:
    """A pair as encode_pairs writes it: the prompt masked, each completion's tokens its targets."""
    masked = [IGNORE] * len(prompt)
    return {"chosen_input_ids": prompt + chosen, "chosen_labels": masked + chosen, "row": row,
            "rejected_input_ids": prompt + rejected, "rejected_labels": masked + rejected}  # fmt: skip


PAIRS = [
    pair(0, [1, 2, 3, 4, 5], [6, 7, 8], [9, 10]),
    pair(1, [1, 2], [11, 12, 13, 14, 15, 16], [11, 12, 17]),  # the completions share their first two tokens
    pair(2, [3, 4, 5, 6, 7, 8, 9], [20], [21, 22, 23, 24]),
    pair(3, [5, 6], [30, 31], [30, 31, 32]),  # chosen a prefix of rejected: its tail is empty
]


def scored(model, collator, pairs):
    """(the pairs' 2R summed log-probs, their target counts, the gradient of their sum, real tokens)."""
    batch = collator(pairs)
    targets = Targets.pop(batch)
    batch.pop("row")
    model.zero_grad()
    logps, counts, _ = sequence_logps(model(**batch, use_cache=False).logits, targets)
    logps.sum().backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return logps.detach(), counts, grads, int(targets.real_tokens)


def test_the_shared_layout_gives_the_padded_layouts_log_probs_gradients_and_counts_in_fewer_tokens():
    model = tiny_llama()
    padded = scored(model, PairCollator(0, None, None), PAIRS)
    shared = scored(model, SharedPrefixCollator(0, 8), PAIRS)  # rounded up to 8 tokens: padding is inert
    torch.testing.assert_close(shared[0], padded[0], rtol=1e-5, atol=1e-5)
    assert shared[1].tolist() == padded[1].tolist() == [3, 6, 1, 2, 2, 3, 4, 3]
    torch.testing.assert_close(shared[2], padded[2], rtol=1e-4, atol=1e-6)
    each_side = sum(len(p["chosen_input_ids"]) + len(p["rejected_input_ids"]) for p in PAIRS)
    shared_tokens = each_side - (5 + 4 + 7 + 4)  # each pair's common tokens counted once
    assert (shared[3], padded[3]) == (shared_tokens, each_side)


def test_sequence_logps_are_each_sequences_own_sum_over_its_targets():
    """Against each sequence scored alone: no padding, no neighbour, no mask."""
    model = tiny_llama()
    logps = scored(model, SharedPrefixCollator(0, None), PAIRS)[0]
    alone = []
    for side in ("chosen", "rejected"):
        for p in PAIRS:
            ids, labels = p[f"{side}_input_ids"], torch.tensor(p[f"{side}_labels"][1:])
            with torch.no_grad():
                log_probs = model(torch.tensor([ids])).logits[0, :-1].log_softmax(-1)
            kept = labels != IGNORE
            alone.append(log_probs[kept].gather(1, labels[kept, None]).sum())
    torch.testing.assert_close(logps, torch.stack(alone), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("attention", "extra"),
    [("eager", {}), ("sdpa", {"sliding_window": 4})],
    ids=["eager adds its mask", "a sliding window"],
)
def test_a_model_the_layout_would_misread_keeps_the_padded_one_and_true_is_refused(attention, extra):
    model = tiny_llama(attention, **extra)
    assert not shares_prefixes(model)
    assert _prefix_sharing("auto", model) is False
    with pytest.raises(ConfigError) as refused:
        _prefix_sharing("true", model)
    assert refused.value.flag == "--prefix_sharing" and "auto" in refused.value.fix


def test_an_sdpa_model_shares_and_the_check_leaves_it_in_training_mode():
    model = tiny_llama().train()
    assert _prefix_sharing("auto", model) is True and model.training
    assert _prefix_sharing("false", model) is False


@pytest.mark.parametrize("family", DECODERS)
def test_every_supported_decoder_shares_and_scores_each_pair_as_the_padded_layout(family):
    """The check passes for each decoder family tests/backbones.py builds (so they get the shorter rows),
    and on four pairs, beyond the check's one, the shared layout's log-probs are the padded layout's."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_decoder_config(family, 64, 2), attn_implementation="sdpa")
    model.eval()  # GPT-2's dropout would draw other masks for the two layouts (DPO turns it off anyway)
    assert shares_prefixes(model)
    padded = scored(model, PairCollator(0, None, None), PAIRS)
    shared = scored(model, SharedPrefixCollator(0, None), PAIRS)
    torch.testing.assert_close(shared[0], padded[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shared[2], padded[2], rtol=1e-4, atol=1e-6)


def test_disable_dropout_turns_off_every_dropout_module_and_the_attentions_own_rate():
    """GPT-2's dropout modules (embeddings, attention, residuals) and a Llama attention's rate, which it
    reads from an attribute at each forward: all 0, so training forwards are deterministic."""
    torch.manual_seed(0)
    gpt2 = AutoModelForCausalLM.from_config(_decoder_config("gpt2", 64, 2)).train()
    assert _without_dropout(gpt2) > 0
    assert all(m.p == 0 for m in gpt2.modules() if isinstance(m, torch.nn.Dropout))
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(gpt2(ids).logits, gpt2(ids).logits, rtol=0, atol=0)
    llama = tiny_llama(attention_dropout=0.1).train()
    assert _without_dropout(llama) == 2  # one attention a layer
    assert all(layer.self_attn.attention_dropout == 0 for layer in llama.model.layers)

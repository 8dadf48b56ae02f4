"""`--packing` through torch's own varlen kernel (sdpa on CUDA in bf16 or fp16, no flash-attn package
needed). On the CPU `causal_varlen_attention` runs its reference, the function the kernel computes, so
these tests check everything but the kernel itself: a document in a pack has the logits, loss and
gradients it has alone, within a sliding window too; evaluation's padded rows keep sdpa and its mask;
and which models and devices take the path. The kernel against the reference: benchmarks/gpu_sft.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from finetune.errors import ConfigError
from finetune.families.causal_lm.conversations import IGNORE
from finetune.families.causal_lm.packing import PackedAttention, forward_inputs, packed_attention
from finetune.speed.attention import (
    CAUSAL_VARLEN_ATTENTION,
    torch_varlen_features,
    use_causal_varlen_attention,
    varlen_options,
)
from tests.backbones import _decoder_config
from tests.chat_models import build_tiny_lm
from tests.unit.test_sft_packing import collated, documents

TORCH_KERNEL = PackedAttention(varlen=True, torch_kernel=True)


@pytest.fixture(scope="module")
def tiny_lms(tmp_path_factory):
    folder = tmp_path_factory.mktemp("varlen")
    return {family: build_tiny_lm(family, folder / family) for family in ("llama", "qwen2")}


def sliding_mistral(window: int):
    config = _decoder_config("mistral", 100, 1)
    config.sliding_window, config._attn_implementation = window, "sdpa"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def switched_copy(model):
    twin = type(model)(model.config.__class__.from_dict(model.config.to_dict()))
    twin.load_state_dict(model.state_dict())
    twin.config._attn_implementation = "sdpa"
    use_causal_varlen_attention(twin)
    return twin


def models(tiny_lms, family: str):
    """(sdpa's model, the same weights switched to the varlen attention)."""
    if family == "mistral, window 8":
        plain = sliding_mistral(8)
    else:
        plain = AutoModelForCausalLM.from_pretrained(tiny_lms[family], attn_implementation="sdpa")
    return plain, switched_copy(plain)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral, window 8"])
def test_a_packed_document_has_the_logits_loss_and_gradients_it_has_alone(tiny_lms, family):
    """Grouped-query heads (4 over 2) in all three; Mistral's window of 8 is shorter than most documents."""
    plain, varlen = models(tiny_lms, family)
    rows = documents(10, seed=3, longest=60)
    _, batch = collated(rows, varlen=True, capacity=128)
    bounds, labels = batch["cu_seq_lens_q"].tolist(), batch["labels"][0]
    logits = varlen(**forward_inputs(batch, TORCH_KERNEL)).logits[0]
    packed_loss = F.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="sum")
    packed_loss.backward()
    alone_loss = 0.0
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        alone = plain(input_ids=batch["input_ids"][:, start:end]).logits[0]
        torch.testing.assert_close(logits[start:end], alone, rtol=1e-5, atol=1e-5)
        alone_loss = alone_loss + F.cross_entropy(
            alone, labels[start:end], ignore_index=IGNORE, reduction="sum"
        )
    alone_loss.backward()
    torch.testing.assert_close(packed_loss, alone_loss, rtol=1e-5, atol=1e-5)
    for (name, ours), theirs in zip(varlen.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert len(bounds) == 11 and varlen.config._attn_implementation == CAUSAL_VARLEN_ATTENTION


def test_padded_rows_keep_sdpas_mask(tiny_lms):
    """Evaluation and generation are not packed: their rows, padded with a 2D mask, go to sdpa."""
    plain, varlen = models(tiny_lms, "llama")
    ids = torch.randint(5, 90, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    mask[2, :5] = 0  # left padding, as generation pads
    with torch.no_grad():
        ours, theirs = (m(input_ids=ids, attention_mask=mask).logits for m in (varlen, plain))
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], rtol=1e-5, atol=1e-5)


def test_rows_without_any_mask_keep_their_sliding_window():
    """A forward given neither a mask nor bounds (a user's own call) still sees only its window."""
    plain = sliding_mistral(4)
    varlen = switched_copy(plain)
    ids = torch.randint(5, 90, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = (m(input_ids=ids).logits for m in (varlen, plain))
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_sdpa_on_cuda_in_half_precision_takes_the_kernel_and_nothing_else_does(tiny_lms):
    model = AutoModelForCausalLM.from_pretrained(tiny_lms["llama"], attn_implementation="sdpa")
    assert packed_attention(model, 128, "cuda", half=True).torch_kernel
    assert not packed_attention(model, 128, "cuda", half=False).torch_kernel  # the kernel takes no fp32
    assert not packed_attention(model, 128, "cpu", half=True).torch_kernel  # CUDA's only
    eager = AutoModelForCausalLM.from_pretrained(tiny_lms["llama"], attn_implementation="eager")
    assert not packed_attention(eager, 128, "cuda", half=True).varlen
    model.config.attention_dropout = 0.1  # the kernel has no dropout: the mask keeps it
    assert not packed_attention(model, 128, "cuda", half=True).varlen
    # A window shorter than the packs, refused under the mask, is the kernel's own bound.
    assert packed_attention(sliding_mistral(32), 64, "cuda", half=True).torch_kernel


def test_the_kernels_arguments_follow_what_this_torch_takes():
    """torch 2.10's kernel takes `is_causal`, 2.11's a window (causal: (-1, 0)), later ones grouped-query
    heads too; without those, each key/value head is repeated, and a window it cannot take is a bug (the
    plan keeps such a model on the mask)."""
    everything = frozenset({"causal", "window", "gqa"})
    assert varlen_options(everything, 9, 3, (-1, 0)) == ({"window_size": (-1, 0), "enable_gqa": True}, 1)
    assert varlen_options(frozenset({"causal", "window"}), 9, 3, (7, 0)) == ({"window_size": (7, 0)}, 3)
    assert varlen_options(frozenset({"causal"}), 4, 4, (-1, 0)) == ({"is_causal": True}, 1)
    with pytest.raises(RuntimeError, match="no window of 8"):
        varlen_options(frozenset({"causal"}), 4, 4, (7, 0))
    assert {"causal", "window"} <= torch_varlen_features()  # the torch the tests pin (2.13)


def test_under_autocast_the_kernel_gets_one_half_precision_dtype(tiny_lms):
    """Rotary embeddings in fp32 turn autocast's bf16 queries and keys back to fp32 beside bf16 values;
    autocast casts sdpa's inputs but not the kernel's, which takes one half-precision dtype (the reference
    refuses mixed dtypes as the kernel does)."""
    _, varlen = models(tiny_lms, "llama")
    _, batch = collated(documents(4, seed=1), varlen=True, capacity=64)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        logits = varlen(**forward_inputs(batch, TORCH_KERNEL)).logits
    assert torch.isfinite(logits).all()


def test_attention_dropout_and_a_window_its_layers_do_not_pass_keep_the_mask():
    """GPT-2's attention dropout is attn_pdrop; Qwen2-MoE's layers pass no sliding window to the attention
    function, so the kernel would attend to the whole pack: both keep the mask (Qwen2-MoE's narrow window
    is then refused, as on the CPU)."""
    from transformers import AutoConfig

    gpt2 = AutoModelForCausalLM.from_config(_decoder_config("gpt2", 100, 1), attn_implementation="sdpa")
    assert gpt2.config.attn_pdrop and not packed_attention(gpt2, 64, "cuda", half=True).varlen
    moe = AutoConfig.for_model(
        "qwen2_moe", vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=8,
        max_window_layers=4, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(moe, attn_implementation="sdpa")
    with pytest.raises(ConfigError, match="sliding window of 8"):
        packed_attention(model, 64, "cuda", half=True)

"""--chunked_loss (`chunked_loss`): the output layer and cross-entropy over chunks of target tokens give
the unchunked loss, per-row evaluation losses and every parameter's gradient, on tiny decoders: Llama,
Qwen2 with its head tied to the embeddings, Gemma 2 with its final logit soft-cap; with LoRA on the head
or the head trained in full beside adapters; packed; in fp32 and under bf16 autocast. Nothing as large as
the targets' logits is kept for the backward; an adapter's dropout on the head draws the same mask when
a chunk is recomputed; the family's step under Accelerate's bf16 autocast gives the whole loss; a model
whose logits are scaled after the layer keeps the whole loss, and --chunked_loss true is refused for it."""

from __future__ import annotations

import contextlib
import functools
import random
from types import SimpleNamespace

import pytest
import torch
import transformers
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from finetune.config.parser import parse_config
from finetune.families.causal_lm.batches import (
    POSITIONS,
    CausalLmCollator,
    head_at,
    per_row,
    row_losses,
    target_loss,
    targets_at,
)
from finetune.families.causal_lm.chunked_loss import (
    Head,
    _summed,
    chunk_tokens_for,
    chunked_target_loss,
    chunked_token_losses,
    chunks_the_loss,
    hidden_at,
    resolve_chunked_loss,
)
from finetune.families.causal_lm.conversations import IGNORE
from finetune.families.causal_lm.packing import PackedCollator, forward_inputs, pack_rows, packed_attention
from tests.backbones import _decoder_config
from tests.helpers import refused

VOCAB = 300
CHUNK = 7  # several chunks per batch, the last one shorter


def tiny(family: str, seed: int = 0):
    """A 2-layer decoder in eager attention; qwen2 with its output layer tied to the embeddings, gemma2
    with Gemma 2's final soft-cap of the logits (2 here, so the tiny model's logits reach it)."""
    if family == "gemma2":
        config = transformers.Gemma2Config(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=128, head_dim=16, max_position_embeddings=256,
            final_logit_softcapping=2.0, bos_token_id=1, eos_token_id=1, pad_token_id=0,
        )  # fmt: skip
    else:
        config = _decoder_config(family, VOCAB, 1)
        config.tie_word_embeddings = family == "qwen2"
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # a trained head's logits spread wider than a random init's
        model.get_output_embeddings().weight.mul_(8.0)
    return model


def with_lora(model, how: str):
    """LoRA adapters on the attention, and on the head (`head`) or the head trained in full (`saved`)."""
    if how == "none":
        return model
    targets = ["q_proj", "v_proj", *(["lm_head"] if how == "head" else [])]
    config = LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM",
        modules_to_save=["lm_head"] if how == "saved" else None, init_lora_weights=False,
    )  # fmt: skip
    return get_peft_model(model, config)


def batch_of(rows: int = 6, seed: int = 0) -> dict:
    rng = random.Random(seed)
    features = []
    for _ in range(rows):
        length, prompt = rng.randint(4, 24), rng.randint(1, 3)
        ids = [rng.randint(5, VOCAB - 1) for _ in range(length)]
        features.append({"input_ids": ids, "labels": [IGNORE] * prompt + ids[prompt:]})
    return CausalLmCollator(pad_token_id=0)(features)


def packed_batch(model) -> tuple[dict, dict]:
    """Documents packed as --packing packs them; the model's inputs with their block-causal mask."""
    rng = random.Random(1)
    rows = []
    for _ in range(10):
        ids = [rng.randint(5, VOCAB - 1) for _ in range(rng.randint(3, 30))]
        prompt = rng.choice([0, rng.randint(1, len(ids) - 1)])
        rows.append({"input_ids": ids, "labels": [IGNORE] * prompt + ids[prompt:], "length": len(ids)})
    packed, _ = pack_rows(Dataset.from_list(rows), 64, seed=0)
    collator = PackedCollator(CausalLmCollator(0, 1, 64), False, 64)
    keys = ("input_ids", "labels", "document_lengths")
    batch = collator([{k: packed[i][k] for k in keys} for i in range(len(packed))])
    return batch, forward_inputs(batch, packed_attention(model, 64))


def assert_fp32_close(actual, expected, name: str) -> None:
    """fp32 gradients summed in another order (chunk by chunk): within ~1e-7 of the tensor's scale, on
    every CPU's kernels; a lost or mis-scaled chunk is off by the gradient itself. (An absolute 1e-6 failed
    under ATEN_CPU_CAPABILITY=default: 3.7e-6 in one element of a head's lora_A whose largest is ~14.)"""
    scale = max(1.0, float(expected.abs().max()))
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6 * scale, msg=name)


def bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def loss_and_grads(model, batch: dict, inputs: dict, chunks: int | None, autocast):
    """As the family's forward_backward computes them: the forward under `autocast` (Accelerate wraps the
    model's forward alone), the whole loss from the targets' logits, or `chunks` tokens at a time."""
    model.zero_grad()
    labels, positions = batch["labels"], batch[POSITIONS]
    if chunks:
        with hidden_at(model, positions) as kept, autocast():
            model(**inputs)
        summed, count = chunked_target_loss(
            Head(model, autocast), kept[0], targets_at(labels, positions), chunks
        )
    else:
        with head_at(model, positions), autocast():
            logits = model(**inputs).logits.float()  # Accelerate's outputs in fp32
        summed, count = target_loss(logits, labels, positions)
    summed.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return float(summed.detach()), float(count), grads


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("lora", ["none", "head", "saved"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma2"])
def test_the_chunked_loss_gives_the_whole_losses_and_every_gradient(family, lora, precision):
    base = tiny(family)
    assert chunks_the_loss(base)
    model = with_lora(base, lora)
    batch = batch_of()
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    autocast = bf16 if precision == "bf16" else contextlib.nullcontext
    targets = int((batch["labels"] != IGNORE).sum())
    assert targets > 3 * CHUNK
    whole = loss_and_grads(model, batch, inputs, None, autocast)
    chunked = loss_and_grads(model, batch, inputs, CHUNK, autocast)
    # The same logits (bf16's too), their cross-entropy summed in fp32 in another order
    assert chunked[0] == pytest.approx(whole[0], rel=1e-5) and chunked[1] == whole[1] == targets
    assert chunked[2].keys() == whole[2].keys()
    assert any("lm_head" in name or "embed_tokens" in name for name in whole[2])
    for name, grad in whole[2].items():
        if precision == "fp32":
            assert_fp32_close(chunked[2][name], grad, name)
        else:  # autocast's matmuls give each chunk's share of a gradient in bf16: rounded to 2**-8
            bits = 2**-7 * float(grad.abs().max())
            torch.testing.assert_close(chunked[2][name], grad, rtol=2**-7, atol=bits, msg=name)


@pytest.mark.parametrize("lora", ["none", "head"])
def test_a_packed_batch_gives_the_same_chunked_loss_and_gradients(lora):
    model = with_lora(tiny("llama"), lora)
    batch, inputs = packed_batch(tiny("llama"))
    assert batch["input_ids"].shape[0] >= 2 and int((batch["labels"] != IGNORE).sum()) > 3 * CHUNK
    whole = loss_and_grads(model, batch, inputs, None, contextlib.nullcontext)
    chunked = loss_and_grads(model, batch, inputs, CHUNK, contextlib.nullcontext)
    assert chunked[0] == pytest.approx(whole[0], rel=1e-5) and chunked[1] == whole[1]
    for name, grad in whole[2].items():
        assert_fp32_close(chunked[2][name], grad, name)


def test_the_chunks_under_gradient_checkpointing_give_the_same_gradients():
    """--gradient_checkpointing recomputes the layers in the backward, the chunks their logits: both
    recomputations together give the whole loss's gradients."""
    model = with_lora(tiny("qwen2"), "head")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    batch = batch_of(seed=3)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    whole = loss_and_grads(model, batch, inputs, None, contextlib.nullcontext)
    chunked = loss_and_grads(model, batch, inputs, CHUNK, contextlib.nullcontext)
    assert chunked[0] == pytest.approx(whole[0], rel=1e-5) and chunked[2].keys() == whole[2].keys()
    for name, grad in whole[2].items():
        assert_fp32_close(chunked[2][name], grad, name)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_evaluation_in_chunks_gives_each_rows_losses(precision):
    model = tiny("gemma2").eval()
    batch = batch_of(seed=2)
    labels, positions = batch["labels"], batch[POSITIONS]
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    autocast = bf16 if precision == "bf16" else contextlib.nullcontext
    with torch.no_grad():
        with head_at(model, positions), autocast():
            whole = row_losses(model(**inputs).logits.float(), labels, positions)
        with hidden_at(model, positions) as kept, autocast():
            model(**inputs)
        each = chunked_token_losses(Head(model, autocast), kept[0], targets_at(labels, positions), CHUNK)
        chunked = per_row(each, labels, positions)
    rtol = 1e-6 if precision == "fp32" else 1e-3
    torch.testing.assert_close(chunked[0], whole[0], rtol=rtol, atol=1e-9)
    assert torch.equal(chunked[1], whole[1])


def vocabulary_wide_saved(model, batch: dict, chunks: int | None) -> list[int]:
    """The sizes (elements) of the tensors a vocabulary wide (logits, their softmax) that the forward
    keeps for the backward; the weights themselves left out."""
    sizes, weights = [], {p.data_ptr() for p in model.parameters()}
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}

    def pack(tensor):
        if tensor.dim() and tensor.shape[-1] == VOCAB and tensor.data_ptr() not in weights:
            sizes.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss_and_grads(model, batch, inputs, chunks, contextlib.nullcontext)
    return sizes


def test_nothing_as_large_as_the_targets_logits_is_kept_for_the_backward():
    """The whole loss keeps the [targets, vocabulary] logits (and their softmax) for the backward; in
    chunks no logits are kept at all: each chunk's are recomputed in the backward."""
    model = tiny("llama")
    batch = batch_of(rows=8)
    logits = int((batch["labels"] != IGNORE).sum()) * VOCAB
    assert max(vocabulary_wide_saved(model, batch, None)) >= logits
    assert vocabulary_wide_saved(model, batch, CHUNK) == []


def test_an_adapters_dropout_on_the_head_draws_the_same_mask_when_a_chunk_is_recomputed():
    """With dropout in the head's adapter, the checkpointed chunks' gradients are those of the same
    chunks kept whole (not recomputed) from the same seed: the recompute drew the forward's masks."""
    model = get_peft_model(
        tiny("llama"),
        LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5, target_modules=["lm_head"], init_lora_weights=False),
    )
    model.train()
    batch = batch_of()
    labels, positions = batch["labels"], batch[POSITIONS]
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}

    def grads(recomputed: bool):
        model.zero_grad()
        torch.manual_seed(5)
        with hidden_at(model, positions) as kept:
            model(**inputs)
        targets, head = targets_at(labels, positions), Head(model)
        if recomputed:
            summed, _ = chunked_target_loss(head, kept[0], targets, CHUNK)
        else:
            parts = zip(kept[0].split(CHUNK), targets.split(CHUNK), strict=True)
            summed = sum(functools.partial(_summed, head)(h, t) for h, t in parts)
        summed.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return float(summed.detach()), grads

    kept_whole, recomputed = grads(False), grads(True)
    assert recomputed[0] == pytest.approx(kept_whole[0], rel=1e-6)
    for name, grad in kept_whole[1].items():
        torch.testing.assert_close(recomputed[1][name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_a_model_whose_logits_are_scaled_after_the_layer_keeps_the_whole_loss():
    """Cohere multiplies the layer's logits by logit_scale: `Head` would miss it, so auto leaves the loss
    whole and true is refused naming the flag."""
    config = transformers.CohereConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, max_position_embeddings=256, logit_scale=0.5, pad_token_id=0,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    assert not chunks_the_loss(model)

    def flags(asked: str, tokens: int | None = None):
        return SimpleNamespace(chunked_loss=asked, chunked_loss_tokens=tokens)

    assert resolve_chunked_loss(flags("auto"), model, head_at_targets=True, compiled=False) is None
    with refused("--chunked_loss", "use --chunked_loss auto or false"):
        resolve_chunked_loss(flags("true"), model, True, False)
    llama = tiny("llama")
    assert resolve_chunked_loss(flags("auto"), llama, True, False) == chunk_tokens_for(VOCAB, None)
    assert resolve_chunked_loss(flags("true", 9), llama, True, False) == 9
    assert resolve_chunked_loss(flags("false", 9), llama, True, False) is None
    assert resolve_chunked_loss(flags("auto", 9), llama, False, False) is None  # heads_at_targets failed
    assert resolve_chunked_loss(flags("auto", 9), llama, True, True) is None  # compiled
    with refused("--chunked_loss", "use --chunked_loss auto or false"):
        resolve_chunked_loss(flags("true", 9), llama, True, True)


def test_default_chunks_hold_about_2_25_logits_in_whole_tiles():
    assert chunk_tokens_for(49152, None) == 640 and chunk_tokens_for(128256, None) == 256
    assert chunk_tokens_for(262144, None) == 128  # never under one tile
    assert chunk_tokens_for(49152, 1000) == 1000


def test_chunked_loss_flags_are_for_causal_lm():
    files = ["--train_file", "t.jsonl", "--validation_file", "v.jsonl"]
    with refused("--chunked_loss", "drop --chunked_loss"):
        parse_config([*files, "--task_name", "custom", "--text_columns", "text", "--chunked_loss", "true"])
    with refused("--chunked_loss_tokens", "drop --chunked_loss_tokens"):
        parse_config(
            [*files, "--task_name", "custom", "--text_columns", "text", "--chunked_loss_tokens", "64"]
        )
    with refused("--chunked_loss_tokens", "positive integer"):
        parse_config(["--task_type", "causal_lm", *files, "--chunked_loss_tokens", "0"])
    config = parse_config(["--task_type", "causal_lm", *files, "--chunked_loss_tokens", "64"])
    assert config.chunked_loss == "auto" and config.chunked_loss_tokens == 64


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_the_familys_step_under_accelerates_autocast_gives_the_whole_loss_and_gradients(precision):
    """CausalLM.forward_backward on a model Accelerate prepared (it autocasts the model's forward alone):
    the chunks' output layer runs under the same autocast, so in bf16 the chunked loss is the whole one,
    not the fp32 loss an output layer outside autocast would give."""
    from accelerate import Accelerator

    from finetune.families.causal_lm.family import CausalLM
    from finetune.training.evaluation import without_autocast
    from tests.helpers import reset_accelerate

    reset_accelerate()
    accelerator = Accelerator(cpu=True, mixed_precision=precision)
    model = accelerator.prepare(with_lora(tiny("qwen2"), "head"))
    family, batch = CausalLM(), batch_of(seed=4)
    family.head_at_targets = True

    def step(chunks: int | None):
        model.zero_grad()
        family.chunk_tokens = chunks
        record = family.forward_backward(model, accelerator, None, dict(batch), 1)
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return float(record.loss_sum), grads

    whole, chunked = step(None), step(CHUNK)
    assert chunked[0] == pytest.approx(whole[0], rel=1e-6)
    for name, grad in whole[1].items():
        if precision == "bf16":  # as in the test above: each chunk's share rounded to bf16
            bits = 2**-7 * float(grad.abs().max())
            torch.testing.assert_close(chunked[1][name], grad, rtol=2**-7, atol=bits, msg=name)
        else:
            assert_fp32_close(chunked[1][name], grad, name)
    if precision == "bf16":  # autocast made a difference that the chunks kept
        with without_autocast(model):
            fp32 = step(None)[0]
        assert abs(fp32 - whole[0]) > 1e-4 * whole[0]
    reset_accelerate()

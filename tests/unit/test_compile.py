"""torch.compile over length buckets: one graph without breaks per shape, no more recompiles."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator

from finetune.config.train_config import TrainConfig
from finetune.data.batching import build_dataloaders
from finetune.data.splits import load_splits
from finetune.data.tokenization import tokenize_splits
from finetune.families.sequence_classification.evaluation import loss_sum
from finetune.model.loading import load_model_and_tokenizer
from finetune.speed.attention import use_sync_free_masks, use_varlen_attention, varlen_position_offset
from finetune.speed.compile import dynamo_plugin
from tests.helpers import reset_accelerate


def test_compile_flags_reach_the_dynamo_plugin():
    """--torch_compile_mode implies --torch_compile (as in transformers); buckets of 32 at
    --max_length 128 (4 lengths) compile static shapes; unbucketed CPU runs stay dynamic as before."""
    config = TrainConfig(
        torch_compile_mode="reduce-overhead", pad_to_multiple_of="32", torch_compile_regional=True
    )
    assert config.torch_compile
    plugin = dynamo_plugin(config, on_gpu=False)
    assert (plugin.mode, plugin.dynamic, plugin.use_regional_compilation) == ("reduce-overhead", False, True)
    assert torch._dynamo.config.recompile_limit >= 4 * 4
    plain = dynamo_plugin(TrainConfig(torch_compile=True), on_gpu=False)
    assert (plain.mode, plain.dynamic, plain.use_regional_compilation) == ("default", True, False)


@pytest.mark.parametrize("padding_free", ["false", "varlen"])
def test_an_epoch_compiles_once_per_shape_without_graph_breaks(
    padding_free, tiny_model_dir, nli_files, tmp_path
):
    """The training forward and loss, compiled with fullgraph=True (a graph break raises) and the
    plugin's static shapes, over a training epoch and an evaluation pass of the tiny BERT: no more
    compiles than distinct batch shapes (buckets of 32 at --max_length 64, plus the short last
    batches). The captured graph runs as it is (dynamo's "eager") in place of inductor, whose
    compiles take tens of seconds on 2 cores."""
    config = TrainConfig(
        model_name_or_path=str(tiny_model_dir),
        train_file=str(nli_files["train"]),
        validation_file=str(nli_files["validation"]),
        output_dir=str(tmp_path),
        max_length=64,
        pad_to_multiple_of="32",
        padding_free=padding_free,
        max_train_samples=200,
        max_eval_samples=100,
        per_device_train_batch_size=16,
    )
    plugin = dynamo_plugin(config, on_gpu=False)
    task, splits = load_splits(config)
    model, tokenizer = load_model_and_tokenizer(config.model_name_or_path, task, config.max_length)
    if padding_free == "varlen":
        use_varlen_attention(model)
    else:
        use_sync_free_masks(model)
    tokenized = tokenize_splits(task, splits, tokenizer, config.max_length, Accelerator(cpu=True))
    loaders = build_dataloaders(tokenized, tokenizer, config, 1, False, varlen_position_offset(model))
    compiles = 0

    def counting_backend(graph, example_inputs):
        nonlocal compiles
        compiles += 1
        return graph.forward  # runs the captured graph as it is: the cheapest backend

    def step(batch, labels):
        return loss_sum(model(**batch).logits, labels, task)

    torch._dynamo.reset()
    compiled = torch.compile(step, backend=counting_backend, fullgraph=True, dynamic=plugin.dynamic)
    shapes = set()
    for name, loader in loaders.items():
        model.train(name == "train")
        for batch in loader:
            labels = batch.pop("labels")
            shapes.add((name, tuple(batch["input_ids"].shape)))
            with torch.set_grad_enabled(name == "train"):
                loss = compiled(batch, labels)
            if name == "train":
                loss.backward()
                assert torch.isfinite(model.classifier.weight.grad).all()
                model.zero_grad()
    assert compiles <= len(shapes), (compiles, sorted(shapes))
    assert len(shapes) <= 2 * 3  # 2 lengths; full and short batches; evaluation's batch size
    reset_accelerate()


def test_regional_compilation_compiles_each_layer_on_both_paths(tiny_model_dir):
    """--torch_compile_regional (Accelerate's compile_regions): every encoder layer compiled on its
    own, the padded and the varlen model's logits unchanged."""
    import copy

    from accelerate.utils import compile_regions
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from finetune.data.batching import PadCollator, VarlenCollator

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir).eval()
    features = [{**tokenizer("A man plays.", "Music is made by a person here."), "labels": 0},
                {**tokenizer("Dogs run.", "Cats sleep."), "labels": 1}]  # fmt: skip

    def logits(model, collate):
        batch = collate(copy.deepcopy(features))
        batch.pop("labels")
        return model(**batch).logits

    expected = logits(model, PadCollator(tokenizer, 8, 64))
    varlen = copy.deepcopy(model)
    use_varlen_attention(varlen)
    torch._dynamo.reset()
    paths = ((model, PadCollator(tokenizer, 8, 64)), (varlen, VarlenCollator(tokenizer, 8, 64)))
    for plain, collate in paths:
        compiled = compile_regions(plain, backend="eager", dynamic=False)
        assert all(type(layer).__name__ == "OptimizedModule" for layer in compiled.bert.encoder.layer)
        torch.testing.assert_close(logits(compiled, collate), expected, atol=1e-5, rtol=1e-4)


def test_evaluation_runs_the_model_uncompiled(tiny_model_dir):
    """Under torch.compile an evaluation compiles nothing (each of its batch shapes would, and record
    CUDA graphs under reduce-overhead) and gives the model's own logits."""
    from transformers import AutoModelForSequenceClassification

    from finetune.families.sequence_classification.evaluation import _gathered_logits

    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir).eval()
    compiles = 0

    def counting_backend(graph, example_inputs):
        nonlocal compiles
        compiles += 1
        return graph.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=counting_backend)
    ids = torch.tensor([[101, 2023, 2003, 102], [101, 2178, 102, 0]])
    batches = [{"input_ids": ids, "attention_mask": (ids > 0).long(), "labels": torch.tensor([0, 1])}]
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=(ids > 0).long()).logits
    labels, logits = _gathered_logits(Accelerator(cpu=True), compiled, batches, "labels")
    assert compiles == 0
    torch.testing.assert_close(logits, expected)
    assert labels.tolist() == [0, 1] and model.training  # handed back in training mode, as always
    reset_accelerate()

"""Which block FSDP2 shards as one unit: the model's own, whatever the accelerate config names."""

import types

import pytest
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from transformers import BertConfig, BertForSequenceClassification

from finetune.distributed.fsdp import fit_block_class
from finetune.errors import ConfigError


def fsdp_run(monkeypatch, cls_to_wrap: str | None):
    """The accelerator's FSDP state as `accelerate launch` with fsdp.yaml (plus the setting) gives it."""
    monkeypatch.setenv("FSDP_VERSION", "2")
    monkeypatch.setenv("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP")
    if cls_to_wrap:
        monkeypatch.setenv("FSDP_TRANSFORMER_CLS_TO_WRAP", cls_to_wrap)
    plugin = FullyShardedDataParallelPlugin()
    return types.SimpleNamespace(
        distributed_type=DistributedType.FSDP, state=types.SimpleNamespace(fsdp_plugin=plugin)
    )


def tiny_bert():
    return BertForSequenceClassification(
        BertConfig(
            vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32
        )
    )


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    return LlamaForCausalLM(config)


@pytest.mark.parametrize(("build", "block"), [(tiny_bert, "BertLayer"), (tiny_llama, "LlamaDecoderLayer")])
def test_a_config_without_a_block_class_takes_the_models_own(monkeypatch, build, block):
    """The units are what the model itself names in `_no_split_modules`, less a class holding the
    embeddings (BERT's instances name BertEmbeddings: Accelerate shards the embeddings on their own),
    else its stack of layers (see the next test)."""
    accelerator, model = fsdp_run(monkeypatch, None), build()
    assert fit_block_class(accelerator, model) is None
    assert accelerator.state.fsdp_plugin.transformer_cls_names_to_wrap == [block]


def test_a_model_that_names_no_blocks_gets_its_stack_of_layers(monkeypatch):
    model = tiny_bert()
    model._no_split_modules = None  # as a model class whose instances leave it unset
    accelerator = fsdp_run(monkeypatch, None)
    assert fit_block_class(accelerator, model) is None
    assert accelerator.state.fsdp_plugin.transformer_cls_names_to_wrap == ["BertLayer"]


def test_a_block_class_the_model_lacks_is_replaced_with_one_line(monkeypatch):
    accelerator = fsdp_run(monkeypatch, "BertLayer")
    notice = fit_block_class(accelerator, tiny_llama())
    assert notice == (
        "notice: fsdp_transformer_layer_cls_to_wrap names BertLayer, which LlamaForCausalLM lacks; "
        "FSDP wraps its block class LlamaDecoderLayer (leave the setting out of the accelerate config "
        "to take the model's own)"
    )
    assert accelerator.state.fsdp_plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]
    kept = fsdp_run(monkeypatch, "BertLayer")
    assert fit_block_class(kept, tiny_bert()) is None  # a class the model has is the user's choice
    assert kept.state.fsdp_plugin.transformer_cls_names_to_wrap == ["BertLayer"]


def test_a_model_without_a_block_class_is_refused_naming_the_setting(monkeypatch):
    import torch

    with pytest.raises(ConfigError) as refused:
        fit_block_class(fsdp_run(monkeypatch, None), torch.nn.Sequential(torch.nn.Linear(2, 2)))
    assert refused.value.flag == "fsdp_transformer_layer_cls_to_wrap"


def test_fsdp1_on_cpu_is_refused_naming_the_setting(monkeypatch):
    """FSDP1 needs a CUDA device; only FSDP2 is engaged on CPU."""
    from finetune.distributed.fsdp import engage_fsdp_on_cpu

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    cpu_world = types.SimpleNamespace(distributed_type=DistributedType.MULTI_CPU, mixed_precision="no")
    with pytest.raises(ConfigError) as refused:
        engage_fsdp_on_cpu(cpu_world)
    assert refused.value.flag == "fsdp_version" and "fsdp_version: 2" in str(refused.value)


def test_cpu_offload_on_cpu_is_refused_naming_the_setting(monkeypatch):
    """torch's offload policy needs an accelerator ("Cannot access accelerator device"): one line instead."""
    from finetune.distributed.fsdp import engage_fsdp_on_cpu

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", "true")
    cpu_world = types.SimpleNamespace(distributed_type=DistributedType.MULTI_CPU, mixed_precision="no")
    with pytest.raises(ConfigError) as refused:
        engage_fsdp_on_cpu(cpu_world)
    assert refused.value.flag == "fsdp_offload_params"

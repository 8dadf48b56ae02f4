"""FSDP2 on every device, CPU included: the one place finetune lifts Accelerate's accelerator-only gate.

Accelerate (1.15) picks FSDP inside its branch for accelerator world types (MULTI_GPU, MULTI_XPU, ...):
on CPU the state is MULTI_CPU and an FSDP config trains as DDP, every rank holding the whole model.
torch's `fully_shard` itself runs over gloo, and Accelerate's FSDP2 path (`prepare`, `get_state_dict`,
`save_state`) is device-agnostic past that gate, so the state is switched to FSDP here, right after the
Accelerator is made and before anything reads it. results.json says `fsdp_gate_lifted`; its test
(tests/e2e/test_distributed.py) fails the day Accelerate lifts the gate itself (then this lift can go).
"""

from __future__ import annotations

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import (
    DistributedType,
    FullyShardedDataParallelPlugin,
    gather_object,
    parse_flag_from_env,
)
from torch.distributed.tensor import DTensor

from finetune.errors import ConfigError


def engage_fsdp_on_cpu(accelerator: Accelerator) -> bool:
    """Switch a CPU world that an FSDP config launched (`accelerate launch` sets ACCELERATE_USE_FSDP)
    from Accelerate's MULTI_CPU to FSDP2, with the plugin Accelerate would have made from the same
    environment. True where it did."""
    if not parse_flag_from_env("ACCELERATE_USE_FSDP"):
        return False
    if accelerator.distributed_type != DistributedType.MULTI_CPU:
        return False  # FSDP already (an accelerator), or one process (nothing to shard across)
    plugin = FullyShardedDataParallelPlugin()  # reads the FSDP_* variables the launcher set
    if plugin.fsdp_version != 2:
        raise ConfigError(
            f"fsdp_version {plugin.fsdp_version} in the accelerate config runs on GPUs only; "
            "set fsdp_version: 2 (FSDP2 shards on CPU too)",
            flag="fsdp_version",
            fix="set fsdp_version: 2 in the accelerate config",
        )
    if parse_flag_from_env("FSDP_OFFLOAD_PARAMS"):  # torch's offload policy asks for an accelerator
        raise ConfigError(
            "fsdp_offload_params: true in the accelerate config offloads to CPU from an accelerator, and "
            "on CPU the parameters already are in CPU memory; set fsdp_offload_params: false",
            flag="fsdp_offload_params",
            fix="set fsdp_offload_params: false in the accelerate config",
        )
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    # Both singletons, as Accelerate's own FSDP branch does: every AcceleratorState() made later (its
    # dataloaders make some) copies PartialState's distributed_type over its own.
    accelerator.state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin
    accelerator.state.fsdp_gate_lifted = True  # results.json's fsdp_gate_lifted, in this run's state
    return True


def reduce_in_fp32(accelerator: Accelerator) -> None:
    """Under FSDP2 with bf16/fp16: compute in the half dtype, but reduce-scatter the gradients in fp32
    (Accelerate's policy reduces in the half dtype, summing every rank's rounding into each shard). The
    sharded parameters and the optimizer state stay fp32 either way."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if accelerator.distributed_type != DistributedType.FSDP or plugin is None or plugin.fsdp_version != 2:
        return
    from torch.distributed.fsdp import MixedPrecisionPolicy

    policy = plugin.mixed_precision_policy
    if not isinstance(policy, MixedPrecisionPolicy) or policy.param_dtype in (None, torch.float32):
        return
    plugin.mixed_precision_policy = MixedPrecisionPolicy(
        param_dtype=policy.param_dtype, reduce_dtype=torch.float32, output_dtype=policy.output_dtype
    )


def gate_lifted(accelerator: Accelerator) -> bool:
    """Whether this run's FSDP is finetune's doing (Accelerate alone would have run it as DDP)."""
    return getattr(accelerator.state, "fsdp_gate_lifted", False)


def describe_fsdp(accelerator: Accelerator) -> str:
    """The start line's words for the sharding ('' without FSDP)."""
    if accelerator.distributed_type != DistributedType.FSDP:
        return ""
    lifted = " (on CPU: finetune lifts Accelerate's GPU-only gate)" if gate_lifted(accelerator) else ""
    return f"fsdp=FSDP{accelerator.state.fsdp_plugin.fsdp_version}{lifted} "


def _local_elements(tensor) -> int:
    return tensor.to_local().numel() if isinstance(tensor, DTensor) else tensor.numel()


def watch_gradient_shards(optimizer) -> None:
    """Under FSDP2: note, at the first optimizer step, how many gradient elements this rank holds (after
    the reduce-scatter, just before the step reads them), for `shard_record`. The optimizer clears the
    gradients after each step, so the end of the run cannot count them."""
    inner = getattr(optimizer, "optimizer", optimizer)
    inner.finetune_gradient_elements = None

    def count(opt, *_):
        if opt.finetune_gradient_elements is None:
            grads = [p.grad for group in opt.param_groups for p in group["params"] if p.grad is not None]
            opt.finetune_gradient_elements = sum(_local_elements(g) for g in grads)

    inner.register_step_pre_hook(count)


def _precision_in_use(model) -> dict:
    """The dtypes FSDP2's parameter groups really gather and reduce in (their mixed-precision policy)."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, FSDPModule) else None
        if group is not None:
            policy = group.mp_policy
            name = lambda dtype: str(dtype or torch.float32).removeprefix("torch.")  # noqa: E731
            return {"param_dtype": name(policy.param_dtype), "reduce_dtype": name(policy.reduce_dtype)}
    return {}


def shard_record(accelerator: Accelerator, model, optimizer) -> list[dict] | None:
    """Collective: under FSDP, every rank's share of the trainable parameters, their gradients (at the
    first step) and the optimizer's per-parameter state, in elements, beside the whole model's; None
    without FSDP. results.json's `fsdp_shards`: what each rank really held, not what the config asked."""
    if accelerator.distributed_type != DistributedType.FSDP:
        return None
    inner = getattr(optimizer, "optimizer", optimizer)
    params = [p for group in inner.param_groups for p in group["params"]]
    moments = [
        t for p in params for t in inner.state.get(p, {}).values() if torch.is_tensor(t) and t.dim() > 0
    ]
    mine = {
        "rank": accelerator.process_index,
        "parameters": sum(_local_elements(p) for p in params),
        "gradients": getattr(inner, "finetune_gradient_elements", None),
        "optimizer_state": sum(_local_elements(t) for t in moments),
        "whole_parameters": sum(p.numel() for p in params),
        "whole_optimizer_state": sum(t.numel() for t in moments),
        "sharded_tensors": sum(isinstance(p, DTensor) for p in params),
        "tensors": len(params),
        **_precision_in_use(model),
    }
    return gather_object([mine])


def _embedding_holders(model, names: list[str]) -> set[str]:
    """Classes holding the input or output embeddings (BERT's `_no_split_modules` names BertEmbeddings):
    Accelerate shards those embeddings as units of their own after the blocks, and one inside an already
    sharded block fails there ("Invariant encountered")."""
    get = (getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None))
    embeds = [e for e in (g() if g else None for g in get) if e is not None]
    return {
        type(m).__name__
        for m in model.modules()
        if type(m).__name__ in names and any(e is sub for sub in m.modules() for e in embeds)
    }


def _layer_stack_class(model) -> list[str]:
    """The class of the model's stack of layers, for a model whose `_no_split_modules` names nothing (a
    remote-code or older model class): the longest ModuleList of one class."""
    stacks = [
        list(m)
        for m in model.modules()
        if isinstance(m, torch.nn.ModuleList) and len(m) and len({type(x) for x in m}) == 1
    ]
    return [type(max(stacks, key=len)[0]).__name__] if stacks else []


def fit_block_class(accelerator: Accelerator, model) -> str | None:
    """Under FSDP with TRANSFORMER_BASED_WRAP: each block FSDP shards as one unit is the model's own
    block class (`_no_split_modules`, as transformers names it: BertLayer, LlamaDecoderLayer, ...) where
    the accelerate config leaves `fsdp_transformer_layer_cls_to_wrap` out or names a class the model
    lacks; one config then serves every backbone. Returns the notice for a class set but absent (None
    otherwise); a model without a block class and a config without one is a ConfigError."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if accelerator.distributed_type != DistributedType.FSDP or plugin is None:
        return None
    if "transformer" not in str(plugin.auto_wrap_policy).lower():
        return None  # SIZE_BASED_WRAP or NO_WRAP: no class to name
    present = {type(m).__name__ for m in model.modules()}
    blocks = [name for name in getattr(model, "_no_split_modules", None) or [] if name in present]
    blocks = [name for name in blocks if name not in _embedding_holders(model, blocks)]
    blocks = blocks or _layer_stack_class(model)
    asked = plugin.transformer_cls_names_to_wrap or []
    if asked and all(name in present for name in asked):
        return None
    if not blocks:
        raise ConfigError(
            f"{type(model).__name__} names no block class for FSDP to shard as a unit; set "
            "fsdp_transformer_layer_cls_to_wrap in the accelerate config to its layer class",
            flag="fsdp_transformer_layer_cls_to_wrap",
            fix="set fsdp_transformer_layer_cls_to_wrap to the model's layer class",
        )
    plugin.transformer_cls_names_to_wrap = blocks
    if not asked:
        return None
    return (
        f"notice: fsdp_transformer_layer_cls_to_wrap names {','.join(asked)}, which "
        f"{type(model).__name__} lacks; FSDP wraps its block class {','.join(blocks)} (leave the setting "
        "out of the accelerate config to take the model's own)"
    )


def shard_frozen(accelerator: Accelerator, model):
    """Collective under FSDP2: a model no optimizer holds (DPO's frozen reference) sharded into the units
    the policy's `prepare` makes (its block classes, as `fit_block_class` picks them for this model), with
    the same mixed-precision policy. Accelerate's `prepare_model(evaluation_mode=True)` shards nothing
    under FSDP2 (its FSDP2 path needs an optimizer), so each rank would hold the whole copy. The model
    unchanged without FSDP2."""
    if not accelerator.is_fsdp2:
        return model
    from accelerate.utils import fsdp2_prepare_model

    # The policy's classes, or this model's own where it lacks them (a --ref_model_name_or_path of
    # another architecture): no notice, the user named no class for it.
    fit_block_class(accelerator, model)
    return fsdp2_prepare_model(accelerator, model)


def model_shares(accelerator: Accelerator, model) -> list[dict] | None:
    """Collective: under FSDP, every rank's elements of `model`'s parameters (trainable or not) beside
    the whole, and how many of its tensors are sharded; None without FSDP. For a model outside the
    optimizer, which `shard_record` does not see (DPO's reference: `fsdp_reference_shards`)."""
    if accelerator.distributed_type != DistributedType.FSDP:
        return None
    params = list(model.parameters())
    mine = {
        "rank": accelerator.process_index,
        "parameters": sum(_local_elements(p) for p in params),
        "whole_parameters": sum(p.numel() for p in params),
        "sharded_tensors": sum(isinstance(p, DTensor) for p in params),
        "tensors": len(params),
        "trainable_tensors": sum(p.requires_grad for p in params),
    }
    return gather_object([mine])

"""Ranks: the launched and joined world sizes agree, replicas hold the same weights. (This process's rank
before the Accelerator exists: finetune/distributed/launch_env.py.)"""

from __future__ import annotations

import hashlib

import torch
from accelerate.utils import gather_object
from torch.distributed.tensor import DTensor

from finetune.errors import ConfigError


def check_launched_all(asked: int | None, launched: int, on_gpu: bool) -> None:
    """A launch that asked for more processes than it started must not train (one replica of the
    several the user meant, at another global batch)."""
    if asked is None or asked <= launched:
        return
    config = "multi_gpu.yaml" if on_gpu else "cpu_multiprocess.yaml"
    raise ConfigError(
        f"accelerate launch was asked for {asked} processes but started {launched}: its simple launcher "
        "(no --multi_gpu, and a config whose distributed_type is not MULTI_GPU) starts one; use "
        f"--config_file accelerate_configs/{config} (several machines: multi_node*.yaml)",
        flag="--num_processes",
        fix=f"accelerate launch --config_file accelerate_configs/{config}",
    )


def check_world_size(launched: int, joined: int) -> None:
    """Several launched processes that did not join one group would train independent replicas."""
    if launched > 1 and joined != launched:
        raise ConfigError(
            f"the launcher started {launched} processes but Accelerate sees {joined}: "
            "they would train independent copies; check distributed_type and num_processes "
            "in the accelerate config"
        )


def replicas_identical(accelerator, model) -> bool:
    """Collective: whether every rank holds bit-identical parameters (hashes gathered to all ranks). Under
    FSDP each rank holds its own shard of the sharded tensors (DTensors): only the replicated rest is
    compared (the shards: `fsdp_shards`)."""
    digest = hashlib.sha256()
    for tensor in accelerator.unwrap_model(model).state_dict().values():
        if isinstance(tensor, DTensor):
            continue
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return len(set(gather_object([digest.hexdigest()]))) == 1

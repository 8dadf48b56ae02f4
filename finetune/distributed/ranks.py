"""Ranks: this process's before the Accelerator exists, the launched and joined world sizes agree,
replicas hold the same weights."""

from __future__ import annotations

import hashlib
import os

import torch
from accelerate.utils import gather_object

from finetune.errors import ConfigError


def launcher_rank() -> int:
    """This process's global rank as the launcher set it (0 without one), before the Accelerator exists."""
    return int(os.environ.get("RANK", "0"))


def launcher_world_size() -> int:
    """How many processes the launcher started (1 without one), before the Accelerator exists."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def check_world_size(launched: int, joined: int) -> None:
    """Several launched processes that did not join one group would train independent replicas."""
    if launched > 1 and joined != launched:
        raise ConfigError(
            f"the launcher started {launched} processes but Accelerate sees {joined}: "
            "they would train independent copies; check distributed_type and num_processes "
            "in the accelerate config"
        )


def replicas_identical(accelerator, model) -> bool:
    """Collective: whether every rank holds bit-identical parameters (hashes gathered to all ranks)."""
    digest = hashlib.sha256()
    for tensor in accelerator.unwrap_model(model).state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return len(set(gather_object([digest.hexdigest()]))) == 1

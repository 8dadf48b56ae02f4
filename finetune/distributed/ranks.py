"""Ranks: this process's before the Accelerator exists, the launched and joined world sizes agree,
replicas hold the same weights."""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

import torch
from accelerate.utils import gather_object

from finetune.errors import ConfigError


def launcher_rank() -> int:
    """This process's global rank as the launcher set it (0 without one), before the Accelerator exists."""
    return int(os.environ.get("RANK", "0"))


def say_once(line: str) -> None:
    """`line` on stderr once per launch and host: every rank that fails the same way would print the
    same line; the first to get here prints it (a marker file named by the launch and the line). One
    process: always. No collective, so a rank may call it alone."""
    if launcher_world_size() > 1:
        launch = f"{os.environ.get('TORCHELASTIC_RUN_ID')} {os.environ.get('MASTER_PORT')} {os.getppid()}"
        digest = hashlib.sha256(f"{launch}\n{line}".encode()).hexdigest()[:16]
        try:
            (Path(tempfile.gettempdir()) / f"finetune-said-{digest}").touch(exist_ok=False)
        except FileExistsError:
            return  # another rank of this launch said it
        except OSError:
            pass  # no marker: better twice than never
    print(line, file=sys.stderr, flush=True)


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

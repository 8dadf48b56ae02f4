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


def processes_asked_of_accelerate() -> int | None:
    """How many processes `accelerate launch` was asked for (`--num_processes`, else its --config_file's
    `num_processes`), when it is this process's parent and started it alone, as its simple launcher does
    whatever the count (a launch without --multi_gpu or a multi-process config) without a word. None
    where another launcher started this process, or the parent's command line cannot be read (not
    Linux)."""
    if "WORLD_SIZE" in os.environ:  # torchrun (or accelerate through it) started it: its world is known
        return None
    try:
        argv = [
            a.decode(errors="replace")
            for a in Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
        ]
    except OSError:
        return None
    starts = [i + 1 for i, a in enumerate(argv) if a == "accelerate.commands.launch"]
    starts += [
        i + 1 for i, a in enumerate(argv[1:], 1) if a == "launch" and Path(argv[i - 1]).name == "accelerate"
    ]
    if not starts:
        return None
    from accelerate.commands.launch import launch_command_parser

    try:
        launch, _ = launch_command_parser().parse_known_args(argv[starts[0] :])
    except SystemExit:  # not a command line accelerate reads: nothing to compare
        return None
    if launch.num_processes is not None:
        return launch.num_processes
    if launch.config_file:
        import yaml

        try:
            return int(yaml.safe_load(Path(launch.config_file).read_text()).get("num_processes", 1))
        except (OSError, ValueError, TypeError, AttributeError, yaml.YAMLError):
            return None
    return None


def check_launched_all(asked: int | None, launched: int, on_gpu: bool) -> None:
    """A launch that asked for more processes than it started must not train (one replica of the
    several the user meant, at another global batch)."""
    if asked is None or asked <= launched:
        return
    config = "multi_gpu.yaml" if on_gpu else "cpu_multiprocess.yaml"
    raise ConfigError(
        f"accelerate launch was asked for {asked} processes but started {launched}: without a multi-process "
        f"accelerate config it runs one; use --config_file accelerate_configs/{config}",
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
    """Collective: whether every rank holds bit-identical parameters (hashes gathered to all ranks)."""
    digest = hashlib.sha256()
    for tensor in accelerator.unwrap_model(model).state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return len(set(gather_object([digest.hexdigest()]))) == 1

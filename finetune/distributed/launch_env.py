"""What the launcher told this process, read from its environment and its parent's command line before
torch is imported: its rank, the world size, how many processes `accelerate launch` was asked for; and
one line said once per launch. Light on purpose: the command line parses and refuses a bad flag with
only this (`finetune --help` answers in about a second, not after the seconds of torch's import)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import sys
import tempfile
from pathlib import Path


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
    """How many processes `accelerate launch` was asked for, when it is this process's parent and its
    simple launcher started this process alone (`simple_launch_asks`). None where another launcher started
    it (torchrun, or accelerate through it: WORLD_SIZE is set), or the parent's command line cannot be
    read (not Linux)."""
    if "WORLD_SIZE" in os.environ:
        return None
    try:
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return None
    return simple_launch_asks([a.decode(errors="replace") for a in parent.split(b"\0") if a])


def simple_launch_asks(argv: list[str]) -> int | None:
    """The process count an `accelerate launch` command line asks for (`--num_processes`, else its config
    file's or the default config's), when accelerate runs it through its simple launcher, which starts
    one process whatever the count, without a word: what `launch_command` would pick, by accelerate's own
    parser and checks. None for any other launcher (torchrun's, DeepSpeed's, TPU's) or command."""
    names = ("accelerate", "accelerate-launch")
    starts = [i + 1 for i, a in enumerate(argv) if a in ("accelerate.commands.launch", "finetune.launch")]
    starts += [i + 1 for i, a in enumerate(argv) if Path(a).name == "accelerate-launch"]
    starts += [i + 1 for i in range(1, len(argv)) if argv[i] == "launch" and Path(argv[i - 1]).name in names]
    if not starts:
        return None
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import ComputeEnvironment

    quiet = io.StringIO()  # accelerate's usage text and its warnings about defaults: not this run's to say
    try:
        with contextlib.redirect_stderr(quiet), contextlib.redirect_stdout(quiet):
            launch, defaults, _ = _validate_launch_command(
                launch_command_parser().parse_args(argv[starts[0] :])
            )
    except (SystemExit, ValueError, TypeError, OSError):  # not a command line accelerate would run
        return None
    others = (launch.use_deepspeed, launch.use_fsdp, launch.use_megatron_lm, launch.multi_gpu, launch.tpu)
    sagemaker = defaults is not None and defaults.compute_environment == ComputeEnvironment.AMAZON_SAGEMAKER
    if (any(others) and not launch.cpu) or sagemaker:
        return None
    # The simple launcher starts one process whatever the count: an unset count on a machine without
    # GPUs reads as 0 before accelerate 1.16 (the GPUs counted) and as 1 from it; both mean one.
    return max(launch.num_processes, 1)

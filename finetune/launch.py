"""`python -m finetune.launch [accelerate launch's options] SCRIPT [flags]`: `accelerate launch`, except
that a launch whose workers a stop signal stopped (each rank checkpointed, rank 0 said where, and they
exited 143, or 130 after Ctrl-C) exits with that code and no traceback, as one process does; `accelerate
launch` and `torchrun` exit 1 with torch elastic's ChildFailedError traceback
(`signals.stopped_launch_code` says why). Schedulers that requeue on 143 need it. And a one-process
launch (accelerate's simple launcher: no config, or one that is not multi-process) that fails exits with
its process's own code (2 for a refused flag) after that process's one line, where `accelerate launch`
adds its CalledProcessError traceback and exits 1 (`-q` drops the traceback, not the 1). Every other
outcome is accelerate launch's own: a failed worker still ends it 1 with torch's report."""

from __future__ import annotations

import subprocess
import sys


def main(argv: list[str] | None = None) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser

    from finetune.distributed.signals import stopped_launch_code

    parser = launch_command_parser()
    parser.prog = "python -m finetune.launch"
    args = parser.parse_args(argv)
    try:
        launch_command(args)
    except subprocess.CalledProcessError as error:  # the simple launcher's: its process said why
        code = error.returncode
        return 128 - code if code < 0 else code  # killed by signal N: the shell's 128 + N
    except Exception as error:  # torch elastic's SignalException and ChildFailedError are Exceptions
        code = stopped_launch_code(error)
        if code is None:
            raise
        return code  # the workers said what stopped them and where their checkpoint is
    return 0


if __name__ == "__main__":
    sys.exit(main())

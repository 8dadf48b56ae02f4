"""`python -m finetune.launch [accelerate launch's options] SCRIPT [flags]`: `accelerate launch`, except
that a launch whose workers a stop signal stopped (each rank checkpointed, rank 0 said where, and they
exited 143, or 130 after Ctrl-C) exits with that code and no traceback, as one process does; `accelerate
launch` and `torchrun` exit 1 with torch elastic's ChildFailedError traceback
(`signals.stopped_launch_code` says why). Schedulers that requeue on 143 need it. Every other outcome is
accelerate launch's own: a failed worker still ends it 1 with torch's report."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser

    from finetune.distributed.signals import stopped_launch_code

    parser = launch_command_parser()
    parser.prog = "python -m finetune.launch"
    args = parser.parse_args(argv)
    try:
        launch_command(args)
    except Exception as error:  # torch elastic's SignalException and ChildFailedError are Exceptions
        code = stopped_launch_code(error)
        if code is None:
            raise
        return code  # the workers said what stopped them and where their checkpoint is
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""finetune that sends itself SIG$SIGNAL (KILL or TERM) during optimizer step $AT_STEP.

Only the ranks listed in $RANKS (default: every rank) send it, on a torchrun restart none does; with
$ONLY_IN, only in a run whose output folder's path contains it (one seed of --seeds). The ranks listed
in $TO_LAUNCHER (default: none) send theirs to the worker's parent instead: the launcher (`accelerate
launch` runs torch's elastic agent in its own process), as a user's `kill` or a scheduler would. The
real scheduler's step is wrapped: it runs once per optimizer step, after the weights changed and
before the step is counted, logged or checkpointed. So SIGKILL loses step $AT_STEP and everything
since the last checkpoint, at the same step on every run; SIGTERM reaches the run's own handler,
which must finish step $AT_STEP and stop after it.
"""

import os
import signal
import sys

from finetune.mnli import cli
from finetune.run import setup

at, signum = int(os.environ["AT_STEP"]), signal.Signals[f"SIG{os.environ['SIGNAL']}"]
ranks = {int(rank) for rank in os.environ.get("RANKS", "0,1").split(",")}
to_launcher = {int(rank) for rank in os.environ.get("TO_LAUNCHER", "").split(",") if rank}
only_in = os.environ.get("ONLY_IN", "")


def setup_with_signal(*launch):
    run = setup(*launch)
    first_start = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    rank = run.accelerator.process_index
    if rank in ranks and first_start and only_in in run.config.output_dir:
        scheduler_step, target = run.scheduler.step, os.getppid() if rank in to_launcher else os.getpid()

        def step_then_signal(*args, **kwargs):
            scheduler_step(*args, **kwargs)
            if run.state.global_step + 1 == at:
                os.kill(target, signum)

        run.scheduler.step = step_then_signal
    return run


sys.exit(cli(sys.argv[1:], setup_with_signal))

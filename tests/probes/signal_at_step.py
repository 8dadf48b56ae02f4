"""finetune that sends itself SIG$SIGNAL (KILL or TERM) during optimizer step $AT_STEP.

Only the ranks listed in $RANKS (default: every rank) send it, on a torchrun restart none does; with
$ONLY_IN, only in a run whose output folder's path contains it (one seed of --seeds). With
TARGET=launcher it goes to the worker's parent instead: the launcher (`accelerate launch` runs torch's
elastic agent in its own process), as a user's `kill` or a scheduler would send it. The
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
target = os.getppid() if os.environ.get("TARGET") == "launcher" else os.getpid()
only_in = os.environ.get("ONLY_IN", "")


def setup_with_signal(*launch):
    run = setup(*launch)
    first_start = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if run.accelerator.process_index in ranks and first_start and only_in in run.config.output_dir:
        scheduler_step = run.scheduler.step

        def step_then_signal(*args, **kwargs):
            scheduler_step(*args, **kwargs)
            if run.state.global_step + 1 == at:
                os.kill(target, signum)

        run.scheduler.step = step_then_signal
    return run


sys.exit(cli(sys.argv[1:], setup_with_signal))

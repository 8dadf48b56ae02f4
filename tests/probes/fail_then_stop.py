"""finetune under a launcher with restarts: on the first attempt rank $RANK_TO_FAIL raises an unexpected
error at optimizer step $AT (its peers go on into the next collective); on the restarted attempt, rank 0
sends SIGTERM to its launcher (the worker's parent: `accelerate launch` runs torch's elastic agent in its
own process) during step $STOP_AT, as a user's `kill` or a scheduler would. The scheduler is wrapped as in
signal_at_step.py: it runs once per optimizer step, after the weights changed and before the step is
counted, logged or checkpointed."""

import os
import signal
import sys

from finetune.mnli import cli
from finetune.run import setup

failing_rank, at, stop_at = int(os.environ["RANK_TO_FAIL"]), int(os.environ["AT"]), int(os.environ["STOP_AT"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def setup_with_faults(*launch):
    run = setup(*launch)
    scheduler_step, rank = run.scheduler.step, run.accelerator.process_index

    def step_with_faults(*args, **kwargs):
        step = run.state.global_step + 1
        if attempt == 0 and rank == failing_rank and step == at:
            raise RuntimeError(f"injected failure on rank {failing_rank} at step {at}")
        scheduler_step(*args, **kwargs)
        if attempt == 1 and rank == 0 and step == stop_at:
            os.kill(os.getppid(), signal.SIGTERM)

    run.scheduler.step = step_with_faults
    return run


sys.exit(cli(sys.argv[1:], setup_with_faults))

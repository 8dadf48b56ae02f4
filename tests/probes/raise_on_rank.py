"""finetune in which rank $RANK_TO_FAIL raises an unexpected error at optimizer step $AT (a bug, a bad
batch, a failing disk), while its peers go on into the next collective. On a torchrun restart it does
not raise again."""

import os
import sys

from finetune.mnli import cli
from finetune.run import setup

failing_rank, at = int(os.environ["RANK_TO_FAIL"]), int(os.environ["AT"])


def setup_with_failure(*launch):
    run = setup(*launch)
    step = run.scheduler.step

    def step_or_fail():
        first_start = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if run.accelerator.process_index == failing_rank and run.state.global_step + 1 == at and first_start:
            raise RuntimeError(f"injected failure on rank {failing_rank} at step {at}")
        step()

    run.scheduler.step = step_or_fail
    return run


sys.exit(cli(sys.argv[1:], setup_with_failure))

"""finetune that gets Ctrl-C twice in a row during optimizer step $AT, as an impatient user sends it."""

import os
import signal
import sys

from finetune.mnli import cli
from finetune.run import setup

at = int(os.environ["AT"])


def setup_with_two_ctrl_c(*launch):
    run = setup(*launch)
    step = run.scheduler.step

    def step_with_ctrl_c():
        if run.state.global_step + 1 == at:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        step()

    run.scheduler.step = step_with_ctrl_c
    return run


sys.exit(cli(sys.argv[1:], setup_with_two_ctrl_c))

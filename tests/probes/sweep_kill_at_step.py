"""A sweep worker (finetune/sweep.py) that SIGKILLs itself (or sends itself SIG$SIGNAL: INT for a
Ctrl-C) during optimizer step $AT_STEP of the first trial it runs, after writing that trial's folder to
$KILL_NOTE: a worker lost or stopped mid-trial, at the same step every time (the scheduler is wrapped as
in signal_at_step.py)."""

import os
import signal
import sys
from pathlib import Path

from finetune.run import setup
from finetune.studies.sweep_command import sweep_cli

at = int(os.environ["AT_STEP"])
signum = signal.Signals[f"SIG{os.environ.get('SIGNAL', 'KILL')}"]


def setup_with_kill(*launch):
    run = setup(*launch)
    scheduler_step = run.scheduler.step

    def step_then_kill(*args, **kwargs):
        scheduler_step(*args, **kwargs)
        if run.state.global_step + 1 == at:
            Path(os.environ["KILL_NOTE"]).write_text(run.config.output_dir)
            os.kill(os.getpid(), signum)

    run.scheduler.step = step_then_kill
    return run


sys.exit(sweep_cli(sys.argv[1:], setup_with_kill))

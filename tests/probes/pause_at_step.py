"""finetune that waits during optimizer step $PAUSE_AT_STEP until a SIGTERM reaches this process.

For a stop sent from outside (a scheduler's preemption notice) to land at a known step: on reaching
it, each rank writes $PAUSE_DIR/paused-<rank> and sleeps (at most 120 s) until its own SIGTERM handler,
the run's, has been called; then the run goes on, finishes the step and stops after it. Only in the
first attempt of a Slurm job: a requeued one (SLURM_RESTART_COUNT 1 and up) passes the step.
"""

import os
import signal
import sys
import time
from pathlib import Path

from finetune.mnli import cli
from finetune.run import setup

at, folder = int(os.environ["PAUSE_AT_STEP"]), Path(os.environ["PAUSE_DIR"])


def setup_with_pause(*launch):
    run = setup(*launch)
    if os.environ.get("SLURM_RESTART_COUNT", "0") != "0":
        return run
    scheduler_step = run.scheduler.step

    def step_then_pause(*args, **kwargs):
        scheduler_step(*args, **kwargs)
        if run.state.global_step + 1 != at:
            return
        received = []
        handler = signal.getsignal(signal.SIGTERM)  # the run's own, installed when training started

        def note(signum, frame):
            received.append(signum)
            handler(signum, frame)

        signal.signal(signal.SIGTERM, note)
        (folder / f"paused-{run.accelerator.process_index}").touch()
        deadline = time.monotonic() + 120
        while not received and time.monotonic() < deadline:
            time.sleep(0.05)
        signal.signal(signal.SIGTERM, handler)

    run.scheduler.step = step_then_pause
    return run


sys.exit(cli(sys.argv[1:], setup_with_pause))

"""finetune under `torchrun --max_restarts 1`: rank 1 crashes mid-training on the first attempt only.

The crash is a forward pre-hook on the real model that exits the process (as an OOM kill or a
lost node would), after leaving a marker so the test knows it happened.
"""

import os
import sys
from pathlib import Path

from finetune.config import parse_config
from finetune.mnli import close, execute, setup

run = setup(parse_config(sys.argv[1:]))
forward_calls = 0


def crash_after_45_micro_batches(module, args):
    global forward_calls
    forward_calls += 1
    if forward_calls == 45:
        Path(run.config.output_dir, "died_once").write_text(
            f"rank 1 exited at forward call {forward_calls}\n"
        )
        os._exit(1)


if os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0" and run.accelerator.process_index == 1:
    run.model.register_forward_pre_hook(crash_after_45_micro_batches)
execute(run)
close(run)

"""finetune that dies while writing the checkpoint named by $CRASH_IN_CHECKPOINT (e.g. 20).

A save_state pre-hook on the real Accelerator writes half a weights file into the staging folder
and exits the process, as a kill or a full disk in the middle of a write would.
"""

import os
import sys
from pathlib import Path

from finetune.config.parser import parse_config
from finetune.run import close, execute, setup

run = setup(parse_config(sys.argv[1:]))
target = f".checkpoint-{os.environ['CRASH_IN_CHECKPOINT']}.partial"


def crash_midway(models, weights, output_dir):
    if Path(output_dir).name == target:
        Path(output_dir, "model.safetensors").write_bytes(b"\x00" * 1000)
        os._exit(1)


run.accelerator.register_save_state_pre_hook(crash_midway)
execute(run)
close(run)

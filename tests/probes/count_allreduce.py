"""Runs finetune with a DDP comm hook that counts all-reduce rounds, then writes the count.

Run on 2 ranks by tests/e2e/test_distributed.py: `setup` builds the real run, the hook goes
on the real DDP model, `execute` trains it. One round = one synchronised backward (the hook sees
the last bucket once per round).
"""

import json
import sys
from pathlib import Path

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from finetune.config.parser import parse_config
from finetune.run import close, execute, setup

run = setup(parse_config(sys.argv[1:]))
rounds = 0


def counting_allreduce(process_group, bucket):
    global rounds
    rounds += bucket.is_last()
    return default_hooks.allreduce_hook(process_group, bucket)


run.model.register_comm_hook(None, counting_allreduce)
results = execute(run)
out = Path(run.config.output_dir) / f"allreduce_rounds_rank{run.accelerator.process_index}.json"
out.write_text(json.dumps({"rounds": rounds, "global_step": results["global_step"]}))
close(run)

"""finetune with one fault injected into the real model's forward pass ($FAULT at micro-batch $AT).

FAULT=oom raises torch.OutOfMemoryError, as a too-large batch does on a GPU; FAULT=nan turns the
logits into NaN, as a diverging run does. Nothing else about the run is changed.
"""

import os
import sys

import torch

from finetune.mnli import cli, setup

fault, at = os.environ["FAULT"], int(os.environ["AT"])
micro_batches = 0


def inject(module, args, output):
    global micro_batches
    if not module.training:
        return output
    micro_batches += 1
    if micro_batches < at:
        return output
    if fault == "oom":
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected by the test)")
    output.logits = output.logits * float("nan")
    return output


def setup_with_fault(config):
    run = setup(config)
    run.model.register_forward_hook(inject)
    return run


sys.exit(cli(sys.argv[1:], setup_with_fault))

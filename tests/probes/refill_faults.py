"""Runs finetune's setup, then prints the fewest page faults that refilling a freed 64 MB block costs.

Launched by tests/test_runtime.py in a process of its own: glibc's malloc settings are process-wide.
One step's embedding gradient is such a block (47 MB for MiniLM), over glibc's 32 MB mmap threshold.
The fewest of several refills: a library thread that takes heap memory in between can push one
refill into fresh pages (CI once counted all 16,384 pages on the first refill), and the steady
state of a training run is what the setting is for.
"""

import resource
import sys

import torch

from finetune.config.parser import parse_config
from finetune.run import close, setup


def faults_to_fill() -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(64 * 2**20, dtype=torch.uint8)  # filled, then freed at once
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


close(setup(parse_config(sys.argv[1:])))
faults_to_fill()
print(min(faults_to_fill() for _ in range(5)))

"""Runs finetune's setup, then prints two counts of minor page faults: the fewest that refilling a freed
64 MB block costs, and what first touching a fresh 64 MB anonymous mapping costs on this machine.

Launched by tests/e2e/test_runtime.py in a process of its own: glibc's malloc settings are process-wide.
One step's embedding gradient is such a block (47 MB for MiniLM), over glibc's 32 MB mmap threshold.
The fewest of several refills: a library thread that takes heap memory in between can push one
refill into fresh pages (CI once counted all 16,384 pages on the first refill), and the steady
state of a training run is what the setting is for. The fresh mapping is the yardstick: a fault maps
one page or one folio of whatever size the kernel chooses (4 kB pages, 16 kB or 2 MB transparent huge
pages), so the block's cost is judged against the kernel's own, not against a page size.
"""

import mmap
import resource
import sys

import torch

from finetune.config.parser import parse_config
from finetune.run import close, setup

BLOCK_BYTES = 64 * 2**20


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def faults_to_fill() -> int:
    before = faults()
    torch.ones(BLOCK_BYTES, dtype=torch.uint8)  # filled, then freed at once
    return faults() - before


def faults_to_map_fresh() -> int:
    """Private anonymous memory, as malloc's mmap gets it (Python's default mmap is shared: shmem)."""
    block = mmap.mmap(-1, BLOCK_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    before = faults()
    for offset in range(0, BLOCK_BYTES, mmap.PAGESIZE):
        block[offset] = 1
    touched = faults() - before
    block.close()
    return touched


close(setup(parse_config(sys.argv[1:])))
faults_to_fill()
print(min(faults_to_fill() for _ in range(5)), min(faults_to_map_fresh() for _ in range(3)))

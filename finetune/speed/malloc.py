"""glibc's malloc keeping freed memory (--keep_freed_memory)."""

from __future__ import annotations

import ctypes

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def _glibc_mallopt():
    try:
        return ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return None


def is_glibc() -> bool:
    return _glibc_mallopt() is not None


def keep_freed_memory() -> bool:
    """Have glibc keep freed memory for the next allocation instead of handing it back to the kernel.

    Each training step allocates the word embeddings' dense gradient afresh (vocab x hidden: 47 MB
    for MiniLM). glibc serves blocks over its mmap threshold with mmap and unmaps them when freed, so
    every step the kernel maps and zero-fills those pages again. What it costs: memory freed after the
    peak stays with the process. Process-wide and not undone: a run that does not want it never calls
    it, which leaves glibc's adaptive thresholds alone. False where libc is not glibc.
    """
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return False
    kept = {_M_MMAP_MAX: 0, _M_TRIM_THRESHOLD: 2**31 - 1}  # the largest C int mallopt takes
    return all(mallopt(option, value) == 1 for option, value in kept.items())


def resolve_keep_freed_memory(requested: str, device_type: str, mixed_precision: str) -> str:
    """--keep_freed_memory as "true" or "false". auto: on for CPU training in bf16, where the page
    faults it saves pay; off in fp32, where they did not (docs/benchmarks.md). GPUs: off."""
    if requested != "auto":
        return requested
    return "true" if device_type == "cpu" and mixed_precision == "bf16" else "false"

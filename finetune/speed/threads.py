"""torch's intra-op threads on a CPU: one per core that other jobs leave free.

On shared cores torch's default (a thread per core) makes each op's threads wait for each other's turn.
`make bench-threads` (docs/log.md, 2026-12-02: MiniLM, 8 steps, 2 cores) measured one thread against
two at 9.8 vs 6.7 s beside no CPU-bound neighbour, 9.9 vs 16.6 s beside one and 12.1 vs 61.6 s beside
two: as many threads as free cores is the fastest of the counts measured in each case.

Other jobs' use is measured, not guessed from the load average (which still counts, for a minute, a job
that just ended): the machine's busy CPU time in /proc/stat from this module's import (the first thing
`import finetune` does) to the choice (when the accelerator starts), less this process's own. Sibling
ranks on the same machine count as busy, and each local process gets at most its share of the cores.
An OMP_NUM_THREADS set by the user or the launcher (torchrun sets 1 for several local ranks) is kept.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import resource
import time

_MIN_WINDOW_S = 0.25  # a shorter window (a run started right after the import) is waited out


def _busy_s() -> float | None:
    """The machine's busy CPU seconds since boot (user, nice, system, irq, softirq; not idle, iowait or
    steal), summed over its cores; None where /proc/stat is not Linux's."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
        ticks = [int(fields[i]) for i in (1, 2, 3, 6, 7)]
    except (OSError, IndexError, ValueError):
        return None
    return sum(ticks) / os.sysconf("SC_CLK_TCK")


def _own_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return usage.ru_utime + usage.ru_stime


def _snapshot() -> tuple[float, float | None, float]:
    return time.monotonic(), _busy_s(), _own_s()


# The window's start: this module's import, then each choice's time (a study's later runs measure the
# machine during the run before them).
_window = [_snapshot()]


def others_busy_cores() -> float | None:
    """The cores' worth of CPU that other processes used since this module's import or the last
    choice; None where the machine does not say."""
    started = _window[0]
    if time.monotonic() - started[0] < _MIN_WINDOW_S:
        time.sleep(_MIN_WINDOW_S - (time.monotonic() - started[0]))
    now = _window[0] = _snapshot()
    if now[1] is None or started[1] is None:
        return None
    return max(0.0, (now[1] - started[1]) - (now[2] - started[2])) / (now[0] - started[0])


@dataclasses.dataclass(frozen=True)
class ThreadChoice:
    threads: int
    default: int  # torch's own: a thread per core
    cores: int  # this process's (its affinity, not the machine's)
    busy_cores: float | None  # other jobs' (None: not measured, or the environment chose)
    set_by: str | None  # the variable that chose, e.g. "OMP_NUM_THREADS"; None: this rule chose


def threads_for(cores: int, busy_cores: float, local_processes: int, default: int) -> int:
    """The rule: a thread per core other jobs leave free, at most this process's share of the cores and
    torch's default, at least one."""
    free = round(cores - busy_cores)
    return max(1, min(default, cores // max(1, local_processes), free))


def choose_threads(local_processes: int, default: int) -> ThreadChoice:
    """What this process runs: the environment's choice where it made one, else the rule's."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get(variable, "").strip():
            return ThreadChoice(default, default, cores, None, variable)
    busy = others_busy_cores()
    if busy is None:
        return ThreadChoice(default, default, cores, None, None)
    return ThreadChoice(threads_for(cores, busy, local_processes, default), default, cores, busy, None)


@functools.cache
def _torch_default() -> int:
    """torch's thread count before this rule first set it: a study's later run may get more threads
    than an earlier one got."""
    import torch

    return torch.get_num_threads()


def apply_threads() -> ThreadChoice:
    """Sets torch's intra-op threads by `choose_threads` (before the model's first op) for this process
    and its siblings on this machine (torchrun's LOCAL_WORLD_SIZE), and returns the choice."""
    import torch

    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    choice = choose_threads(local_processes, _torch_default())
    if choice.threads != torch.get_num_threads():
        torch.set_num_threads(choice.threads)
    return choice


def threads_notice(choice: ThreadChoice) -> str | None:
    """A line where other jobs took cores and this rule gave torch fewer threads than its default; None
    otherwise."""
    if choice.set_by is not None or choice.busy_cores is None or choice.threads >= choice.default:
        return None
    return (
        f"note: other jobs kept {choice.busy_cores:.1f} of this process's {choice.cores} cores busy as it "
        f"started, so torch runs {choice.threads} thread{'s' if choice.threads > 1 else ''} "
        "(one per free core measured fastest: docs/log.md); OMP_NUM_THREADS chooses instead"
    )

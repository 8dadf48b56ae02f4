"""Stop signals (SIGTERM, Ctrl-C): every rank stops at the same step."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

import torch

from finetune.errors import StoppedAfterFinish


class StopSignals:
    """SIGTERM (preemption) and SIGINT (Ctrl-C) only set a flag; the loop stops at the next step.

    A second Ctrl-C stops at once, without a checkpoint.
    """

    def __init__(self):
        self.received: str | None = None
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame):
        if self.received == "SIGINT" and signum == signal.SIGINT:
            # At once: no step finishes, no checkpoint is written (a half-written one stays under its
            # .partial name, so `auto` never takes it), no traceback.
            print(
                "\nerror: stopped by a second Ctrl-C; no new checkpoint written", file=sys.stderr, flush=True
            )
            os._exit(128 + signal.SIGINT)
        self.received = signal.Signals(signum).name

    def requested(self, accelerator) -> str | None:
        """Collective with several processes: a signal seen by any rank stops all at the same step."""
        if accelerator.num_processes == 1:
            return self.received
        seen = torch.tensor([self.received is not None], dtype=torch.float32, device=accelerator.device)
        if accelerator.reduce(seen, "sum").item() == 0:
            return None
        return self.received or "SIGTERM"  # a peer's signal; preemption is the usual cause

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def only_noted():
    """While a finished run closes (trackers, process group): SIGTERM and Ctrl-C are noted in the list
    this yields, not raised, so the closing is not cut short (cut, it printed "Exception ignored ...
    Stopped" or ended 143 with no line, though results.json was written). A second one raises
    StoppedAfterFinish at once: a closing that hangs (a peer gone, a tracker's upload) can still be
    stopped. Main thread only."""
    noted: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return

    def note(signum, frame):
        noted.append(signal.Signals(signum).name)
        if len(noted) > 1:
            raise StoppedAfterFinish(noted[0])

    previous = {s: signal.signal(s, note) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield noted
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


STOP_EXIT_CODES = (128 + signal.SIGTERM, 128 + signal.SIGINT)
"""What a rank exits with once a stop signal stopped it (its checkpoint written, or outside training
with nothing to lose): TrainingInterrupted's and Stopped's 143 and 130."""


def stopped_launch_code(error: BaseException) -> int | None:
    """The exit code a launch ended by `error` stands for where its workers were stopped by a signal,
    else None (a failure, left as the launcher reports it).

    torch elastic's agent (`accelerate launch`'s multi-process path, torchrun) counts any non-zero exit
    of a worker as a failure: ChildFailedError, which ends the launcher 1 with a traceback although every
    rank said where its checkpoint is and exited 143, so a scheduler that requeues on 143 does not. The
    stop is a ChildFailedError whose failed ranks exited 143 or 130, or were ended by the agent's own
    SIGTERM to the ranks still running after the first exit (-15; the failures' order is by the second,
    so it does not say which came first): 143 where any rank exited SIGTERM's code (the agent's -15
    does not count: after Ctrl-C the launch exits 130). The agent itself signalled (a `kill`
    of the launcher: it forwards the signal to the workers and waits for them): 128 + the signal.
    accelerate's one-process launcher: its CalledProcessError's code."""
    import subprocess

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if isinstance(error, SignalException):
        return 128 + int(error.sigval)
    if isinstance(error, subprocess.CalledProcessError):
        return error.returncode if error.returncode in STOP_EXIT_CODES else None
    if not isinstance(error, ChildFailedError) or not error.failures:
        return None
    codes = {failure.exitcode for failure in error.failures.values()}
    stopped = codes & set(STOP_EXIT_CODES)
    return max(stopped) if stopped and codes <= {*STOP_EXIT_CODES, -signal.SIGTERM} else None

"""The entry scripts' signals. Ctrl-C while a script starts (seconds of imports, before `cli` handles it),
and Ctrl-C or SIGTERM while the run's modules import once the flags parsed: one line, not a traceback.
While a command runs: both raise, for the command to end with one line. Once `cli` returned: ignored
while the interpreter exits. Only the entry points call these; importing this does nothing."""

from __future__ import annotations

import contextlib
import os
import signal
import threading

from finetune.distributed.launch_env import say_once
from finetune.errors import Stopped


def quiet_ctrl_c_while_starting() -> None:
    """Until `cli` restores Python's own handler: Ctrl-C prints one line and exits 130."""
    signal.signal(signal.SIGINT, _exit_at_once)


def _exit_at_once(signum, frame):
    """A stop signal while starting (imports: nothing written, no cleanup to run): one line, exit 128 + N."""
    said = "interrupted by Ctrl-C" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
    say_once(f"error: {said} while starting; nothing was written")
    os._exit(128 + signum)


@contextlib.contextmanager
def exit_at_once_while_importing():
    """Around the import of the run's modules (torch, transformers: seconds), once the flags parsed and
    before anything is written: Ctrl-C or SIGTERM prints one line and exits at once (130, 143). Raised
    as an exception inside those imports, a KeyboardInterrupt can abort the process from a C++ extension
    (SIGABRT, pybind11's "error_already_set") or be swallowed by the import machinery, and the run goes
    on (docs/log.md, 2026-11-28). Outside the main thread (no signal handlers there): nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _exit_at_once) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def stop_signals_raise():
    """While a command runs (`finetune`, the sweep): Ctrl-C raises KeyboardInterrupt and SIGTERM raises
    `Stopped`, for the command to end where it is with one line (training takes both over, to stop at a
    step). The caller's handlers come back at the end. Outside the main thread (no signal handlers
    there): nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
                signal.SIGTERM: signal.signal(signal.SIGTERM, _raise_stopped)}  # fmt: skip
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _raise_stopped(signum, frame):
    raise Stopped(signal.Signals(signum).name)


def ignore_while_exiting() -> None:
    """The scripts' last step, once `cli` returned: a stop signal while the interpreter exits (threads,
    atexit hooks) would end the process 143 with no line after a complete run. Only for a process that
    is about to exit: the handlers are not given back."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)

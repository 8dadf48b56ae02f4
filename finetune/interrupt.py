"""The entry scripts' signals at their two edges. Ctrl-C while a script starts (seconds of imports, before
`cli` handles it): one line, not a traceback. Stop signals once `cli` returned: ignored while the
interpreter exits. Only the entry scripts call these; importing this does nothing."""

from __future__ import annotations

import os
import signal
import sys


def quiet_ctrl_c_while_starting() -> None:
    """Until `cli` restores Python's own handler: Ctrl-C prints one line and exits 130."""

    def interrupted(signum, frame):
        print("error: interrupted by Ctrl-C while starting; nothing was written", file=sys.stderr, flush=True)
        os._exit(130)  # mid-import: no cleanup to run, nothing to save

    signal.signal(signal.SIGINT, interrupted)


def ignore_while_exiting() -> None:
    """The scripts' last step, once `cli` returned: a stop signal while the interpreter exits (threads,
    atexit hooks) would end the process 143 with no line after a complete run. Only for a process that
    is about to exit: the handlers are not given back."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)

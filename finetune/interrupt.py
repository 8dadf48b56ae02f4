"""Ctrl-C while a script starts (seconds of imports, before `cli` handles it): one line, not a
traceback. Only the entry scripts call `quiet_ctrl_c_while_starting`; importing this does nothing."""

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

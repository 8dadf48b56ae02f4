"""`python -m finetune [--flags]`, `accelerate launch -m finetune [--flags]` and the `finetune` console
script: Ctrl-C during the seconds of imports is one line (finetune/interrupt.py), then `finetune.cli`."""

from __future__ import annotations

import sys

from finetune.interrupt import quiet_ctrl_c_while_starting


def entry() -> int:
    """The console script's and `-m finetune`'s entry: quiet Ctrl-C first, then the heavy imports."""
    quiet_ctrl_c_while_starting()  # before the seconds of imports below
    if sys.argv[0].endswith("__main__.py"):  # `--help` says `usage: python -m finetune`, not __main__.py
        sys.argv[0] = "python -m finetune"
    from finetune.cli import script

    return script()


if __name__ == "__main__":
    sys.exit(entry())

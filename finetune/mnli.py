"""Fine-tune a BERT-style model on MNLI: `accelerate launch finetune/mnli.py [--flags]`.

The same run as `finetune [--flags]` and `accelerate launch -m finetune` (finetune/cli.py); this script
stays for the commands that name it. `python finetune/mnli.py` and `torchrun finetune/mnli.py` work too.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a file: import this checkout's package, and keep finetune/ itself off sys.path.
    sys.path[0] = str(Path(__file__).resolve().parents[1])
if __name__ == "__main__":
    from finetune.interrupt import quiet_ctrl_c_while_starting

    quiet_ctrl_c_while_starting()  # before the seconds of imports below

from finetune.cli import cli, main, script

__all__ = ["cli", "main"]

if __name__ == "__main__":
    sys.exit(script())

"""Hyperparameter sweeps with Optuna: `python finetune/sweep.py --sweep_config sweep.yaml [training flags]`.

The same as `python -m finetune.sweep`, `accelerate launch finetune/sweep.py`, `torchrun finetune/sweep.py`;
start the same command several times (or as a Slurm job array) and the workers share one study. The
study loop is finetune/studies/sweep.py; the YAML file and the workers are described in docs/sweeps.md.
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

from finetune.studies.sweep_command import sweep_cli, sweep_main

__all__ = ["sweep_cli", "sweep_main"]

if __name__ == "__main__":
    from finetune.interrupt import ignore_while_exiting

    code = sweep_cli()
    ignore_while_exiting()  # as finetune/cli.py's script(): the sweep is over, the process only exits
    sys.exit(code)

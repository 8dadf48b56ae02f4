"""Fine-tune on any GLUE task or your own files: `accelerate launch finetune/glue.py --task_name sst2`.

The same run as `finetune` (finetune/cli.py; it defaults to MNLI); see `--help` for the tasks, and
`--task_name custom --text_columns ... --label_column ...` for a CSV/JSONL/TSV of your own.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parents[1])
if __name__ == "__main__":
    from finetune.interrupt import quiet_ctrl_c_while_starting

    quiet_ctrl_c_while_starting()  # before the seconds of imports below

from finetune.cli import script

if __name__ == "__main__":
    sys.exit(script())

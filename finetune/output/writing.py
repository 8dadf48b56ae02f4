"""Every write into the output folder goes through `writing()`: a failure is one line."""

from __future__ import annotations

import contextlib
from pathlib import Path

from safetensors import SafetensorError

from finetune.errors import TrainingFailed, _reason
from finetune.training.checkpoint import complete_checkpoints


@contextlib.contextmanager
def writing(what: str, output_dir: str | Path):
    """A failed write into the output folder (full disk, read-only file) as one line that says what
    was being written and what is safe. torch and safetensors report a full disk as RuntimeError."""
    try:
        yield
    except (OSError, RuntimeError, SafetensorError) as error:
        previous = complete_checkpoints(output_dir)
        kept = f" {previous[-1].name} is intact;" if previous else ""
        raise TrainingFailed(
            f"writing {what} in {output_dir} failed ({_reason(error)}); is the disk full or the file "
            f"read-only?{kept} free space or fix the permissions, then rerun"
            + (" with --resume_from_checkpoint auto" if previous else "")
        ) from error

"""The output group of flags: the run's folder, checkpoints and resuming, logs and trackers, the Hub."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import huggingface_hub.constants

from finetune.errors import ConfigError

ReportTo = Literal["auto", "wandb", "tensorboard", "all", "none"]
DEFAULT_LOGGING_STEPS = 50
"""--logging_steps for runs of 1,000 steps or more, and the default --eval_steps."""


def resolve_logging_steps(logging_steps: int | None, total_updates: int) -> int:
    """--logging_steps, or about 20 log lines per run: a 20-step run's curves get 20 points, not one
    (HF Trainer takes a ratio below 1 for the same end)."""
    if logging_steps is not None:
        return logging_steps
    return min(DEFAULT_LOGGING_STEPS, max(1, total_updates // 20))


@dataclass(frozen=True)
class OutputArgs:
    """Output: the run's folder, checkpoints and resuming, logs and trackers, the Hub."""

    output_dir: str | None = None
    """Folder for the model, results, metrics, checkpoints; default outputs/<task_name>."""
    overwrite_output_dir: bool = False
    """Allow writing into an output_dir that holds a finished run."""
    checkpointing_steps: str | None = None
    """Save full training state every N optimizer steps, or 'epoch'."""
    resume_from_checkpoint: str | None = None
    """Checkpoint folder to resume from, or 'auto' for the newest complete one in output_dir."""
    save_total_limit: int | None = None
    """Keep the newest N checkpoints (plus the best one); older ones are removed."""
    logging_steps: int | None = None
    """Log loss, learning rate and throughput every N optimizer steps (and the last); default: about 20
    points per run, min(50, max(1, steps // 20)): 50 from 1,000 steps on, every step up to 39."""
    report_to: ReportTo = "auto"
    """Tracker: wandb, tensorboard, all (both) or none; metrics.jsonl is always written. auto: wandb where
    this machine is logged in to W&B (WANDB_API_KEY, or `wandb login`), otherwise none."""
    project_name: str | None = None
    """Tracker project name (the W&B project); default finetune-<task_name>."""
    run_name: str | None = None
    """Name of the run in W&B; default: W&B's own."""
    save_plots: bool = True
    """Draw the run's charts as PNG files on rank 0: training_curves.png, confusion_matrix.png (custom
    single-label tasks, token classification), reliability_diagram.png (a classifier with a fitted
    temperature), seed_curves.png (--seeds). false: none, and the model card links none. Each chart costs
    0.1-0.3 s of CPU, the first in a process about 0.8 s (matplotlib's import and fonts): worth skipping for
    many short runs, or where a tracker draws the curves."""
    push_to_hub: bool = False
    """Upload the model, its card and results to the Hub at the end."""
    hub_model_id: str | None = None
    """Hub repository for --push_to_hub (user/name); default: the output_dir's name."""

    def __post_init__(self):
        """Checks of this group's flags alone."""
        if self.logging_steps is not None and self.logging_steps <= 0:
            raise ConfigError(f"--logging_steps must be a positive integer, got {self.logging_steps}")
        if self.save_total_limit is not None and self.save_total_limit <= 0:
            raise ConfigError(
                f"--save_total_limit must be a positive integer or left unset, got {self.save_total_limit}"
            )
        cs = self.checkpointing_steps
        if cs is not None and cs != "epoch" and not (cs.isdigit() and int(cs) > 0):
            raise ConfigError(f"--checkpointing_steps must be a positive integer or 'epoch', got {cs!r}")
        if self.overwrite_output_dir and self.resume_from_checkpoint:
            raise ConfigError(
                "--overwrite_output_dir starts the run over and --resume_from_checkpoint continues it: "
                "give one"
            )
        if self.push_to_hub and huggingface_hub.constants.HF_HUB_OFFLINE:
            raise ConfigError("--push_to_hub needs the Hub; HF_HUB_OFFLINE is set: unset it or drop the flag")

    @property
    def checkpoint_every_epoch(self) -> bool:
        return self.checkpointing_steps == "epoch"

    @property
    def checkpoint_every_n_steps(self) -> int | None:
        cs = self.checkpointing_steps
        return int(cs) if cs is not None and cs != "epoch" else None

"""The preference group of flags: DPO's loss and its reference model (TRL's DPOConfig names)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from finetune.errors import ConfigError

LossType = Literal["sigmoid", "ipo", "simpo"]


@dataclass(frozen=True)
class PreferenceArgs:
    """Preference tuning (--task_type dpo): the loss and its reference model (TRL's names)."""

    beta: float = 0.1
    """dpo: how far the policy may move from the reference (the log-ratios' scale; TRL's beta); > 0."""
    loss_type: LossType = "sigmoid"
    """dpo: sigmoid (DPO: -log sigmoid(beta x the policy's log-ratio margin over the reference's)), ipo
    (the margin of mean log-probs regressed to 1/(2 beta)), or simpo (reference-free: mean log-probs,
    -log sigmoid(beta x margin - --simpo_gamma))."""
    simpo_gamma: float = 0.5
    """dpo with --loss_type simpo: the target reward margin (TRL's simpo_gamma)."""
    rpo_alpha: float | None = None
    """dpo: add alpha x the chosen completions' SFT loss (mean cross-entropy per chosen target token of
    the window) to the DPO loss (RPO); default: none."""
    ref_model_name_or_path: str | None = None
    """dpo: the reference model's folder; default: the starting model itself (with --use_peft, the
    model with its adapters disabled: no second copy)."""
    precompute_ref_log_probs: bool = False
    """dpo: compute the reference's log-probs of every training and validation pair once, before
    training, instead of a reference forward per micro-batch (evaluation uses them too)."""

    def __post_init__(self):
        """Checks of this group's flags alone."""
        if self.beta <= 0:
            raise ConfigError(
                f"--beta must be greater than 0, got {self.beta:g}; TRL's default is 0.1",
                flag="--beta",
                fix="set --beta 0.1",
            )
        if self.rpo_alpha is not None and self.rpo_alpha < 0:
            raise ConfigError(f"--rpo_alpha must be 0 or more, got {self.rpo_alpha:g}", flag="--rpo_alpha")

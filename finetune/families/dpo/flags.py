"""DPO's flags (`--task_type dpo`): the preference loss and its reference model (TRL's DPOConfig names).
Read by `finetune.config` through the seam (finetune/families/__init__.py FLAG_GROUPS). DPO also reads
the causal-LM family's model, template and generation flags (families/causal_lm/flags.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from finetune.config.families import SPEED, Owned
from finetune.errors import ConfigError

NAME = "dpo"
LossType = Literal["sigmoid", "ipo", "simpo"]
PrefixSharing = Literal["auto", "true", "false"]
OWNED = {
    "beta": Owned((NAME,), "scales a preference loss's log-ratios"),
    "loss_type": Owned((NAME,), "chooses a preference loss"),
    "simpo_gamma": Owned((NAME,), "is SimPO's reward margin"),
    "rpo_alpha": Owned((NAME,), "adds the chosen completions' SFT loss to a preference loss"),
    "ref_model_name_or_path": Owned((NAME,), "names a preference loss's reference model"),
    "precompute_ref_log_probs": Owned(
        (NAME,),
        "precomputes a preference loss's reference log-probs",
        left_out=f"{SPEED} (the same reference's log-probs, computed once)",
    ),
    "disable_dropout": Owned((NAME,), "chooses whether a preference policy keeps its dropout", before=False),
    "prefix_sharing": Owned(
        (NAME,),
        "lays out a preference pair's shared tokens once",
        asks=("true",),
        left_out=f"{SPEED} (the same log-probs, from fewer tokens)",
    ),
}
"""The flags only this family reads, as the one refusal rule (config/families.py) and the run's identity
(config/identity.py) read them."""


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

    disable_dropout: bool = True
    """dpo: turn off every dropout of the policy (the model's modules, its attention's, LoRA's), as TRL's
    DPOConfig does by default: the reference scores without dropout, so a policy with it would compare
    noisy log-probs against clean ones. --disable_dropout false keeps the model's and --lora_dropout."""
    prefix_sharing: PrefixSharing = "auto"
    """dpo: run the tokens a pair's chosen and rejected sequences share (the prompt) once, one row a
    pair with a 4-D attention mask, instead of padding both to one width: the same log-probs from fewer
    tokens. auto: where the model passes a check at start (sdpa attention, no sliding window, the same
    log-probs as the padded layout); true: refuse a model that fails it; false: the padded layout."""

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

"""DPO's arithmetic, as TRL names it: a pair's sequence log-probs (summed over its completion's target
tokens; IPO and SimPO: their mean), its loss (sigmoid, ipo, simpo) and its rewards."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from finetune.families.causal_lm.batches import _at
from finetune.families.dpo.collate import Targets

MEANS = ("ipo", "simpo")
"""The losses over a completion's mean log-prob per target token (as their papers define them)."""


def sequence_logps(logits: torch.Tensor, targets: Targets) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sequence (chosen i, rejected pairs + i): (the log-probs of its target tokens summed, in fp32;
    their count), and each target's cross-entropy in `targets`' order (RPO's SFT term). `logits`: every
    token's or only the targets' (`batches.head_at`), in either layout (`collate.py`)."""
    each = F.cross_entropy(_at(logits, targets.positions).float(), targets.ids, reduction="none")
    summed = torch.zeros(targets.counts.shape[0], dtype=each.dtype, device=each.device)
    return summed.index_add(0, targets.sequences, -each), targets.counts, each


def as_loss_reads(logps: torch.Tensor, counts: torch.Tensor, loss_type: str) -> torch.Tensor:
    """The sequence log-probs the loss reads: sums, or for ipo and simpo means per target token."""
    return logps / counts.clamp(min=1) if loss_type in MEANS else logps


@dataclass
class PairScores:
    """Per pair, on the device."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor


def pair_losses(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    ref_chosen: torch.Tensor | None,
    ref_rejected: torch.Tensor | None,
    loss_type: str,
    beta: float,
    simpo_gamma: float,
) -> PairScores:
    """Each pair's loss and rewards from the policy's and the reference's log-probs (as `as_loss_reads`
    gives them). sigmoid (DPO): -logsigmoid(beta (pi_logratio - ref_logratio)); ipo: (pi_logratio -
    ref_logratio - 1/(2 beta))^2; simpo (reference-free; TRL's CPO trainer): -logsigmoid(beta (chosen -
    rejected) - simpo_gamma), rewards beta x the policy's log-probs. DPO's and IPO's rewards are beta x
    (policy - reference), detached."""
    if loss_type == "simpo":
        losses = -F.logsigmoid(beta * (chosen - rejected) - simpo_gamma)
        return PairScores(losses, beta * chosen.detach(), beta * rejected.detach())
    logits = (chosen - rejected) - (ref_chosen - ref_rejected)
    losses = (logits - 1 / (2 * beta)) ** 2 if loss_type == "ipo" else -F.logsigmoid(beta * logits)
    return PairScores(
        losses, beta * (chosen - ref_chosen).detach(), beta * (rejected - ref_rejected).detach()
    )


def reward_metrics(scores: PairScores, chosen: torch.Tensor, rejected: torch.Tensor) -> dict:
    """The log line's (sum, count) pairs, TRL's names: each pair counted once wherever it ran."""
    pairs = torch.full((), chosen.shape[0], dtype=torch.float64, device=chosen.device)
    margins = scores.chosen_rewards - scores.rejected_rewards
    sums = {
        "rewards/chosen": scores.chosen_rewards,
        "rewards/rejected": scores.rejected_rewards,
        "rewards/accuracies": (margins > 0).to(chosen.dtype),
        "rewards/margins": margins,
        "logps/chosen": chosen.detach(),
        "logps/rejected": rejected.detach(),
    }
    return {name: (values.sum(dtype=torch.float64), pairs) for name, values in sums.items()}

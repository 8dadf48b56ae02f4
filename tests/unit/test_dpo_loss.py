"""DPO's per-pair losses and rewards against values computed by hand from their papers' formulas (TRL's
names), and --beta's refusal."""

from __future__ import annotations

import math

import pytest
import torch

from finetune.config.parser import parse_config
from finetune.families.dpo.loss import as_loss_reads, pair_losses, reward_metrics
from tests.helpers import refused

CHOSEN, REJECTED = torch.tensor([-4.0, -9.0]), torch.tensor([-6.0, -5.0])
REF_CHOSEN, REF_REJECTED = torch.tensor([-5.0, -8.0]), torch.tensor([-5.5, -6.0])


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x))


def test_sigmoid_is_dpo_minus_log_sigmoid_of_beta_times_the_log_ratio_margin():
    scores = pair_losses(CHOSEN, REJECTED, REF_CHOSEN, REF_REJECTED, "sigmoid", 0.1, 0.5)
    # pair 0: (-4 - -6) - (-5 - -5.5) = 2 - 0.5 = 1.5; pair 1: (-9 - -5) - (-8 - -6) = -4 + 2 = -2
    expected = [-log_sigmoid(0.1 * 1.5), -log_sigmoid(0.1 * -2.0)]
    assert scores.losses.tolist() == pytest.approx(expected, rel=1e-6)
    assert scores.chosen_rewards.tolist() == pytest.approx([0.1 * 1.0, 0.1 * -1.0])
    assert scores.rejected_rewards.tolist() == pytest.approx([0.1 * -0.5, 0.1 * 1.0])


def test_ipo_regresses_the_margin_of_mean_log_probs_to_half_over_beta():
    counts = torch.tensor([2, 4])
    chosen, rejected = as_loss_reads(CHOSEN, counts, "ipo"), as_loss_reads(REJECTED, counts, "ipo")
    ref_chosen, ref_rejected = (
        as_loss_reads(REF_CHOSEN, counts, "ipo"),
        as_loss_reads(REF_REJECTED, counts, "ipo"),
    )
    scores = pair_losses(chosen, rejected, ref_chosen, ref_rejected, "ipo", 0.25, 0.5)
    # means: pair 0 (/2): (-2 - -3) - (-2.5 - -2.75) = 0.75; pair 1 (/4): (-2.25 - -1.25) - (-2 - -1.5) = -0.5
    expected = [(0.75 - 1 / 0.5) ** 2, (-0.5 - 1 / 0.5) ** 2]
    assert scores.losses.tolist() == pytest.approx(expected, rel=1e-6)


def test_simpo_is_reference_free_with_gamma_subtracted_after_beta():
    """TRL's CPO trainer: logits = (chosen - rejected) - gamma / beta; loss = -logsigmoid(beta * logits)."""
    counts = torch.tensor([2, 4])
    chosen, rejected = as_loss_reads(CHOSEN, counts, "simpo"), as_loss_reads(REJECTED, counts, "simpo")
    scores = pair_losses(chosen, rejected, None, None, "simpo", 2.0, 0.5)
    # means: pair 0: -2 - -3 = 1; pair 1: -2.25 - -1.25 = -1
    expected = [-log_sigmoid(2.0 * 1 - 0.5), -log_sigmoid(2.0 * -1 - 0.5)]
    assert scores.losses.tolist() == pytest.approx(expected, rel=1e-6)
    assert scores.chosen_rewards.tolist() == pytest.approx([2.0 * -2, 2.0 * -2.25])


def test_reward_metrics_are_sums_over_the_pairs_with_their_count():
    scores = pair_losses(CHOSEN, REJECTED, REF_CHOSEN, REF_REJECTED, "sigmoid", 0.1, 0.5)
    metrics = reward_metrics(scores, CHOSEN, REJECTED)
    means = {name: float(total / count) for name, (total, count) in metrics.items()}
    assert means["rewards/accuracies"] == 0.5  # pair 0's chosen reward beats its rejected, pair 1's not
    assert means["rewards/margins"] == pytest.approx((0.15 + -0.2) / 2)
    assert means["logps/chosen"] == -6.5 and means["logps/rejected"] == -5.5
    assert {float(count) for _, count in metrics.values()} == {2.0}


@pytest.mark.parametrize("beta", ["0", "-0.1"])
def test_beta_zero_or_negative_is_refused_naming_the_flag(beta, tmp_path):
    with refused("--beta", "--beta 0.1"):
        parse_config([*pairs_file(tmp_path), "--task_type", "dpo", "--beta", beta])


def test_dpo_flags_are_refused_for_another_family(tmp_path):
    with refused("--beta"):
        parse_config([*pairs_file(tmp_path), "--task_type", "causal_lm", "--beta", "0.2"])


def pairs_file(tmp_path) -> list[str]:
    train = tmp_path / "train.jsonl"
    train.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n')
    return ["--train_file", str(train), "--output_dir", str(tmp_path / "out")]

"""The real thing, small: pretrained MiniLM fine-tuned on real MNLI rows from ../shared."""

import json

import pytest

from tests.e2e.idle_runs import MINILM_STEPS
from tests.helpers import SHARED_MNLI

pytestmark = pytest.mark.slow


@pytest.mark.skipif(not SHARED_MNLI.is_dir(), reason="needs ../shared/data/mnli beside the checkout")
def test_minilm_learns_mnli_above_chance(minilm_full):
    """100 steps x 32 of full fine-tuning, the command line (the `minilm_full` run)."""
    out, results = minilm_full
    assert results["global_step"] == MINILM_STEPS
    assert results["eval_matched_samples"] == 1000  # real validation_matched rows (of 9,815)
    # Chance is ~0.35 (the largest class). Seeds 1, 2, 3 and 42 (fp32, a Zen 3) reached 0.525, 0.496, 0.524
    # and 0.512 on these 1,000 rows, mean 0.514, standard deviation 0.014 (docs/log.md, 2026-11-28): the
    # bar sits 4.8 standard deviations under that mean and 0.1 over chance.
    assert results["eval_matched_accuracy"] > 0.45, results
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]  # training lines (evaluations hold eval_loss)
    assert losses[-1] < losses[0]

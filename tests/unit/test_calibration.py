"""Calibration metrics (ECE, Brier) against plain numpy, the temperature fit, T baked into a head."""

import numpy as np
import pytest
import torch

from finetune.data.tasks import custom_task
from finetune.errors import ConfigError
from finetune.families.family import greater_is_better_default
from finetune.families.sequence_classification.calibration import check_calibration, scale_head
from finetune.metrics.calibration import (
    TEMPERATURE_RANGE,
    cross_fitted_logits,
    fit_temperature,
    multi_label_calibration,
    single_label_calibration,
    temperature_bound,
)


def numpy_ece(confidence: np.ndarray, correct: np.ndarray, bins: int = 15) -> float:
    edges = np.linspace(0, 1, bins + 1)
    total = 0.0
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        inside = (confidence > lo) & (confidence <= hi)
        if inside.any():
            total += inside.mean() * abs(correct[inside].mean() - confidence[inside].mean())
    return total


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_single_label_ece_and_brier_match_numpy():
    rng = np.random.default_rng(0)
    logits, labels = rng.normal(0, 3, (500, 4)), rng.integers(0, 4, 500)
    p = softmax(logits)
    scores = single_label_calibration(torch.tensor(logits, dtype=torch.float32), torch.tensor(labels))
    expected_ece = numpy_ece(p.max(axis=1), p.argmax(axis=1) == labels)
    expected_brier = ((p - np.eye(4)[labels]) ** 2).sum(axis=1).mean()
    assert scores["ece"] == pytest.approx(expected_ece, abs=1e-6)
    assert scores["brier"] == pytest.approx(expected_brier, abs=1e-6)


def test_multi_label_ece_and_brier_match_numpy_per_label_and_averaged():
    rng = np.random.default_rng(1)
    logits, labels = rng.normal(0, 2, (400, 3)), rng.integers(0, 2, (400, 3))
    names = ("a", "b", "c")
    scores = multi_label_calibration(torch.tensor(logits), torch.tensor(labels), names)
    p = 1 / (1 + np.exp(-logits))
    for k, name in enumerate(names):
        correct = (p[:, k] >= 0.5) == labels[:, k]
        assert scores[f"ece_{name}"] == pytest.approx(numpy_ece(np.maximum(p[:, k], 1 - p[:, k]), correct))
        assert scores[f"brier_{name}"] == pytest.approx(((p[:, k] - labels[:, k]) ** 2).mean())
    assert scores["ece"] == pytest.approx(np.mean([scores[f"ece_{n}"] for n in names]))
    assert scores["brier"] == pytest.approx(np.mean([scores[f"brier_{n}"] for n in names]))


@pytest.mark.parametrize("true_temperature", [0.5, 2.5])
def test_the_temperature_fit_recovers_a_known_temperature(true_temperature):
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(20_000, 5, generator=generator, dtype=torch.float64) * 2
    labels = torch.multinomial(z.softmax(dim=-1), 1, generator=generator).squeeze(-1)
    fitted = fit_temperature((z * true_temperature).float(), labels)
    assert fitted == pytest.approx(true_temperature, rel=0.05)
    assert fit_temperature((z * true_temperature).float(), labels) == fitted  # deterministic


def test_a_temperature_at_the_limit_of_its_range_is_named():
    """Logits whose top class is never the label: the NLL falls as T grows, so T stops at the upper limit
    (no confidence signal); every top class right: it falls as T shrinks, to the lower one."""
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(300, 3, generator=generator, dtype=torch.float64) * 3
    never_right = fit_temperature(z, z.argmin(dim=-1))
    always_right = fit_temperature(z, z.argmax(dim=-1))
    assert never_right == pytest.approx(TEMPERATURE_RANGE[1]) and temperature_bound(never_right) == "upper"
    assert always_right == pytest.approx(TEMPERATURE_RANGE[0]) and temperature_bound(always_right) == "lower"
    labels = torch.multinomial(z.softmax(dim=-1), 1, generator=generator).squeeze(-1)
    assert temperature_bound(fit_temperature(z * 2, labels)) is None


def test_logits_that_say_nothing_leave_the_model_as_it_is():
    """All-equal logits: every T gives the same NLL; T stays 1 instead of walking to a limit."""
    assert fit_temperature(torch.zeros(50, 3), torch.arange(50) % 3) == 1.0
    assert fit_temperature(torch.zeros(50, 2), torch.ones(50, 2), multi_label=True) == 1.0


def test_cross_fitting_never_scores_a_row_with_a_temperature_its_label_helped_fit():
    """Rows alternate between 2 folds; each fold's logits are divided by the T fit on the other: the
    labels of fold 0 move fold 1's temperature and figures, never fold 0's own."""
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(400, 3, generator=generator, dtype=torch.float64) * 3
    labels = torch.multinomial((z / 3).softmax(dim=-1), 1, generator=generator).squeeze(-1)
    scaled, (t0, t1) = cross_fitted_logits(z, labels)
    assert t0 == fit_temperature(z[1::2], labels[1::2]) and t1 == fit_temperature(z[0::2], labels[0::2])
    torch.testing.assert_close(scaled[0::2], z[0::2] / t0)
    relabelled = labels.clone()
    relabelled[0::2] = z[0::2].argmax(dim=-1)  # fold 0 now always right
    moved, (u0, u1) = cross_fitted_logits(z, relabelled)
    assert u0 == t0 and torch.equal(moved[0::2], scaled[0::2])
    assert u1 < t1 and not torch.equal(moved[1::2], scaled[1::2])


def test_baking_the_temperature_divides_the_logits(tiny_model_dir):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir).eval()
    ids = torch.randint(5, 1000, (4, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(input_ids=ids).logits
        scale_head(model, 1 / 2.5)
        after = model(input_ids=ids).logits
    torch.testing.assert_close(after, before / 2.5)


def test_baking_into_a_lora_model_carries_into_the_merged_model(tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification

    base = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir).eval()
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], modules_to_save=["classifier"])
    model = get_peft_model(base, lora).eval()
    ids = torch.randint(5, 1000, (4, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(input_ids=ids).logits
        scale_head(model, 1 / 3.0)
        merged = model.merge_and_unload()
        torch.testing.assert_close(merged(input_ids=ids).logits, before / 3.0)


def test_lower_is_better_for_calibration_errors():
    for metric in ("eval_ece", "eval_brier", "eval_matched_ece", "eval_ece_sports", "eval_loss"):
        assert greater_is_better_default(metric) is False, metric
    for metric in ("eval_accuracy", "eval_f1_ece", "eval_matched_accuracy"):
        assert greater_is_better_default(metric) is True, metric


class Flags:
    calibrate = "temperature"


def test_calibrate_refuses_regression():
    with pytest.raises(ConfigError) as refused:
        check_calibration(Flags, custom_task(("text",), None), {"validation": []})
    assert refused.value.flag == "--calibrate" and "drop --calibrate" in refused.value.fix


def test_multi_label_calibration_needs_the_threshold_at_which_no_label_changes():
    from dataclasses import replace

    multi_label = custom_task(("text",), ("a", "b"), multi_label=True)
    check_calibration(Flags, multi_label, {"validation": []})  # 0.5: sigmoid(z / T) >= 0.5 iff z >= 0
    with pytest.raises(ConfigError) as refused:
        check_calibration(Flags, replace(multi_label, threshold=0.3), {"validation": []})
    assert refused.value.flag == "--calibrate"
    assert refused.value.fix == "drop --calibrate, or use --multi_label_threshold 0.5"


@pytest.mark.parametrize("true_temperature", [0.5, 2.5])
def test_one_temperature_for_every_label_recovers_a_known_temperature(true_temperature):
    """Multi-label: the binary NLL of every label's sigmoid(logits / T), one T shared by the labels."""
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(20_000, 4, generator=generator, dtype=torch.float64) * 2
    labels = torch.bernoulli(z.sigmoid(), generator=generator)
    fitted = fit_temperature((z * true_temperature).float(), labels, multi_label=True)
    assert fitted == pytest.approx(true_temperature, rel=0.05)
    scaled = (z * true_temperature) / fitted
    names = ("a", "b", "c", "d")
    before = multi_label_calibration(z * true_temperature, labels, names)["ece"]
    assert multi_label_calibration(scaled, labels, names)["ece"] < before


def test_calibrate_refuses_a_run_without_validation_rows():
    with pytest.raises(ConfigError) as refused:
        check_calibration(Flags, custom_task(("text",), ("a", "b")), {"train": []})
    assert refused.value.flag == "--calibrate" and "--validation_file" in refused.value.fix


@pytest.mark.parametrize(
    "flags", [["--eval_strategy", "no"], ["--do_train", "false"]], ids=["no-evaluation", "no-training"]
)
def test_calibrate_refuses_runs_that_do_not_train_and_evaluate(flags):
    from finetune.config.parser import parse_config

    with pytest.raises(ConfigError) as refused:
        parse_config(["--calibrate", "temperature", *flags])
    assert refused.value.flag == "--calibrate" and "--calibrate" in refused.value.fix


def test_a_run_recorded_before_calibrate_existed_counts_as_uncalibrated():
    from finetune.config.identity import differences

    assert differences({"seed": 1}, {"seed": 1, "calibrate": "temperature"}) == ["calibrate"]
    assert differences({"seed": 1}, {"seed": 1, "calibrate": "none"}) == []

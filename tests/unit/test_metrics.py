"""The shipped GLUE metric module against the reference implementations GLUE's own scripts use."""

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from finetune.data.tasks import GLUE_TASKS
from finetune.training.evaluation import load_metric


@pytest.fixture(scope="module")
def accelerator():
    from accelerate import Accelerator

    return Accelerator(cpu=True)


@pytest.mark.parametrize("num_classes", [2, 3])
def test_classification_metrics_match_scikit_learn(accelerator, num_classes):
    rng = np.random.default_rng(num_classes)
    references = rng.integers(0, num_classes, 500)
    predictions = np.where(rng.random(500) < 0.6, references, rng.integers(0, num_classes, 500))
    task = GLUE_TASKS["mrpc" if num_classes == 2 else "mnli"]
    scores = load_metric(task, accelerator).compute(predictions=predictions, references=references)
    assert scores["accuracy"] == pytest.approx(accuracy_score(references, predictions))
    assert scores["matthews_correlation"] == pytest.approx(matthews_corrcoef(references, predictions))
    if num_classes == 2:
        assert scores["f1"] == pytest.approx(f1_score(references, predictions))
    else:
        assert "f1" not in scores


def test_regression_metrics_match_scipy_with_ties(accelerator):
    rng = np.random.default_rng(0)
    references = np.round(rng.uniform(0, 5, 400), 1)  # rounded: many ties, as in STS-B
    predictions = np.round(references + rng.normal(0, 1, 400), 1).astype(np.float32)
    scores = load_metric(GLUE_TASKS["stsb"], accelerator).compute(
        predictions=predictions, references=references
    )
    expected_x, expected_y = predictions, references.astype(np.float32)
    assert scores["pearson"] == pytest.approx(pearsonr(expected_x, expected_y)[0], abs=1e-6)
    assert scores["spearmanr"] == pytest.approx(spearmanr(expected_x, expected_y)[0], abs=1e-6)

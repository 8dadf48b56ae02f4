"""The GLUE metrics (finetune.metrics.glue_scores) against the reference implementations GLUE's own
scripts use. The shipped `evaluate` module's scores against these: tests/unit/test_train.py."""

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from finetune.metrics.glue_scores import glue_scores


@pytest.mark.parametrize("num_classes", [2, 3])
def test_classification_metrics_match_scikit_learn(num_classes):
    rng = np.random.default_rng(num_classes)
    references = rng.integers(0, num_classes, 500)
    predictions = np.where(rng.random(500) < 0.6, references, rng.integers(0, num_classes, 500))
    scores = glue_scores(predictions, references, regression=False)
    assert scores["accuracy"] == pytest.approx(accuracy_score(references, predictions))
    assert scores["matthews_correlation"] == pytest.approx(matthews_corrcoef(references, predictions))
    if num_classes == 2:
        assert scores["f1"] == pytest.approx(f1_score(references, predictions))
    else:
        assert "f1" not in scores


def test_regression_metrics_match_scipy_with_ties():
    rng = np.random.default_rng(0)
    references = np.round(rng.uniform(0, 5, 400), 1)  # rounded: many ties, as in STS-B
    predictions = np.round(references + rng.normal(0, 1, 400), 1).astype(np.float32)
    scores = glue_scores(predictions, references, regression=True)
    expected_x, expected_y = predictions, references.astype(np.float32)
    assert scores["pearson"] == pytest.approx(pearsonr(expected_x, expected_y)[0], abs=1e-6)
    assert scores["spearmanr"] == pytest.approx(spearmanr(expected_x, expected_y)[0], abs=1e-6)

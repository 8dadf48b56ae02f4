"""The GLUE metrics as an `evaluate` module that ships with finetune, so `evaluate.load` needs no Hub.

Config `classification`: accuracy, Matthews correlation (CoLA) and, for two classes, F1 of class 1
(MRPC, QQP). Config `regression`: Pearson and Spearman correlation (STS-B). numpy only.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Accuracy, F1, Matthews correlation (classification); Pearson, Spearman (regression)."
_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted class ids (classification) or scores (regression).
    references: true class ids or scores.
Returns:
    classification: accuracy, matthews_correlation, and f1 when there are two classes.
    regression: pearson, spearmanr.
"""


class Glue(evaluate.Metric):
    def _info(self):
        if self.config_name not in ("classification", "regression"):
            raise KeyError("config_name must be 'classification' or 'regression'")
        value = datasets.Value("int64" if self.config_name == "classification" else "float32")
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": value, "references": value}),
        )

    def _compute(self, predictions, references):
        predictions, references = np.asarray(predictions), np.asarray(references)
        if self.config_name == "regression":
            return {
                "pearson": _pearson(predictions, references),
                "spearmanr": _pearson(_ranks(predictions), _ranks(references)),
            }
        result = {
            "accuracy": float((predictions == references).mean()),
            "matthews_correlation": _matthews(predictions, references),
        }
        if set(np.unique(references)) <= {0, 1}:
            true_pos = float(((predictions == 1) & (references == 1)).sum())
            predicted, actual = float((predictions == 1).sum()), float((references == 1).sum())
            result["f1"] = 2 * true_pos / (predicted + actual) if predicted + actual else 0.0
        return result


def _pearson(x, y) -> float:
    x, y = x.astype(np.float64) - x.mean(), y.astype(np.float64) - y.mean()
    denominator = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denominator) if denominator else 0.0


def _ranks(x):
    """1-based ranks, ties sharing their average rank (as scipy.stats.rankdata)."""
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    starts = np.r_[True, sorted_x[1:] != sorted_x[:-1]]
    group = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    last = np.r_[first[1:], len(x)] - 1
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = (first[group] + last[group]) / 2 + 1
    return ranks


def _matthews(predictions, references) -> float:
    """Multiclass Matthews correlation (Gorodkin's R_K, as sklearn.metrics.matthews_corrcoef)."""
    classes = np.union1d(predictions, references)
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)
    np.add.at(confusion, (np.searchsorted(classes, references), np.searchsorted(classes, predictions)), 1)
    actual, predicted = confusion.sum(axis=1), confusion.sum(axis=0)
    n, correct = confusion.sum(), np.trace(confusion)
    denominator = np.sqrt((n * n - (predicted * predicted).sum()) * (n * n - (actual * actual).sum()))
    return float((correct * n - (actual * predicted).sum()) / denominator) if denominator else 0.0

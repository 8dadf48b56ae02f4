"""The GLUE paper's metrics in numpy: accuracy, Matthews correlation (CoLA) and, for two classes, F1 of
class 1 (MRPC, QQP); Pearson and Spearman correlation (STS-B).

Training computes them here directly. finetune/metrics/glue/ wraps the same functions as an `evaluate`
module, for `evaluate.load`; the run does not import `evaluate`, whose own imports (scipy.stats, for
its evaluators) cost every process about 0.45 s of CPU before its first step (docs/log.md).
"""

from __future__ import annotations

import numpy as np


def glue_scores(predictions, references, *, regression: bool) -> dict[str, float]:
    """Class ids (or scores, `regression`) against the true ones. Cast as `evaluate` passes a metric's
    inputs (stored as int64, or as float32 for regression, and read back as Python numbers), so the
    module and training agree to the bit."""

    def as_stored(values):
        if regression:
            return np.asarray(values, np.float32).astype(np.float64)
        return np.asarray(values, np.int64)

    predictions, references = as_stored(predictions), as_stored(references)
    if regression:
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

"""Metrics of custom classification tasks, numpy only: accuracy, macro F1, per-class precision,
recall, F1 and support, the confusion matrix; for multi-label data micro/macro F1 and exact match.

Per-class keys are `<precision|recall|f1|support>_<label name>`; every score is a plain float, so each
one can pick the best model (--metric_for_best_model eval_f1_<label>).
"""

from __future__ import annotations

import numpy as np

from finetune.data.tasks import PER_CLASS


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """Elementwise; 0 where the denominator is 0 (sklearn's zero_division=0)."""
    numerator, denominator = numerator.astype(np.float64), denominator.astype(np.float64)
    return np.divide(numerator, denominator, out=np.zeros_like(numerator), where=denominator > 0)


def single_label_scores(predictions, references, names: tuple[str, ...]) -> dict:
    """Accuracy, f1_macro (unweighted mean over every class of the task), the per-class scores and
    `confusion_matrix` (rows: true class, columns: predicted, in `names` order; sums to the row count)."""
    predictions, references = np.asarray(predictions), np.asarray(references)
    confusion = np.zeros((len(names), len(names)), dtype=np.int64)
    np.add.at(confusion, (references, predictions), 1)
    hits, predicted, actual = np.diag(confusion), confusion.sum(axis=0), confusion.sum(axis=1)
    precision, recall = _ratio(hits, predicted), _ratio(hits, actual)
    f1 = _ratio(2 * precision * recall, precision + recall)
    per_class = dict(zip(PER_CLASS, (precision, recall, f1, actual), strict=True))
    scores = {f"{kind}_{name}": float(v[i]) for i, name in enumerate(names) for kind, v in per_class.items()}
    # Last, so a class named "macro" cannot shadow the macro average.
    scores.update(accuracy=float(hits.sum() / max(len(references), 1)), f1_macro=float(f1.mean()))
    scores["confusion_matrix"] = confusion.tolist()
    return scores


def multi_label_scores(predicted, references) -> dict:
    """f1_micro (over every row-label decision), f1_macro (mean of each label's F1) and exact_match
    (rows whose whole label set is right), from 0/1 matrices of shape rows x labels."""
    predicted, references = np.asarray(predicted).astype(bool), np.asarray(references).astype(bool)
    hits = (predicted & references).sum(axis=0)
    wrong = (predicted & ~references).sum(axis=0) + (~predicted & references).sum(axis=0)
    return {
        "f1_micro": float(_ratio(2 * hits.sum(), 2 * hits.sum() + wrong.sum())),
        "f1_macro": float(_ratio(2 * hits, 2 * hits + wrong).mean()),
        "exact_match": float((predicted == references).all(axis=1).mean()) if len(predicted) else 0.0,
    }

"""The values an evaluation metric can take, from what it is (a fraction, a correlation, a loss): what
a seeds study's interval of its mean is cut to, so it never claims an accuracy above 1."""

from __future__ import annotations

import re

RANGES = {
    # fractions of rows, words, entities or labels; ECE is a mean gap between two of them
    "accuracy": (0.0, 1.0),
    "f1": (0.0, 1.0),
    "precision": (0.0, 1.0),
    "recall": (0.0, 1.0),
    "exact_match": (0.0, 1.0),
    "ece": (0.0, 1.0),
    "brier": (0.0, 2.0),  # multi-class: the squared distance of two probability vectors, at most 2
    "matthews_correlation": (-1.0, 1.0),
    "pearson": (-1.0, 1.0),
    "spearmanr": (-1.0, 1.0),
    "combined_score": (-1.0, 1.0),  # GLUE's mean of two of the above: a correlation's range holds both
    "loss": (0.0, None),
    "perplexity": (1.0, None),
}
_NAMES = re.compile(r"(?:^|_)(" + "|".join(sorted(RANGES, key=len, reverse=True)) + r")(?=_|$)")


def metric_range(key: str) -> tuple[float | None, float | None]:
    """(lowest, highest) for an eval_* key (eval_matched_accuracy, eval_f1_PER, eval_test_loss), read from
    its first metric word, so a label named after a metric (eval_f1_loss) stays an F1; (None, None) for a
    key of no metric known here."""
    found = _NAMES.search(key.removeprefix("eval_"))
    return RANGES[found.group(1)] if found else (None, None)

"""The GLUE metrics as an `evaluate` module that ships with finetune, so `evaluate.load` needs no Hub:
`evaluate.load("<finetune>/metrics/glue", "classification" or "regression")`.

Config `classification`: accuracy, Matthews correlation (CoLA) and, for two classes, F1 of class 1
(MRPC, QQP). Config `regression`: Pearson and Spearman correlation (STS-B). It returns
finetune.metrics.glue_scores.glue_scores, which training calls directly.
"""

import datasets
import evaluate

from finetune.metrics.glue_scores import glue_scores

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
        return glue_scores(predictions, references, regression=self.config_name == "regression")

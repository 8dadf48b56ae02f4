"""The shipped GLUE `evaluate` module loads offline and scores as training does. The entry point's runs:
tests/e2e/test_train.py."""

import numpy as np
import pytest

from finetune.metrics.glue_scores import glue_scores


@pytest.mark.parametrize("config", ["classification", "regression"])
def test_the_evaluate_module_loads_offline_and_scores_as_training_does(config):
    import evaluate
    import huggingface_hub.constants

    import finetune

    assert huggingface_hub.constants.HF_HUB_OFFLINE  # set by conftest before any HF import
    metric = evaluate.load(f"{finetune.__path__[0]}/metrics/glue", config)
    rng = np.random.default_rng(0)
    if config == "regression":
        references = np.round(rng.uniform(0, 5, 300), 1)
        predictions = (references + rng.normal(0, 1, 300)).astype(np.float32)
    else:
        references, predictions = rng.integers(0, 3, 300), rng.integers(0, 3, 300)
    module = metric.compute(predictions=predictions, references=references)
    assert module == glue_scores(predictions, references, regression=config == "regression")  # bit for bit

"""The GLUE metric loads offline. The entry point's runs: tests/e2e/test_train.py."""


def test_metric_loads_offline():
    import huggingface_hub.constants
    from accelerate import Accelerator

    from finetune.data.tasks import GLUE_TASKS
    from finetune.training.evaluation import load_metric

    assert huggingface_hub.constants.HF_HUB_OFFLINE  # set by conftest before any HF import
    metric = load_metric(GLUE_TASKS["mnli"], Accelerator(cpu=True))
    assert metric.compute(predictions=[0, 1, 2, 2], references=[0, 1, 1, 2])["accuracy"] == 0.75

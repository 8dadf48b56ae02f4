"""Sequence classification, the default family (`--task_type sequence_classification`): GLUE tasks and
custom files, single-label, multi-label and regression, one label per row (or document). Its loss,
evaluation and predictions (evaluation.py), --calibrate (calibration.py), its model and kernels
(model.py), its CUDA-graph step (graphed_step.py) and its card (card.py)."""

from __future__ import annotations

import functools

import torch

from finetune.data.batching import build_dataloaders
from finetune.data.splits import load_splits
from finetune.data.tasks import Task, eval_key
from finetune.data.tokenization import tokenize_splits
from finetune.errors import ConfigError
from finetune.families.family import Evaluator, MicroBatch, greater_is_better_default, weights_by_label
from finetune.families.sequence_classification.calibration import calibrate_model, check_calibration
from finetune.families.sequence_classification.card import classifier_parts
from finetune.families.sequence_classification.evaluation import evaluate_splits, forward_backward, predict
from finetune.families.sequence_classification.graphed_step import graph_inputs, graphed_steps
from finetune.families.sequence_classification.model import build_model
from finetune.output.card import CardParts
from finetune.speed.attention import varlen_position_offset
from finetune.speed.memory import fit_batch_size


class SequenceClassification:
    name = "sequence_classification"
    pipeline_tag = "text-classification"
    captures_cuda_graphs = True
    done_in_export = {"calibrate": "none"}  # its head divides by T already

    def load(self, config) -> tuple[Task, dict]:
        return load_splits(config)

    def choose_metric(self, config, task: Task, splits: dict) -> dict:
        return choose_metric(config, task, splits)

    def check(self, config, task: Task, splits: dict) -> None:
        check_calibration(config, task, splits)

    def build_model(self, args, task: Task, accelerator, loading: dict, bf16_native: bool, cuda_graphs: str):
        return build_model(args, task, accelerator, loading, bf16_native, cuda_graphs)

    def tokenize(self, task: Task, splits: dict, tokenizer, config, accelerator) -> dict:
        weigh_documents = config.window_loss_weighting == "document"
        return tokenize_splits(task, splits, tokenizer, config.max_length, accelerator, config.window_stride,
                               weigh_documents, default_stride=config.doc_stride is None)  # fmt: skip

    def dataloaders(self, tokenized: dict, tokenizer, config, world_size: int, on_gpu: bool, model) -> dict:
        offset = varlen_position_offset(model)
        return build_dataloaders(tokenized, tokenizer, config, world_size, on_gpu, position_offset=offset)

    def forward_backward(
        self, model, accelerator, task: Task, batch: dict, batch_divisor: int, graphs=None
    ) -> MicroBatch:
        """Units: the rows' loss weights summed (--window_loss_weighting document), else None (rows)."""
        labels, weight = batch.pop("labels"), batch.pop("weight", None)
        tokens = batch["attention_mask"].sum()
        if graphs is not None:  # --cuda_graphs: the same step, replayed
            summed = graphs.forward_backward(graph_inputs(batch, labels, weight))
        else:
            summed = forward_backward(model, accelerator, task, batch, labels, weight, batch_divisor)
        units = None if weight is None else weight.sum(dtype=torch.float64)
        return MicroBatch(summed, units, labels.shape[0], tokens)

    def evaluator(self, task: Task, accelerator) -> Evaluator:
        return functools.partial(_evaluate, accelerator=accelerator, task=task)

    def autocast_loaders(self, eval_loaders: dict) -> dict:
        return eval_loaders

    def predict(self, accelerator, model, loader, task: Task, num_rows: int) -> list[dict]:
        return predict(accelerator, model, loader, task, num_rows)

    def card_parts(self, config, task: Task, results: dict) -> CardParts:
        return classifier_parts(config, task, results)

    def subject(self, config) -> str:
        """The task's name (a custom file's: classification)."""
        return "classification" if config.task_name == "custom" else config.task_name

    def record_extras(self, task: Task) -> dict:
        return {"class_weights_by_label": weights_by_label(task)}

    def fit_batch_size(self, config, model, train, tokenizer, accelerator) -> tuple[dict, str]:
        return fit_batch_size(config, model, train, tokenizer, accelerator)

    def step_graphs(self, args, config, accelerator, model, task: Task):
        return graphed_steps(args, config, accelerator, model, task)

    def finish(self, run) -> dict:
        """--calibrate temperature: T fit and baked into the head; its eval_* keys are the calibrated
        export's (calibration.py). Without it: nothing."""
        return calibrate_model(run) if run.config.calibrate != "none" else {}


def _evaluate(model, eval_loaders: dict, should_stop=None, *, accelerator, task: Task) -> dict:
    return evaluate_splits(accelerator, model, eval_loaders, task, should_stop)


def choose_metric(config, task: Task, splits: dict) -> dict:
    """--metric_for_best_model (default: the task's first metric) and --greater_is_better, checked
    against what this run's evaluation produces; before the model loads."""
    splits_measured = [s for s in task.validation_splits if s in splits]
    metrics = (*task.metrics, *task.per_class_metrics, *task.calibration_metrics, "loss")
    measured = [eval_key(s, m) for s in splits_measured for m in metrics]
    measured += ["eval_loss"] if "eval_loss" not in measured else []  # over every split's rows
    metric = config.metric_for_best_model or (measured[0] if measured else None)
    greater_is_better = config.greater_is_better
    if greater_is_better is None and metric:
        greater_is_better = greater_is_better_default(metric)
    if config.evaluates_training and metric not in measured:
        raise ConfigError(f"--metric_for_best_model {metric}: this run measures {', '.join(measured)}")
    return {"metric_for_best_model": metric, "greater_is_better": greater_is_better}

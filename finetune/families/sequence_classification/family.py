"""Sequence classification, the default family (`--task_type sequence_classification`): GLUE tasks and
custom files, single-label, multi-label and regression, one label per row (or document)."""

from __future__ import annotations

import functools

import torch

from finetune.config.resolved import choose_metric
from finetune.data.batching import build_dataloaders
from finetune.data.splits import load_splits
from finetune.data.tasks import Task
from finetune.data.tokenization import tokenize_splits
from finetune.families.family import Evaluator, MicroBatch
from finetune.model.build import build_model
from finetune.speed.attention import varlen_position_offset
from finetune.training.calibrate import check_calibration
from finetune.training.evaluation import evaluate_splits, forward_backward, predict


class SequenceClassification:
    name = "sequence_classification"
    pipeline_tag = "text-classification"
    captures_cuda_graphs = True

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
        if graphs is not None:  # --cuda_graphs: the same step, replayed
            summed = graphs.forward_backward(batch, labels, weight)
        else:
            summed = forward_backward(model, accelerator, task, batch, labels, weight, batch_divisor)
        units = None if weight is None else weight.sum(dtype=torch.float64)
        return summed, units, labels.shape[0]

    def evaluator(self, task: Task, accelerator) -> Evaluator:
        return functools.partial(_evaluate, accelerator=accelerator, task=task)

    def autocast_loaders(self, eval_loaders: dict) -> dict:
        return eval_loaders

    def predict(self, accelerator, model, loader, task: Task, num_rows: int) -> list[dict]:
        return predict(accelerator, model, loader, task, num_rows)

    def card_parts(self, config, task: Task) -> None:
        """The card's classifier parts are its default."""


def _evaluate(model, eval_loaders: dict, should_stop=None, *, accelerator, task: Task) -> dict:
    return evaluate_splits(accelerator, model, eval_loaders, task, should_stop)

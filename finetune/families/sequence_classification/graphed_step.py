"""--cuda_graphs for sequence classification: its eager micro-batch (evaluation.py forward_backward) as
the step `speed.cuda_graphs.GraphedSteps` captures per shape."""

from __future__ import annotations

import functools

import torch

from finetune.data.tasks import Task
from finetune.families.family import class_weights_tensor
from finetune.families.sequence_classification.evaluation import forward_backward
from finetune.speed.cuda_graphs import GraphedSteps


def graphed_steps(args, config, accelerator, model, task: Task) -> GraphedSteps | None:
    """--cuda_graphs: the training micro-batches as CUDA graphs (None: eager); strict when asked for."""
    if config.cuda_graphs != "true":
        return None
    if task.class_weights is not None:  # now: in the warm-up, the copy would count as a wait
        # The parameters' device (cuda:0), which the logits carry: Accelerate's is plain "cuda".
        device = next(p for p in model.parameters() if p.requires_grad).device
        class_weights_tensor(task.class_weights, device)
    step = functools.partial(_step, model, accelerator, task, config.per_device_train_batch_size)
    return GraphedSteps(accelerator, model, step, strict=args.cuda_graphs == "true")


def graph_inputs(batch: dict, labels: torch.Tensor, weight: torch.Tensor | None) -> dict:
    """What a replay copies in: the model's inputs, then the labels and the rows' weights (if any)."""
    return {**batch, "labels": labels} | ({} if weight is None else {"weight": weight})


def _step(model, accelerator, task: Task, batch_divisor: int, inputs: dict) -> torch.Tensor:
    """The eager micro-batch, the loss divided by the full micro-batch (`batch_divisor` rows)."""
    labels, weight = inputs.pop("labels"), inputs.pop("weight", None)
    return forward_backward(model, accelerator, task, inputs, labels, weight, batch_divisor)

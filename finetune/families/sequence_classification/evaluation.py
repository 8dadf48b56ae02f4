"""Sequence classification's loss, metrics and predictions: every row counted exactly once, whatever the
number of processes."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from finetune.data.tasks import Task, eval_key
from finetune.data.windows import by_document
from finetune.families.family import class_weights_tensor
from finetune.metrics.calibration import multi_label_calibration, single_label_calibration
from finetune.metrics.classification import multi_label_scores, single_label_scores
from finetune.metrics.glue_scores import glue_scores
from finetune.training.evaluation import EvaluationAbandoned, progress, without_autocast


def loss_sum(
    logits: torch.Tensor, labels: torch.Tensor, task: Task, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """Summed over the batch, in fp32 whatever the autocast dtype: cross-entropy (each row weighted
    by its class's --class_weights, targets smoothed by --label_smoothing_factor), squared error, or
    for multi-label rows binary cross-entropy averaged over the labels (transformers'
    BCEWithLogitsLoss per row). `weight`: one per row (--window_loss_weighting document), multiplying
    each row's loss in the sum."""
    reduction = "sum" if weight is None else "none"
    if task.is_regression:
        loss = F.mse_loss(logits.squeeze(-1).float(), labels.float(), reduction=reduction)
    elif task.multi_label:
        bce = F.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction=reduction)
        loss = (bce if weight is None else bce.sum(dim=-1)) / logits.shape[-1]
    else:
        # Unnormalized (the sum of weight x loss, not divided by the weights): 'balanced' weights
        # average 1 over the training rows, so the loss keeps its scale.
        weights = task.class_weights
        classes = None if weights is None else class_weights_tensor(weights, logits.device)
        loss = F.cross_entropy(
            logits.float(), labels, weight=classes, reduction=reduction, label_smoothing=task.label_smoothing
        )
    return loss if weight is None else (loss * weight.to(loss.dtype)).sum()


def forward_backward(model, accelerator, task: Task, batch: dict, labels, weight, batch_divisor: int):
    """One micro-batch eagerly: its summed loss, returned, and its gradients accumulated, scaled as the
    mean over a full micro-batch (`batch_divisor` pairs); Accelerate divides by the accumulation steps
    and DDP averages over ranks, so a full window yields the mean over its pairs. The training loop's
    step, and what `--cuda_graphs` captures. Collective under DDP: backward all-reduces on the window's
    last micro-batch."""
    summed = loss_sum(model(**batch).logits, labels, task, weight)
    accelerator.backward(summed / batch_divisor)
    return summed


def evaluate_splits(accelerator, model, eval_loaders: dict, task: Task, should_stop=None) -> dict:
    """Collective: the task's metrics, the loss and the row count of every evaluation split, as
    `eval_<metric>`, `eval_loss` and `eval_<split>_samples` (`eval_matched_<metric>`,
    `eval_matched_loss` for MNLI's splits, and `eval_loss` over the rows of both).

    `should_stop` (collective too) is asked before every batch; when it says yes,
    `EvaluationAbandoned` is raised on every rank."""
    scores = {
        split: evaluate(accelerator, model, loader, task, should_stop)
        for split, loader in eval_loaders.items()
    }
    return split_results(scores, task)


def split_results(scores_by_split: dict, task: Task) -> dict:
    """`evaluate_splits`' keys from each split's `split_scores`."""
    results, loss_total, rows = {}, 0.0, 0
    for split, scores in scores_by_split.items():
        measured = task.metrics + task.per_class_metrics + task.calibration_metrics
        results.update({eval_key(split, m): scores[m] for m in measured})
        if "confusion_matrix" in scores:  # rows: true label, columns: predicted; not sent to trackers
            matrix = {"labels": list(task.label_names), "matrix": scores["confusion_matrix"]}
            results[eval_key(split, "confusion_matrix")] = matrix
        results[eval_key(split, "loss")] = scores["loss"]
        results[eval_key(split, "samples")] = scores["samples"]
        loss_total, rows = loss_total + scores["loss"] * scores["samples"], rows + scores["samples"]
    if scores_by_split:  # MNLI's splits have their own losses too; eval_loss is over every row
        results["eval_loss"] = loss_total / max(rows, 1)
    return results


def evaluate(accelerator, model, loader, task: Task, should_stop=None) -> dict:
    """Collective: metrics over the whole split, each row (document) counted exactly once across ranks."""
    references, logits = _gathered_logits(accelerator, model, loader, "labels", should_stop, task)
    return split_scores(logits, references, task)


def split_scores(logits: torch.Tensor, references: torch.Tensor, task: Task) -> dict:
    """One split's metrics, calibration scores, loss and row count, from its gathered fp32 logits."""
    scores = {**_scores(logits, references, task), **calibration_scores(logits, references, task)}
    # The training loss over the split's rows, from the fp32 logits: eval_loss.
    loss = float(loss_sum(logits, references, task)) / max(len(references), 1)
    return {**scores, "loss": loss, "samples": len(references)}


def _scores(logits: torch.Tensor, references: torch.Tensor, task: Task) -> dict:
    """GLUE tasks and regression: the GLUE paper's metrics; custom classification's and multi-label's
    own (finetune.metrics)."""
    if task.multi_label:
        return multi_label_scores((logits.sigmoid() >= task.threshold).numpy(), references.numpy())
    if task.name == "custom" and not task.is_regression:
        return single_label_scores(logits.argmax(dim=-1).numpy(), references.numpy(), task.label_names)
    predictions = logits.squeeze(-1) if task.is_regression else logits.argmax(dim=-1)
    return glue_scores(predictions.numpy(), references.numpy(), regression=task.is_regression)


def calibration_scores(logits: torch.Tensor, references: torch.Tensor, task: Task) -> dict:
    """Classification's ece and brier (finetune.metrics.calibration); nothing for regression."""
    if task.is_regression:
        return {}
    if task.multi_label:
        return multi_label_calibration(logits, references, task.label_names)
    return single_label_calibration(logits, references)


def predict(accelerator, model, loader, task: Task, num_rows: int) -> list[dict]:
    """Collective: one prediction per input row, in input order, gathered to every rank.

    Batches run length-sorted and sharded over ranks; each carries its row numbers, so the result
    is put back in file order whatever the sharding, and checked to hold every row once. Windows of
    long documents (--long_documents sliding_window) make one prediction per document, with `windows`.
    Made without autocast, as the exported weights and `pipeline` make them (`without_autocast`)."""
    with without_autocast(accelerator.unwrap_model(model, keep_torch_compile=False)):
        rows, logits, windows = _gathered(accelerator, model, loader, "row", None, task, "predict")
    order = rows.argsort()
    if not torch.equal(rows[order], torch.arange(num_rows)):
        raise RuntimeError(
            f"predictions cover {len(rows)} rows ({rows.unique().numel()} distinct) of {num_rows}"
        )
    predictions = prediction_lines(logits[order], task)
    if windows is not None:
        for prediction, count in zip(predictions, windows[order].tolist(), strict=True):
            prediction["windows"] = count
    return predictions


def prediction_lines(logits: torch.Tensor, task: Task) -> list[dict]:
    """predictions.jsonl's lines from the logits of rows 0, 1, ..."""
    if task.is_regression:
        return [{"row": i, "score": score} for i, score in enumerate(logits.squeeze(-1).tolist())]
    names = task.label_names
    if task.multi_label:  # independent sigmoids: every label at or over --multi_label_threshold
        probabilities = logits.sigmoid()
        return [
            {"row": i, "labels": [n for n, p in zip(names, row, strict=True) if p >= task.threshold],
             "probabilities": dict(zip(names, row, strict=True))}
            for i, row in enumerate(probabilities.tolist())
        ]  # fmt: skip
    labels = logits.argmax(dim=-1).tolist()
    return [
        {"row": i, "label": names[label], "probabilities": dict(zip(names, p, strict=True))}
        for i, (label, p) in enumerate(zip(labels, logits.softmax(dim=-1).tolist(), strict=True))
    ]


def _gathered_logits(
    accelerator, model, loader, key: str, should_stop=None, task: Task | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Collective: fp32 logits of every row with the batch's `key` column (labels, row numbers),
    gathered from all ranks; gather_for_metrics drops the rows Accelerate repeated to give every
    rank equal batches. Windows of long documents: one row per document (`_gathered`)."""
    keys, logits, _ = _gathered(accelerator, model, loader, key, should_stop, task)
    return keys, logits


def _gathered(
    accelerator, model, loader, key: str, should_stop=None, task: Task | None = None, desc: str = "eval"
):
    """Collective: `_gathered_logits`, and each row's number of windows (None without windows). Windows
    carry their document's number (`doc`), gathered with them: after the gather every rank groups the
    windows of each document, wherever they were scored, into one row (task.window_aggregation)."""
    # Under torch.compile the evaluation runs the model uncompiled: each evaluation batch shape would
    # otherwise compile (and record CUDA graphs under reduce-overhead) for a pass that takes about a
    # second eagerly (docs/benchmarks.md). Regional compilation compiles the layers in place: kept.
    model = getattr(model, "_orig_mod", model)
    model.eval()
    keys, outputs, docs = [], [], []
    with torch.no_grad(), progress(accelerator, loader, desc) as batches:
        for batch in batches:
            if should_stop is not None and should_stop():  # every rank, at the same batch
                model.train()
                raise EvaluationAbandoned
            key_values = batch.pop(key)
            doc = batch.pop("doc", None)
            logits = model(**batch).logits.float()
            if doc is not None:  # gathered together: the same windows dropped as repeats
                key_values, logits, doc = accelerator.gather_for_metrics((key_values, logits, doc))
                docs.append(doc)
            else:
                key_values, logits = accelerator.gather_for_metrics((key_values, logits))
            keys.append(key_values)  # kept on the device: no wait per batch
            outputs.append(logits)
    model.train()
    keys, logits = torch.cat(keys).cpu(), torch.cat(outputs).cpu()
    if not docs:
        return keys, logits, None
    aggregation = task.window_aggregation if task is not None else "mean"
    _, keys, logits, windows = by_document(torch.cat(docs).cpu(), keys, logits, aggregation)
    return keys, logits, windows

"""The seam between the one training loop and what it learns: a task family.

A family owns reading and checking its rows, the model's Auto class and head, encoding and collating,
the micro-batch's summed loss and its unit count, evaluation, predictions, what it does to the model
before the export (`finish`) and what the export says. The loop, checkpoints, the step plan, signals,
identity, seeds, sweeps and Slurm never ask which family runs: they see `forward_backward`'s
`MicroBatch` and `evaluator`'s metrics; run.py calls every hook below on whichever family runs, and the
shared layers name none (tests/unit/test_layers.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from finetune.errors import ConfigError


@dataclass
class MicroBatch:
    """What one micro-batch's `forward_backward` hands the loop, all on the device but `rows`."""

    loss_sum: torch.Tensor
    """The micro-batch's summed loss, detached."""
    units: torch.Tensor | None
    """The float64 count (or weight) the loss is a sum over: target tokens, or the rows' loss weights;
    None when each row weighs 1. The update's loss is every micro-batch's and rank's summed loss over
    every one's units (rows when None), so it does not depend on how the window is cut."""
    rows: int
    """The rows (documents, pairs) it trained on: the log's samples."""
    tokens: torch.Tensor
    """Its real (unpadded) tokens: the log's tokens per second and MFU."""
    metrics: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    """Named (sum, count) pairs: the loop adds them up over the log window and every rank, in the loss's
    all-reduce, and logs sum / count under the name. Every micro-batch of a family names the same ones."""


Evaluator = Callable[..., dict]
"""Collective: (model, eval_loaders, should_stop=None) -> eval_* metrics, each row counted once."""


class TaskFamily(Protocol):
    name: str
    """--task_type's value."""
    pipeline_tag: str
    """What transformers' `pipeline` loads the exported model as (and the card's pipeline_tag)."""
    captures_cuda_graphs: bool
    """Whether --cuda_graphs can capture its micro-batches (auto resolves to false where not)."""
    done_in_export: dict
    """Flags whose work the exported model carries (`finish`'s), as a run that only predicts with that
    model sets them so it is not done twice (run.py predict_with_finished)."""

    def load(self, config) -> tuple[object, dict]:
        """The task (what the run learns, its metrics and splits) and its raw splits."""

    def choose_metric(self, config, task, splits: dict) -> dict:
        """--metric_for_best_model and --greater_is_better, checked against what evaluation measures."""

    def check(self, config, task, splits: dict) -> None:
        """Refusals of flags this family cannot honour, before the model loads."""

    def build_model(self, args, task, accelerator, loading: dict, bf16_native: bool, cuda_graphs: str):
        """(model, tokenizer, the backbone record, the speed choices for `Resolved`)."""

    def tokenize(self, task, splits: dict, tokenizer, config, accelerator) -> dict:
        """Collective: each split as model inputs with a `length` column."""

    def dataloaders(self, tokenized: dict, tokenizer, config, world_size: int, on_gpu: bool, model) -> dict:
        """One loader per split: train in its seeded order, the others for evaluation and prediction."""

    def forward_backward(
        self, model, accelerator, task, batch: dict, batch_divisor: int, graphs=None
    ) -> MicroBatch:
        """Collective under DDP: one micro-batch's loss and gradients (the loss divided by `batch_divisor`,
        the loop rescales each window by its units)."""

    def evaluator(self, task, accelerator) -> Evaluator:
        """Collective (it may load a metric module): the evaluation of a model on the eval loaders."""

    def autocast_loaders(self, eval_loaders: dict) -> dict:
        """The eval loaders `evaluator` runs under autocast (--mixed_precision over fp32 weights), evaluated
        once more without it for the exported model's figures (training/best.py as_exported)."""

    def predict(self, accelerator, model, loader, task, num_rows: int) -> list[dict]:
        """Collective: predictions.jsonl's lines, in input order, made without autocast (as the export)."""

    def card_parts(self, config, task, results: dict):
        """The model card's pipeline, description, use and the family's own lines and sections
        (`output.card.CardParts`), for the run's `results`."""

    def subject(self, config) -> str:
        """What the run learns, in a few words: the title of a --seeds study's card."""

    def record_extras(self, task) -> dict:
        """train_config.json's keys of this family beside the backbone (a classifier's class weights)."""

    def fit_batch_size(self, config, model, train, tokenizer, accelerator) -> tuple[dict, str]:
        """Collective: --auto_find_batch_size's batch and accumulation for `Resolved`, and the line that
        says so (speed/memory.py); only the families that declare the flag theirs (flags.py OWNED) are
        asked."""

    def step_graphs(self, args, config, accelerator, model, task):
        """--cuda_graphs (config's, resolved; args' as given): the training micro-batches' replayer that
        `forward_backward` takes as `graphs` (`speed.cuda_graphs.GraphedSteps`), or None: eager."""

    def finish(self, run) -> dict:
        """Collective: after training and the best model's evaluation, before the export: what the
        family does to the model it exports (classification's --calibrate), as results.json's keys. Its
        eval_* keys replace training's; {}: the export is evaluated as it computes (training/best.py
        as_exported)."""


OPTIONAL = {
    "after_prepare": "(accelerator, model): collective; once the model is prepared (DPO places its frozen "
    "reference with prepare_model(..., evaluation_mode=True) and precomputes its log-probs)",
    "flops_per_token": "(model, use_peft) -> int: the training FLOPs of one real token, for MFU "
    "(default: model/flops.py's 6N; DPO adds its reference's forward)",
    "normalises_windows": "bool: forward_backward takes window=(epoch, index) and divides each term of "
    "its loss by its window total itself; the loop does not rescale the window (DPO with --rpo_alpha)",
}
"""Members a family may have besides the protocol's, which run.py and the loop look up by name."""


def metric_choice(config, splits: dict, measured: list[str], default: str) -> dict:
    """--metric_for_best_model (`default` when unset) and --greater_is_better, checked against what
    evaluation `measured`, for the families without classification's own rule (its `choose_metric`)."""
    if config.evaluates_training and "validation" not in splits:
        raise ConfigError(
            f"--eval_strategy {config.eval_strategy} evaluates on validation rows and this run has none; "
            "give --validation_file or --validation_split_percentage, or --eval_strategy no",
            flag="--eval_strategy",
        )
    metric = config.metric_for_best_model or default
    if config.evaluates_training and metric not in measured:
        raise ConfigError(
            f"--metric_for_best_model {metric}: this run measures {', '.join(dict.fromkeys(measured))}"
        )
    greater = config.greater_is_better
    return {
        "metric_for_best_model": metric,
        "greater_is_better": greater_is_better_default(metric) if greater is None else greater,
    }


def greater_is_better_default(metric: str) -> bool:
    """Hugging Face Trainer's rule, a loss is better smaller and any other metric larger, with the
    calibration errors (eval_ece, eval_brier, eval_matched_ece, eval_ece_<label>...) and perplexity
    smaller too."""
    name = metric.removeprefix("eval_").removeprefix("matched_").removeprefix("mismatched_")
    return not (metric.endswith("loss") or name.split("_")[0] in ("ece", "brier", "perplexity"))


@functools.cache  # never evicted: a CUDA graph reads the tensor's memory without holding it
def class_weights_tensor(weights: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """--class_weights on the device, copied once per process, not per step: a copy from host memory
    waits for the device, and cannot be captured in a CUDA graph (--cuda_graphs)."""
    return torch.tensor(weights, dtype=torch.float32, device=device)


def weights_by_label(task) -> dict[str, float] | None:
    """--class_weights as the run applied them: each weight beside its label (the task line's order)."""
    if not task.class_weights:
        return None
    return {name: round(weight, 6) for name, weight in zip(task.label_names, task.class_weights, strict=True)}


def class_weights_line(task) -> tuple[str, ...]:
    """The model card's line of --class_weights, each beside its label (none without them)."""
    weights = weights_by_label(task)
    return (f"- class weights: {weights}",) if weights else ()

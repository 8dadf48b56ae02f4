"""--calibrate temperature: after training, one temperature T fit on the first validation split's logits
(finetune.metrics.calibration.fit_temperature) and baked into the model's classification layer (its
weight and bias divided by T), so the exported model, predictions.jsonl and any later evaluation give
softmax(logits / T) with no code on the user's side. The argmax, so every prediction and accuracy,
stays the same. Multi-label: one T shared by every label, fit on the binary NLL of sigmoid(logits / T);
at --multi_label_threshold 0.5 (sigmoid(z / T) >= 0.5 exactly when z >= 0) every predicted label stays.

results.json keys (`<split>`: as eval_key names it, e.g. eval_matched_... for MNLI):
- every `eval_*` key: the exported (calibrated) model's, as evaluating its folder gives them. On the
  split T was fit on (`calibration_fit_split`) they are in-sample: T has seen those rows' labels;
- `eval_<split>_ece_before_calibration`, `..._brier_before_calibration`, `..._loss_before_calibration`
  (multi-label: each label's ECE and Brier too) for every split, and `eval_loss_before_calibration`:
  the model before dividing by T (without autocast, as every figure here);
- `eval_<split>_ece_after_calibration_held_out`, `..._brier_...`, `..._loss_...` (fit split only): held
  out by 2-fold cross-fitting (rows alternate between the folds in evaluation order, each fold scored
  with the T fit on the other): what the calibrated model's figures are on rows T did not see;
- `calibration_temperature`: T, fit on every row of the fit split (above 1: the model was overconfident);
  `calibration_temperature_per_fold`: the two folds' T;
- `calibration_temperature_at_bound`: whether T stopped at a limit of TEMPERATURE_RANGE (then a note
  says what it means: at 100 the logits carry no confidence signal).
`best_evaluation`, `last_evaluation` and `best_metric` stay training's evaluations, before calibration.
"""

from __future__ import annotations

import re

import torch
from accelerate.utils import broadcast
from torch import nn

from finetune.data.tasks import Task, eval_key
from finetune.errors import ConfigError
from finetune.families.sequence_classification.evaluation import _gathered_logits, split_results, split_scores
from finetune.families.sequence_classification.plots import plot_reliability_diagram
from finetune.metrics.calibration import (
    TEMPERATURE_RANGE,
    confidence_and_correct,
    cross_fitted_logits,
    fit_temperature,
    reliability_bins,
    temperature_bound,
)
from finetune.model.lora import classification_head, is_peft_model
from finetune.output.plots import RELIABILITY_FILE
from finetune.output.writing import writing
from finetune.training.evaluation import without_autocast


def check_calibration(config, task: Task, splits: dict) -> None:
    """--calibrate with a task or data it cannot calibrate: refused before the model loads."""
    if config.calibrate == "none":
        return
    flag = f"--calibrate {config.calibrate}"
    if task.is_regression:
        raise ConfigError(
            f"{flag} rescales a classifier's softmax; this task is regression (one score per row): "
            "drop --calibrate",
            flag="--calibrate",
        )
    if task.multi_label and task.threshold != 0.5:
        raise ConfigError(
            f"{flag} keeps every predicted label only at --multi_label_threshold 0.5 (sigmoid(z / T) >= 0.5 "
            f"exactly when z >= 0); this run has {task.threshold}: drop --calibrate, or use 0.5",
            flag="--calibrate",
            fix="drop --calibrate, or use --multi_label_threshold 0.5",
        )
    if task.validation_splits[0] not in splits:
        raise ConfigError(
            f"{flag} fits on validation rows and this run has none; give --validation_file or "
            "--validation_split_percentage, or drop --calibrate",
            flag="--calibrate",
        )


def calibrate_model(run) -> dict:
    """Collective: fit T on the first validation split's logits, gathered from every rank, and divide the
    model's classification layer by it on every rank (rank 0's T, broadcast: the replicas stay
    identical). Rank 0 draws reliability_diagram.png and says when T is at a limit. Returns
    results.json's eval_* keys of the calibrated model and the calibration keys."""
    accelerator, task = run.accelerator, run.task
    split, multi = task.validation_splits[0], task.multi_label
    # Every split's logits before T, one pass each. Documents' logits under --long_documents
    # sliding_window (their windows' mean or max): dividing every window by T divides that aggregate by
    # T, so logits / T are the exported model's (to float32 rounding), and T fitted here is the one the
    # predictions see.
    # Without autocast: T is fit on, and every figure is, the logits of the exported weights' dtype.
    unwrapped = accelerator.unwrap_model(run.model, keep_torch_compile=False)
    with without_autocast(unwrapped):
        gathered = {
            name: _gathered_logits(accelerator, run.model, loader, "labels", None, task)
            for name, loader in run.eval_loaders.items()
        }
    references, logits = gathered[split]
    fitted = fit_temperature(logits, references, multi)  # every rank: the same gathered logits, the same T
    fitted = torch.tensor([fitted], dtype=torch.float64, device=accelerator.device)
    temperature = float(broadcast(fitted, from_process=0)[0])  # rank 0's, so the replicas stay identical
    scale_head(unwrapped, 1 / temperature)

    def results_with(scale) -> dict:
        return split_results({n: split_scores(scale(z), y, task) for n, (y, z) in gathered.items()}, task)

    # The headline eval_* keys: the exported model's; before T, only the keys T changes (argmax-based
    # metrics stay) under names of their own.
    before, after = results_with(lambda z: z), results_with(lambda z: z / temperature)
    changed = [eval_key(n, m) for n in gathered for m in (*task.calibration_metrics, "loss")] + ["eval_loss"]
    bound = temperature_bound(temperature)
    results = {
        **after,
        **{f"{k}_before_calibration": before[k] for k in dict.fromkeys(changed)},
        "calibration_fit_split": split,
        "calibration_temperature": temperature,
        "calibration_temperature_at_bound": bound is not None,
    }
    ece = eval_key(split, "ece")
    curves = {
        f"before (ECE {before[ece]:.4f})": _bins(logits, references, multi),
        f"after, in-sample (ECE {after[ece]:.4f})": _bins(logits / temperature, references, multi),
    }
    results.update(_held_out(logits, references, task, split, curves))
    if accelerator.is_main_process:
        output_dir = run.config.output_dir
        if run.config.save_plots:
            with writing(RELIABILITY_FILE, output_dir):
                title = f"{eval_key(split, 'reliability')}, T = {temperature:.4f}"
                what = "each label's max(p, 1 - p)" if multi else "max softmax probability"
                plot_reliability_diagram(curves, title, f"{output_dir}/{RELIABILITY_FILE}", what)
        print(f"--calibrate temperature: T = {temperature:.4f} baked into the model's classification layer")
        if bound is not None:
            print(bound_note(temperature, bound, multi))
    return results


CROSS_FIT_FOLDS = 2


def _held_out(logits, references, task: Task, split: str, curves: dict) -> dict:
    """The fit split's figures after calibration, held out by cross-fitting; its curve added to `curves`.
    Fewer rows than folds: None (nothing to hold out)."""
    names = (*task.calibration_metrics, "loss")
    keys = [eval_key(split, f"{m}_after_calibration_held_out") for m in names]
    if len(logits) < CROSS_FIT_FOLDS:
        return {**dict.fromkeys(keys), "calibration_temperature_per_fold": None}
    scaled, per_fold = cross_fitted_logits(logits, references, task.multi_label, CROSS_FIT_FOLDS)
    scores = split_scores(scaled, references, task)
    curves[f"after, held out (ECE {scores['ece']:.4f})"] = _bins(scaled, references, task.multi_label)
    return {
        **{k: scores[m] for k, m in zip(keys, names, strict=True)},
        "calibration_temperature_per_fold": per_fold,
    }


def _bins(logits, references, multi: bool) -> dict:
    # Multi-label: every label's binary prediction, pooled in one diagram.
    confidence, correct = (t.flatten() for t in confidence_and_correct(logits, references, multi))
    return reliability_bins(confidence, correct)


def bound_note(temperature: float, bound: str, multi_label: bool) -> str:
    """The run's one line when T stopped at a limit of TEMPERATURE_RANGE: what that says of the model."""
    low, high = TEMPERATURE_RANGE
    said = (
        f"--calibrate temperature: T = {temperature:g} is the {bound} limit of the search ({low:g}-{high:g})"
    )
    if bound == "upper":
        even = "0.5 for every label" if multi_label else "1 / the number of labels"
        return (
            f"{said}: the validation NLL still falls as T grows, so the model's logits carry no confidence "
            f"signal (a near-chance model); its calibrated probabilities are all close to {even}"
        )
    return (
        f"{said}: nearly every validation prediction is right, with small logit margins; the fit wants "
        "probabilities of 1, so T is the limit, not an estimate"
    )


_WRAPPERS = r"(^|\.)(original_module|modules_to_save\.[^.]+|base_layer|lora_B\.[^.]+)(?=\.|$)"


def scale_head(model: nn.Module, factor: float) -> None:
    """Multiplies the classification layer's output by `factor` through its weight and bias, in place.
    The layer: the last Linear with num_labels outputs in the head `classification_head` finds; under
    LoRA, every copy of it (peft's trained copy and the original; a LoRA-adapted head's base layer and
    lora_B), so the merged export carries the factor."""
    base = model.get_base_model() if is_peft_model(model) else model
    head = base.get_submodule(classification_head(base))
    num_labels = base.config.num_labels
    copies: dict[str, list[nn.Linear]] = {}
    for name, module in head.named_modules():
        if isinstance(module, nn.Linear) and module.out_features == num_labels and "lora_A" not in name:
            copies.setdefault(re.sub(_WRAPPERS, "", name), []).append(module)
    with torch.no_grad():
        for layer in copies[list(copies)[-1]]:  # heads end with their output layer
            layer.weight.mul_(factor)
            if layer.bias is not None:
                layer.bias.mul_(factor)

"""--calibrate temperature: after training, one temperature T fit on the first validation split's logits
(finetune.metrics.calibration.fit_temperature) and baked into the model's classification layer (its
weight and bias divided by T), so the exported model, predictions.jsonl and any later evaluation give
softmax(logits / T) with no code on the user's side. The argmax, so every prediction and accuracy,
stays the same. Multi-label: one T shared by every label, fit on the binary NLL of sigmoid(logits / T);
at --multi_label_threshold 0.5 (sigmoid(z / T) >= 0.5 exactly when z >= 0) every predicted label stays.

results.json keys (`<split>`: as eval_key names it, e.g. eval_matched_... for MNLI):
- `calibration_temperature`: T (logits are divided by it; above 1: the model was overconfident);
- `eval_ece_before_calibration`, `eval_ece_after_calibration`: ECE of the exported model on the
  validation rows T was fit on, before and after dividing by T;
- `eval_brier_before_calibration`, `eval_brier_after_calibration`, `eval_nll_before_calibration`,
  `eval_nll_after_calibration`: the same for the Brier score and the mean negative log-likelihood;
- multi-label: also each label's, `eval_ece_<label>_before_calibration`, ..._after_calibration (and brier);
  `eval_ece_*` and `eval_brier_*` are the means over labels, `eval_nll_*` the binary NLL over every label.
The other eval_* keys are the training evaluations', measured before calibration.
"""

from __future__ import annotations

import re

import torch
from accelerate.utils import broadcast
from torch import nn

from finetune.data.tasks import Task, eval_key
from finetune.errors import ConfigError
from finetune.metrics.calibration import (
    confidence_and_correct,
    fit_temperature,
    multi_label_calibration,
    negative_log_likelihood,
    reliability_bins,
    single_label_calibration,
)
from finetune.model.lora import classification_head, is_peft_model
from finetune.output.plots import RELIABILITY_FILE, plot_reliability_diagram
from finetune.output.writing import writing
from finetune.training.evaluation import _gathered_logits


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
    identical). Rank 0 draws reliability_diagram.png. Returns results.json's calibration keys."""
    accelerator, task = run.accelerator, run.task
    split = task.validation_splits[0]
    # Documents' logits under --long_documents sliding_window (their windows' mean or max): dividing every
    # window by T divides that aggregate by T, so T fitted here is the one the predictions see.
    loader = run.eval_loaders[split]
    references, logits = _gathered_logits(accelerator, run.model, loader, "labels", None, task)
    multi = task.multi_label
    fitted = fit_temperature(logits, references, multi)  # every rank: the same gathered logits, the same T
    fitted = torch.tensor([fitted], dtype=torch.float64, device=accelerator.device)
    temperature = float(broadcast(fitted, from_process=0)[0])  # rank 0's, so the replicas stay identical
    scale_head(accelerator.unwrap_model(run.model, keep_torch_compile=False), 1 / temperature)
    results = {"calibration_temperature": temperature}
    curves = {}
    for stage, scaled in (("before", logits), ("after", logits / temperature)):
        if multi:
            scores = multi_label_calibration(scaled, references, task.label_names)
        else:
            scores = single_label_calibration(scaled, references)
        # Multi-label: every label's binary prediction, pooled in one diagram.
        confidence, correct = (t.flatten() for t in confidence_and_correct(scaled, references, multi))
        scores["nll"] = negative_log_likelihood(scaled, references, 1.0, multi)
        results.update({eval_key(split, f"{m}_{stage}_calibration"): v for m, v in scores.items()})
        curves[f"{stage} (ECE {scores['ece']:.4f})"] = reliability_bins(confidence, correct)
    if accelerator.is_main_process:
        output_dir = run.config.output_dir
        with writing(RELIABILITY_FILE, output_dir):
            title = f"{eval_key(split, 'reliability')}, T = {temperature:.4f}"
            what = "each label's max(p, 1 - p)" if multi else "max softmax probability"
            plot_reliability_diagram(curves, title, f"{output_dir}/{RELIABILITY_FILE}", what)
        print(f"--calibrate temperature: T = {temperature:.4f} baked into the model's classification layer")
    return results


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

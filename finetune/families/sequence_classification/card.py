"""Sequence classification's parts of the model card: its pipeline and labels, how long documents were
read, what --calibrate did to the exported model, and the per-class scores with the confusion matrix."""

from __future__ import annotations

from finetune.config.train_config import TrainConfig
from finetune.data.tasks import PER_CLASS, Task, eval_key
from finetune.families.family import class_weights_line
from finetune.metrics.calibration import temperature_bound
from finetune.output.card import CardParts
from finetune.output.plots import CONFUSION_FILE, _confusion


def classifier_parts(config: TrainConfig, task: Task, results: dict) -> CardParts:
    labels = "regression (one score)" if task.is_regression else ", ".join(task.label_names)
    labels += " (multi-label: any number per text, independent sigmoids)" if task.multi_label else ""
    use = (
        "from transformers import pipeline",
        "",
        f'classify = pipeline("text-classification", model="{config.hub_model_id or config.output_dir}"'
        + (", top_k=None)  # every label's sigmoid score" if task.multi_label else ")"),
    )
    return CardParts(
        pipeline_tag="text-classification",
        tag=task.name if task.name == "custom" else "glue-" + task.name,
        trained_on=f"**{task.name}** ({' + '.join(task.text_columns)} → {labels})",
        use=use,
        exported=tuple(_calibration_lines(results)),
        training=(*class_weights_line(task), _long_documents_line(config)),
        sections=tuple(_per_class_section(task, results)),
    )


def _per_class_section(task: Task, results: dict) -> list[str]:
    """Markdown: per-class precision, recall, F1 and support, and the confusion matrix."""
    found = _confusion(results)
    if found is None or not task.per_class_metrics:
        return []
    key, confusion = found
    prefix = key.removesuffix("confusion_matrix")  # eval_ (or eval_<split>_)
    names = confusion["labels"]

    def row(name: str, values) -> str:
        return f"| {name} | " + " | ".join(values) + " |"

    return [
        "## Per class",
        "",
        "| label | precision | recall | F1 | support |",
        "| --- | --- | --- | --- | --- |",
        *(
            row(name, (f"{results.get(f'{prefix}{kind}_{name}', 0):.4g}" for kind in PER_CLASS))
            for name in names
        ),
        "",
        f"Confusion matrix (`{key}`; rows: true label, columns: predicted):",
        "",
        "| true \\ predicted | " + " | ".join(names) + " |",
        "| --- |" + " --- |" * len(names),
        *(row(name, map(str, counts)) for name, counts in zip(names, confusion["matrix"], strict=True)),
        "",
        f"![confusion matrix]({CONFUSION_FILE})",
        "",
    ]


def _long_documents_line(config: TrainConfig) -> str:
    """How texts longer than --max_length were read (the model scores one window of them)."""
    if config.window_stride is None:
        return f"- long documents: truncated to --max_length {config.max_length} tokens"
    weighs = {"document": "1 / its document's windows", "window": "1, so a document by its windows"}
    return (
        f"- long documents: sliding windows of {config.max_length} tokens overlapping by "
        f"{config.window_stride} (each window one training example with its document's label, weighing "
        f"{weighs[config.window_loss_weighting]} in the loss: --window_loss_weighting "
        f"{config.window_loss_weighting}); a document's score: the "
        f"{config.window_aggregation} of its windows' logits (`finetune.long_documents.score_document`; "
        "a `pipeline` scores one window)"
    )


def _calibration_lines(results: dict) -> list[str]:
    """--calibrate temperature: what T does to the exported model, and its figures (none without it)."""
    temperature = results.get("calibration_temperature")
    if temperature is None:
        return []
    said = (
        f"- calibrated: its classification layer divides the logits by the temperature T = "
        f"{temperature:.4f}, fit on the validation rows (least NLL); predictions are unchanged"
    )
    return [said, *_calibration_figures(results)]


def _calibration_figures(results: dict) -> list[str]:
    """ECE of the fit split before T, in-sample after it (the exported model on the rows T was fit on:
    results.json's headline), and held out; a T at its search limit said plainly."""
    split = results["calibration_fit_split"]
    ece = eval_key(split, "ece")
    held_out = results.get(eval_key(split, "ece_after_calibration_held_out"))
    figures = (
        f"- ECE on {split}: {results[f'{ece}_before_calibration']:.4f} before, {results[ece]:.4f} after "
        f"(`{ece}`, in-sample: the rows T was fit on)"
    )
    if held_out is not None:
        figures += f", {held_out:.4f} held out (2-fold cross-fitting: each half scored with the other's T)"
    if not results.get("calibration_temperature_at_bound"):
        return [figures]
    if temperature_bound(results["calibration_temperature"]) == "upper":
        why = "the logits carry no confidence signal (a near-chance model): every probability is near uniform"
    else:
        why = "nearly every validation prediction is right, with small margins"
    return [figures, f"- T is the limit of its search range, not an estimate: {why}"]

"""What a finished run leaves for people: a model card, training curves, the Hub upload."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from pathlib import Path

import torch

from finetune.config import TrainConfig, as_flag_value, default_of
from finetune.tasks import PER_CLASS, Task

CURVES_FILE = "training_curves.png"
CURVES_SIZE_PX = (1200, 400)
CONFUSION_FILE = "confusion_matrix.png"
HUB_IGNORED = ["checkpoint-*", ".checkpoint-*", "best_model/*", "wandb/*", "*.partial/*"]


def hardware(accelerator) -> str:
    if accelerator.device.type == "cuda":
        name = torch.cuda.get_device_name(accelerator.device)
    else:
        name = _cpu_name() or platform.processor() or "CPU"
        name = f"{name}, {os.cpu_count()} cores"
    return f"{accelerator.num_processes} × {accelerator.device.type} ({name})"


def _cpu_name() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def changed_flags(config: TrainConfig) -> dict:
    """The flags the user set to other values than the defaults (on the command line or in the YAML
    file): a command line that reproduces the run on another machine, which resolves the auto settings
    (padding_free, dropout_kernel, ...) for itself. A config built in Python rather than by parse_config
    has no such record: then every field that differs from its default (as __post_init__ left it)."""
    given = getattr(config, "user_flags", None)
    if given is not None:
        return dict(given)
    return {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if getattr(config, f.name) != default_of(f) and f.name != "config"
    }


def is_model_card(path: Path) -> bool:
    """The card `write_model_card` writes (its front matter), not a README of the user's."""
    head = path.read_text(errors="replace")[:400]
    return head.startswith("---\nlibrary_name: transformers\n") and "tags: [finetune," in head


def write_model_card(
    path: Path,
    config: TrainConfig,
    task: Task,
    results: dict,
    data_rows: dict,
    machine: str,
    wall_s: float,
    given_flags: dict,
) -> None:
    """A Hugging Face model card (README.md): base model, data, flags, results, hardware, time."""
    is_local_base = Path(config.model_name_or_path).exists()
    metadata = ["library_name: transformers", "pipeline_tag: text-classification"]
    if not is_local_base:
        metadata.append(f"base_model: {config.model_name_or_path}")
    metadata.append(f"tags: [finetune, {task.name if task.name == 'custom' else 'glue-' + task.name}]")
    from_hub = not config.uses_local_files and not Path(config.dataset_name).exists()
    if from_hub:
        metadata.append(f"datasets: [{config.dataset_name}]")
    subset = f" ({config.dataset_config_name})" if config.dataset_config_name else ""
    data = (
        {"train": config.train_file, "validation": config.validation_file or _held_out(config)}
        if config.uses_local_files
        else {"Hub" if from_hub else "local": f"{config.dataset_name}{subset}"}
    )
    flags = " ".join(f"--{k} {as_flag_value(v)}" for k, v in given_flags.items())
    labels = "regression (one score)" if task.is_regression else ", ".join(task.label_names)
    labels += " (multi-label: any number per text, independent sigmoids)" if task.multi_label else ""
    scores = [(k, results[k]) for k in task.metric_keys(per_class=False) if k in results]
    lines = [
        "---",
        *metadata,
        "---",
        "",
        f"# {Path(config.output_dir).name}",
        "",
        f"`{config.model_name_or_path}` fine-tuned on **{task.name}** "
        f"({' + '.join(task.text_columns)} → {labels}) with finetune.",
        "",
        "## Results",
        "",
        "| metric | value |",
        "| --- | --- |",
        *(f"| {k} | {v:.4f} |" for k, v in scores),
        "",
        "## Training",
        "",
        *(f"- {name} data: `{source}`" for name, source in data.items() if source),
        f"- rows: {', '.join(f'{name} {n:,}' for name, n in data_rows.items())}",
        f"- steps: {results.get('global_step')} optimizer steps, {results.get('epoch')} epochs"
        + (" (stopped early)" if results.get("stopped_early") else ""),
        *_exported_model_line(config, results),
        f"- hardware: {machine}, mixed precision {results.get('mixed_precision')}",
        f"- time: {results.get('train_runtime_s', 0):.1f} s training over the whole run "
        f"({results.get('train_samples_per_second', 0):.1f} samples/s); this process ran {wall_s:.1f} s",
        "",
        "The flags given:",
        "",
        "```",
        f"accelerate launch finetune/glue.py {flags}",
        "```",
        "",
        "## Use",
        "",
        "```python",
        "from transformers import pipeline",
        "",
        f'classify = pipeline("text-classification", model="{config.hub_model_id or config.output_dir}"'
        + (", top_k=None)  # every label's sigmoid score" if task.multi_label else ")"),
        "```",
        "",
        f"![loss, learning rate and evaluation metrics]({CURVES_FILE})",
        "",
        *_per_class_section(task, results),
    ]
    path.write_text("\n".join(lines))


def _held_out(config: TrainConfig) -> str | None:
    if not config.carves_validation:
        return None
    return f"{config.validation_split_percentage}% of {config.train_file} (seed {config.seed}, stratified)"


def _confusion(results: dict) -> tuple[str, dict] | None:
    """The first evaluation split's confusion matrix in results (custom single-label tasks)."""
    key = next((k for k in results if k.endswith("confusion_matrix")), None)
    return None if key is None else (key, results[key])


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


def _pyplot():
    """matplotlib's pyplot on the Agg backend: servers have no display. Imported when a chart is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_confusion_matrix(results: dict, png: Path) -> None:
    """The evaluation's confusion matrix as a heat map with counts; nothing when results has none."""
    found = _confusion(results)
    if found is None:
        return
    plt = _pyplot()

    key, confusion = found
    names, matrix = confusion["labels"], confusion["matrix"]
    size_in = min(4 + 0.5 * len(names), 16)
    figure, axis = plt.subplots(figsize=(size_in, size_in), dpi=100)
    axis.imshow(matrix, cmap="Blues")
    axis.set(
        xticks=range(len(names)), yticks=range(len(names)), xticklabels=names, yticklabels=names,
        xlabel="predicted", ylabel="true", title=key,
    )  # fmt: skip
    axis.tick_params(axis="x", labelrotation=45)
    peak = max(max(row) for row in matrix) or 1
    for i, row in enumerate(matrix):
        for j, count in enumerate(row):
            color = "white" if count > peak / 2 else "black"
            axis.text(j, i, str(count), ha="center", va="center", color=color)
    figure.tight_layout()
    figure.savefig(png, dpi=100)
    plt.close(figure)


def _exported_model_line(config: TrainConfig, results: dict) -> list[str]:
    """Which step the model in this folder is from, and why."""
    step = results.get("exported_model_step")
    if step is None:
        return []
    why = (
        f"the best evaluation by {config.metric_for_best_model}"
        if config.load_best_model_at_end and step == results.get("best_step")
        else "the last step"
    )
    return [f"- this model: the weights of step {step}, {why}"]


def plot_training_curves(metrics_jsonl: Path, png: Path, metric_keys: list[str]) -> None:
    """Loss and learning rate per logged step, with eval_loss; every evaluation metric per evaluation."""
    plt = _pyplot()

    records = [json.loads(line) for line in metrics_jsonl.read_text().splitlines() if line.strip()]
    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if any(k in r for k in metric_keys)]
    width, height = CURVES_SIZE_PX
    figure, (loss_axis, lr_axis, eval_axis) = plt.subplots(1, 3, figsize=(width / 100, height / 100), dpi=100)
    loss_axis.plot([r["step"] for r in steps], [r["loss"] for r in steps], marker=".", label="loss")
    evaluated = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
    if evaluated:  # on the training loss's scale: the gap between the two is what overfitting looks like
        loss_axis.plot(*zip(*evaluated, strict=True), marker="o", label="eval_loss")
        loss_axis.legend(fontsize="small")
    loss_axis.set(title="loss", xlabel="optimizer step")
    lr_axis.plot([r["step"] for r in steps], [r["learning_rate"] for r in steps], color="tab:orange")
    lr_axis.set(title="learning rate", xlabel="optimizer step")
    lr_axis.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    names = [k for k in metric_keys if any(k in r for r in evals)]
    for name in names:
        points = [(r["step"], r[name]) for r in evals if name in r]
        eval_axis.plot(*zip(*points, strict=True), marker="o", label=name)
    eval_axis.set(title="evaluation", xlabel="optimizer step")
    if names:
        eval_axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(png, dpi=100)  # no bbox_inches: the PNG is exactly CURVES_SIZE_PX
    plt.close(figure)


def push_to_hub(output_dir: str, repo_id: str | None) -> str:
    """Uploads the model, tokenizer, card, curves and results (no checkpoints); returns the URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    repo = api.create_repo(repo_id or Path(output_dir).name, exist_ok=True).repo_id
    api.upload_folder(repo_id=repo, folder_path=output_dir, ignore_patterns=HUB_IGNORED)
    return f"https://huggingface.co/{repo}"

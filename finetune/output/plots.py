"""The plots a run leaves: training curves and the confusion matrix (a family's plots of its own draw
with `_pyplot`)."""

from __future__ import annotations

import json
from pathlib import Path

CURVES_FILE = "training_curves.png"


CURVES_SIZE_PX = (1200, 400)


CONFUSION_FILE = "confusion_matrix.png"


RELIABILITY_FILE = "reliability_diagram.png"
"""Sequence classification's (families/sequence_classification/plots.py), named here with the other
files a run leaves, which a rerun over the folder removes (output/prerun.py)."""


def _confusion(results: dict) -> tuple[str, dict] | None:
    """The first evaluation split's confusion matrix in results (where evaluation made one)."""
    key = next((k for k in results if k.endswith("confusion_matrix")), None)
    return None if key is None else (key, results[key])


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
    else:  # trained without validation rows (or --eval_strategy no): an empty frame would look broken
        eval_axis.text(0.5, 0.5, "not evaluated", ha="center", va="center", transform=eval_axis.transAxes)
        eval_axis.set(xticks=[], yticks=[])
    # Fixed margins for CURVES_SIZE_PX, not tight_layout: measuring every label to place them took more
    # than a third of the plot's time, paid by every run.
    figure.subplots_adjust(left=0.065, right=0.985, bottom=0.13, top=0.9, wspace=0.3)
    figure.savefig(png, dpi=100)  # no bbox_inches: the PNG is exactly CURVES_SIZE_PX
    plt.close(figure)


def plot_seed_curves(folders: dict[str, Path], metric: str | None, png: Path) -> None:
    """--seeds: every seed's evaluations of `metric` (--metric_for_best_model) per optimizer step, one
    line per seed, from each seed folder's metrics.jsonl; nothing evaluated: no PNG."""
    curves = {}
    for seed, folder in folders.items():
        records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line]
        points = [(r["step"], r[metric]) for r in records if metric in r]
        if points:
            curves[seed] = points
    if not curves:
        return
    plt = _pyplot()
    width, height = CURVES_SIZE_PX
    figure, axis = plt.subplots(figsize=(width / 200, height / 100), dpi=100)
    for seed, points in curves.items():
        axis.plot(*zip(*points, strict=True), marker="o", label=f"seed {seed}")
    axis.set(title=f"{metric} by seed", xlabel="optimizer step", ylabel=metric)
    axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(png, dpi=100)
    plt.close(figure)

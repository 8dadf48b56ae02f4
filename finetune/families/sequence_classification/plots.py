"""--calibrate's reliability diagram."""

from __future__ import annotations

from finetune.output.plots import _pyplot


def plot_reliability_diagram(
    curves: dict[str, dict], title: str, png, confidence: str = "max softmax probability"
) -> None:
    """Accuracy against mean confidence per confidence bin, one line per entry of `curves` (name: the
    `finetune.metrics.calibration.reliability_bins` of it; empty bins left out), with the diagonal a
    calibrated model follows and each bin's share of the rows. `confidence`: what it is, on the x axis."""
    plt = _pyplot()
    figure, (axis, rows_axis) = plt.subplots(1, 2, figsize=(10, 4.5), dpi=100)
    axis.plot([0, 1], [0, 1], color="gray", linestyle="--", label="calibrated")
    for name, bins in curves.items():
        filled = bins["rows"] > 0
        axis.plot(bins["confidence"][filled], bins["accuracy"][filled], marker="o", label=name)
        share = bins["rows"][filled] / bins["rows"].sum()
        rows_axis.plot(bins["confidence"][filled], share, marker="o", label=name)
    axis.set(title=title, xlabel=f"confidence ({confidence})", ylabel="accuracy")
    axis.set(xlim=(0, 1), ylim=(0, 1))
    axis.legend(fontsize="small")
    rows_axis.set(title="rows per bin", xlabel="confidence", ylabel="share of rows", xlim=(0, 1))
    figure.tight_layout()
    figure.savefig(png, dpi=100)
    plt.close(figure)

"""`--seeds 42,43,44`: one configuration trained once per seed, each an ordinary run in
`<output_dir>/seed-<s>/`, then one answer over them: `summary.json` (each evaluation metric's mean, sample
standard deviation, min, max and 95% confidence interval, the per-seed values, and which folder holds the
best and the median model), a study card (`README.md`) and every seed's evaluation curve in one PNG.

A seed's run is exactly the standalone run with `--seed s` (only its folder differs, and the folder is
not part of a run's identity). With `--resume_from_checkpoint auto` a relaunch reads the finished seeds'
results back, resumes a broken one from its newest checkpoint and starts the missing ones.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

from finetune.config.train_config import TrainConfig
from finetune.distributed.accelerator import fresh_accelerate_state, leave_process_group
from finetune.distributed.launch_env import launcher_rank
from finetune.errors import ConfigError
from finetune.families import family_for
from finetune.metrics.ranges import metric_range
from finetune.output.card import base_model_name
from finetune.output.plots import plot_seed_curves
from finetune.output.writing import writing
from finetune.run import run_config

SUMMARY_FILE = "summary.json"
CURVES_FILE = "seed_curves.png"
STUDY_CARD_MARK = "<!-- finetune seeds summary -->"  # tells the study card from a user's README.md

# Student's t at 97.5% (two-sided 95%) for 1-30 degrees of freedom; beyond, a series in 1/df.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042)  # fmt: skip


def run_seeds(config: TrainConfig, build=None) -> dict:
    """Collective: the run `config` describes once per seed of --seeds, in the order given; then rank 0
    writes the summary, the study card and the curves. Returns the summary."""
    output_dir = Path(config.output_dir)
    refuse_single_run_folder(output_dir, config.overwrite_output_dir)
    results = {}
    try:
        for seed in config.seed_list:
            try:
                results[seed] = run_config(seed_config(config, seed), build, keep_process_group=True)
            except ConfigError as refused:
                raise relaunch_refusal(config, seed, refused) from refused
            fresh_accelerate_state()  # every rank, between the same two runs
    finally:
        leave_process_group()
    summary = summarize(results, config)
    if launcher_rank() == 0:
        with writing(SUMMARY_FILE, output_dir):
            (output_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
        with writing("the study card (README.md)", output_dir):
            (output_dir / "README.md").write_text(study_card(summary, config))
        if config.save_plots:
            with writing(CURVES_FILE, output_dir):
                folders = {seed: output_dir / folder for seed, folder in summary["folders"].items()}
                plot_seed_curves(folders, summary["metric_for_best_model"], output_dir / CURVES_FILE)
        print(summary_line(summary))
        curves = f", {CURVES_FILE}" if config.save_plots else ""
        print(f"{SUMMARY_FILE}, README.md{curves}: {output_dir.resolve()}")
    return summary


def seed_config(config: TrainConfig, seed: int) -> TrainConfig:
    """The standalone run with --seed `seed`, in its own folder (not part of a run's identity)."""
    output_dir = Path(config.output_dir)
    return dataclasses.replace(
        config,
        seed=seed,
        seeds=None,
        output_dir=str(output_dir / f"seed-{seed}"),
        run_name=f"{config.run_name or output_dir.name}-seed-{seed}",
    )


def relaunch_refusal(config: TrainConfig, seed: int, refused: ConfigError) -> ConfigError:
    """A seed's folder refused as an earlier run's, whose fix is --overwrite_output_dir (a relaunch of the
    study without --resume_from_checkpoint): that fix would retrain the finished seeds too, so the
    study's own way on comes first. Any other refusal: as it is."""
    if config.resume_from_checkpoint or config.overwrite_output_dir or refused.flag != "--output_dir":
        return refused
    if "--overwrite_output_dir" not in (refused.fix or ""):
        return refused
    folder = Path(config.output_dir) / f"seed-{seed}"
    return ConfigError(
        f"--seeds: {folder} holds a run of an earlier launch; relaunch with --resume_from_checkpoint auto "
        "to keep the seeds it finished and finish the others (--overwrite_output_dir would retrain every "
        "seed)",
        flag="--resume_from_checkpoint",
    )


def refuse_single_run_folder(output_dir: Path, overwrite: bool = False) -> None:
    """The seeds' folder holds seed-<s>/ folders and the summary: a single run's outputs there (its
    results.json, model card) would be mixed with them, and a summary.json or seed_curves.png that a
    seeds study of finetune's did not write would be replaced; such a folder is refused before anything
    runs (the files of yours: unless --overwrite_output_dir)."""
    card = output_dir / "README.md"
    ours = card.is_file() and STUDY_CARD_MARK in card.read_text(errors="replace")
    if (output_dir / "results.json").exists() or (card.exists() and not ours):
        what = (
            "a single run (results.json)"
            if (output_dir / "results.json").exists()
            else "a README.md of yours"
        )
        raise ConfigError(
            f"--output_dir {output_dir} holds {what}; choose another folder for --seeds (it writes "
            "seed-<s>/ folders and a summary)",
            flag="--output_dir",
        )
    summary_ours = _is_summary(output_dir / SUMMARY_FILE)
    # The curves are drawn after the summary: beside no summary of ours, they are not ours either.
    others = [n for n in (SUMMARY_FILE, CURVES_FILE) if (output_dir / n).exists() and not summary_ours]
    if others and not overwrite:
        raise ConfigError(
            f"--output_dir {output_dir} holds {' and '.join(others)}, not a seeds study's of finetune's, "
            "which --seeds would replace; choose another folder, or pass --overwrite_output_dir to replace "
            "them",
            flag="--output_dir",
        )


def _is_summary(path: Path) -> bool:
    """A summary.json `run_seeds` wrote (its keys), not a file of the user's."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and {"seeds", "folders", "metrics"} <= set(summary)


def summarize(results: dict[int, dict], config: TrainConfig) -> dict:
    """Every evaluation metric over the seeds: n, mean, sample std, min, max, a 95% Student-t interval
    (cut to the metric's range) and the per-seed values; the seeds whose folders hold the best and the
    median model by --metric_for_best_model (the median of an even count: the lower middle one). A
    count every seed measured alike (a label's support: the same validation rows) is no figure of the
    seeds': it goes to `fixed_counts`, once."""
    seeds = list(results)
    names = [k for k, v in results[seeds[0]].items() if _is_metric(k, v)]
    measured = {name: {s: results[s][name] for s in seeds if name in results[s]} for name in names}
    first = results[seeds[0]]  # every seed's run resolved the same metric and direction
    key = first.get("metric_for_best_model")
    fixed = {
        name: v[seeds[0]] for name, v in measured.items() if name != key and _is_fixed_count(v, len(seeds))
    }
    metrics = {
        name: describe(values, metric_range(name)) for name, values in measured.items() if name not in fixed
    }
    summary = {
        "seeds": seeds,
        "folders": {str(s): f"seed-{s}" for s in seeds},
        "metric_for_best_model": key,
        "greater_is_better": None,
        "metrics": metrics,
        "fixed_counts": fixed,
        "best": None,
        "median": None,
    }
    if key in metrics:
        greater = first["greater_is_better"]
        ranked = sorted(seeds, key=lambda s: results[s][key], reverse=greater)  # best first
        median = sorted(seeds, key=lambda s: results[s][key])[(len(seeds) - 1) // 2]
        summary["greater_is_better"] = greater
        summary["best"] = {"seed": ranked[0], "folder": f"seed-{ranked[0]}", "value": results[ranked[0]][key]}
        summary["median"] = {"seed": median, "folder": f"seed-{median}", "value": results[median][key]}
    return summary


def _is_metric(key: str, value) -> bool:
    counts = key.endswith(("_samples", "_runtime_s", "_per_second"))
    return (
        key.startswith("eval_")
        and not counts
        and isinstance(value, int | float)
        and not isinstance(value, bool)
    )


def _is_fixed_count(values: dict[int, float], n_seeds: int) -> bool:
    """Whole numbers (ints: counts, not scores), the same for every seed."""
    numbers = list(values.values())
    return len(numbers) == n_seeds and all(type(v) is int for v in numbers) and len(set(numbers)) == 1


def describe(values: dict[int, float], bounds: tuple[float | None, float | None] = (None, None)) -> dict:
    """n, mean, sample std (n - 1; None for one seed), min, max, the 95% confidence interval of the
    mean (Student's t; None for one seed) and the values by seed. `bounds`: the metric's range
    (metrics/ranges.py), which the interval is cut to: t's symmetric interval ignores that an accuracy
    stops at 1, and past the bound it holds no value the metric can take."""
    numbers = list(values.values())
    n, mean = len(numbers), statistics.fmean(numbers)
    std = statistics.stdev(numbers) if n > 1 else None
    half = t_975(n - 1) * std / math.sqrt(n) if n > 1 else None
    ci95 = None
    if half is not None:
        low, high = bounds
        ci95 = [mean - half if low is None else max(low, mean - half),
                mean + half if high is None else min(high, mean + half)]  # fmt: skip
    return {
        "n": n,
        "mean": mean,
        "std": std,
        "min": min(numbers),
        "max": max(numbers),
        "ci95": ci95,
        "values": {str(seed): v for seed, v in values.items()},
    }


def t_975(df: int) -> float:
    """Student's t quantile at 0.975 for `df` degrees of freedom (a table to 30, then the Cornish-Fisher
    series in 1/df, within 1e-3 of the exact value)."""
    if df <= len(T_975):
        return T_975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def summary_line(summary: dict) -> str:
    key = summary["metric_for_best_model"]
    if key not in summary["metrics"]:
        return f"{len(summary['seeds'])} seeds trained; nothing was evaluated"
    m = summary["metrics"][key]
    spread = ""
    if m["std"] is not None:
        spread = f" ± {m['std']:.4f} (sample std; 95% CI {m['ci95'][0]:.4f}-{m['ci95'][1]:.4f})"
    return (
        f"{key} over {m['n']} seeds: {m['mean']:.4f}{spread}; best {summary['best']['folder']}, "
        f"median {summary['median']['folder']}"
    )


def study_subject(config: TrainConfig) -> str:
    """What the seeds learnt, for the card's title: the family's `subject` (a classification task's
    name), and the training data's file or dataset."""
    what = family_for(config.task_type).subject(config)
    data = config.train_file or config.dataset_name
    if data and Path(data).exists():
        data = Path(data).name  # not this disk's layout
    return f"{what} ({data})" if data else what


def study_card(summary: dict, config: TrainConfig) -> str:
    """README.md of the seeds' folder: what was trained, each metric as mean ± std with its interval and
    per-seed values, and where the best and the median model are."""
    seeds = summary["seeds"]
    header = "| metric | mean ± std | 95% CI | min | max | " + " | ".join(f"seed {s}" for s in seeds) + " |"
    rows = [header, "|" + " --- |" * (5 + len(seeds))]
    for name, m in summary["metrics"].items():
        spread = f" ± {m['std']:.4f}" if m["std"] is not None else ""
        ci = f"{m['ci95'][0]:.4f}-{m['ci95'][1]:.4f}" if m["ci95"] else "-"
        per_seed = " | ".join(f"{m['values'].get(str(s), float('nan')):.4f}" for s in seeds)
        rows.append(
            f"| {name} | {m['mean']:.4f}{spread} | {ci} | {m['min']:.4f} | {m['max']:.4f} | {per_seed} |"
        )
    where = (
        f"The best model by {summary['metric_for_best_model']} is in `{summary['best']['folder']}/`, the "
        f"median one in `{summary['median']['folder']}/`; each folder is a complete run with its own "
        "model card."
        if summary["best"]
        else "Nothing was evaluated, so no seed is best."
    )
    fixed = summary.get("fixed_counts") or {}
    base, _ = base_model_name(config.model_name_or_path, config.gguf_file)
    return "\n".join([
        STUDY_CARD_MARK,
        f"# {base.rstrip(',')} on {study_subject(config)}: {len(seeds)} seeds",
        "",
        f"The same configuration trained with seeds {', '.join(map(str, seeds))}. Report the mean and its "
        "spread: between seeds the spread is often as large as the effect of a change.",
        "",
        *rows,
        "",
        "95% CI: the mean's interval by Student's t over the seeds, cut to the values the metric can take "
        "(an accuracy stops at 1).",
        *([f"The same for every seed (counts of the validation rows, not figures of the seeds): "
           f"{', '.join(f'{k} {v}' for k, v in fixed.items())}."] if fixed else []),
        "",
        where,
        (f"Per-seed evaluation curves: `{CURVES_FILE}`; " if config.save_plots else "")
        + f"every figure: `{SUMMARY_FILE}`.",
        "",
    ])  # fmt: skip

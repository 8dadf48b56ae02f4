"""What a sweep leaves in its output folder, written by a worker's rank 0 from the study's storage (so it
lists every worker's trials): sweep.json, two charts, and the best trial's model at the root; sweep.json
also carries the rerun of the best trial's params (`--rerun_best_with_seeds`, in best_seeds/), read back
from that folder each time the file is rewritten."""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from pathlib import Path

import optuna
from optuna.trial import TrialState

from finetune.output.card import is_model_card
from finetune.output.prerun import MODEL_FILES
from finetune.studies.seeds import SUMMARY_FILE

REPORT_FILE = "sweep.json"
HISTORY_PLOT = "sweep_history.png"
PARAMS_PLOT = "sweep_params.png"
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
RERUN_DIR = "best_seeds"
RERUN_RECORD = "rerun.json"
"""In best_seeds/: the trial whose params it reruns (its number and params), written when it starts."""


def trial_folder(root: Path, number: int) -> Path:
    return Path(root) / f"trial-{number}"


def describe_trials(study: optuna.Study, root: Path) -> list[dict]:
    described = []
    for trial in study.get_trials(deepcopy=False):
        ended = trial.datetime_complete
        seconds = (ended - trial.datetime_start).total_seconds() if ended and trial.datetime_start else None
        entry = {
            "number": trial.number,
            "params": trial.params,
            "value": trial.value,
            "state": trial.state.name,
            "seconds": seconds,
            "folder": str(trial_folder(root, trial.number)),
        }
        entry.update({k: v for k, v in trial.user_attrs.items() if k in ("reason", "pruned_at_step")})
        described.append(entry)
    return described


def best_of(study: optuna.Study, root: Path) -> dict | None:
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    best = study.best_trial
    return {"number": best.number, "params": best.params, "value": best.value,
            "folder": str(trial_folder(root, best.number))}  # fmt: skip


def write_report(study: optuna.Study, root: Path, summary: dict, charts: bool = True) -> dict:
    """sweep.json, rewritten whole (a temporary file, then os.replace: readers never see half of it);
    `charts` (--save_plots): its two charts drawn again too."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    best = best_of(study, root)
    report = {
        **summary,
        "trials": describe_trials(study, root),
        "best_trial": best,
        "param_importances": _importances(study) if len(complete) >= 2 else None,
        "param_importances_method": IMPORTANCE_METHOD,
    }
    rerun = rerun_block(root)
    if rerun is not None and best is not None and rerun["trial"] == best["number"]:  # only the current best's
        report["rerun_best_with_seeds"] = rerun
    _replace_text(Path(root) / REPORT_FILE, json.dumps(report, indent=2))
    if charts:
        draw_charts(study, Path(root))
    return report


def export_best(study: optuna.Study, root: Path) -> int | None:
    """The best trial's exported model (weights, config, tokenizer, model card and the charts the card
    shows) copied to the root, each file replaced atomically; the trial's number, or None without a
    complete trial."""
    best = best_of(study, root)
    if best is None:
        return None
    source = Path(best["folder"])
    names = [p.name for p in source.glob("model*.safetensors")] + [*MODEL_FILES, "README.md"]
    card = Path(root) / "README.md"
    if card.exists() and not (card.is_file() and is_model_card(card)):  # the user's, as a run keeps it
        print(f"{card} is not a model card of finetune's: kept as it is, the best trial's card not copied")
        names.remove("README.md")
    elif (source / "README.md").is_file():  # its links are relative: the charts go beside it
        names += _images_linked(source / "README.md")
    for name in names:
        if (source / name).is_file():
            temporary = Path(root) / f".{name}.copying"
            shutil.copy2(source / name, temporary)
            os.replace(temporary, Path(root) / name)
    return best["number"]


def _images_linked(card: Path) -> list[str]:
    """The files a card's Markdown images (`![...](name)`) name in its own folder."""
    linked = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", card.read_text(errors="replace"))
    return [name for name in dict.fromkeys(linked) if "/" not in name and (card.parent / name).is_file()]


def rerun_block(root: Path) -> dict | None:
    """sweep.json's `rerun_best_with_seeds`: the finished rerun in best_seeds/ (its trial, params, seeds
    and the metric's figures over them); None before it has finished."""
    folder = Path(root) / RERUN_DIR
    try:
        rerun = json.loads((folder / RERUN_RECORD).read_text())
        summary = json.loads((folder / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return None
    key = summary["metric_for_best_model"]
    return {"folder": RERUN_DIR, "trial": rerun["trial"], "params": rerun["params"],
            "seeds": summary["seeds"], key: summary["metrics"].get(key)}  # fmt: skip


def draw_charts(study: optuna.Study, root: Path) -> None:
    """The optimisation history and each parameter against the value. A chart that fails to draw is one
    printed line: it never fails the sweep."""
    from finetune.output.plots import _pyplot

    plt = _pyplot()
    # rc_context: optuna's plots switch matplotlib's style, which would restyle the next trial's curves.
    with warnings.catch_warnings(), plt.rc_context():
        warnings.simplefilter("ignore")  # optuna's matplotlib plots are marked experimental
        for name, draw in ((HISTORY_PLOT, _history), (PARAMS_PLOT, _slice)):
            try:
                axes = draw(study)
                figure = axes.flat[0].figure if hasattr(axes, "flat") else axes.figure
                figure.savefig(root / name, dpi=100, bbox_inches="tight")
            except Exception as error:  # noqa: BLE001 - a chart is never worth a failed sweep
                print(f"{root / name}: not drawn ({type(error).__name__}: {error})")
            finally:
                plt.close("all")


def _history(study):
    from optuna.visualization.matplotlib import plot_optimization_history

    return plot_optimization_history(study)


def _slice(study):
    from optuna.visualization.matplotlib import plot_slice

    return plot_slice(study)


IMPORTANCE_METHOD = "PED-ANOVA"
"""Optuna's PedAnovaImportanceEvaluator, named: Optuna 5's default, where Optuna 4 defaulted to fANOVA
(a random forest over the trials); named here so every Optuna this toolkit takes computes the same."""


def _importances(study: optuna.Study) -> dict | None:
    evaluator = optuna.importance.PedAnovaImportanceEvaluator()
    try:
        return dict(optuna.importance.get_param_importances(study, evaluator=evaluator))
    except Exception:  # noqa: BLE001 - one parameter, identical values: nothing to rank, no failure
        return None


def _replace_text(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)

"""`--rerun_best_with_seeds N`: the sweep's honest number. The best trial's value was picked as the best
of many noisy runs, so it overstates what its parameters give; rerunning them with N fresh seeds (the
base --seed + 1 ... + N, never the seed the trial was picked with) in `<output_dir>/best_seeds/` gives
their mean ± std (`best_seeds/summary.json`, as `--seeds` writes it).

One worker reruns: the first to find the study finished takes the folder's claim (a dead worker's claim
is taken over, and its seed runs resume); a folder with a summary is done.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

import optuna

from finetune.config.train_config import TrainConfig
from finetune.distributed.ranks import launcher_rank
from finetune.studies import claims
from finetune.studies.report import FINISHED, REPORT_FILE, best_of
from finetune.studies.seeds import SUMMARY_FILE, run_seeds

RERUN_DIR = "best_seeds"


def take_rerun(study: optuna.Study, n_trials: int, root: Path, n_seeds: int) -> dict | None:
    """Rank 0: the best trial's params when this worker is the one to rerun them (the study holds its
    n_trials finished trials, no summary yet, the claim won); else None."""
    if n_seeds <= 0 or sum(t.state in FINISHED for t in study.get_trials(deepcopy=False)) < n_trials:
        return None
    best, folder = best_of(study, root), root / RERUN_DIR
    if best is None:
        return None
    if (folder / SUMMARY_FILE).exists():
        done = json.loads((folder / SUMMARY_FILE).read_text()).get("seeds", [])
        if len(done) != n_seeds:  # a relaunch asking for another count: said, not silently ignored
            print(
                f"--rerun_best_with_seeds {n_seeds}: {folder} already holds the rerun over "
                f"{len(done)} seed(s) {done}; nothing rerun (remove {folder} to rerun with {n_seeds})",
                flush=True,
            )
        return None
    folder.mkdir(parents=True, exist_ok=True)
    return best["params"] if claims.claim(folder) else None


def rerun_best(base: TrainConfig, params: dict, n_seeds: int, build=None) -> dict:
    """Collective: the best params over N fresh seeds; rank 0 adds the summary's figures to sweep.json."""
    root = Path(base.output_dir)
    seeds = ",".join(str(base.seed + k) for k in range(1, n_seeds + 1))
    config = dataclasses.replace(
        base, **params, seeds=seeds, output_dir=str(root / RERUN_DIR), resume_from_checkpoint="auto"
    )
    # Rank 0 holds the claim: its heartbeat keeps workers on other hosts from taking the rerun over.
    with claims.Heartbeat(root / RERUN_DIR) if launcher_rank() == 0 else contextlib.nullcontext():
        summary = run_seeds(config, build)
    if launcher_rank() == 0:  # the claim's holder
        claims.release(root / RERUN_DIR)
        report = json.loads((root / REPORT_FILE).read_text())
        key = summary["metric_for_best_model"]
        report["rerun_best_with_seeds"] = {"folder": RERUN_DIR, "params": params, "seeds": summary["seeds"],
                                           key: summary["metrics"].get(key)}  # fmt: skip
        temporary = root / f".{REPORT_FILE}.writing"
        temporary.write_text(json.dumps(report, indent=2))
        temporary.replace(root / REPORT_FILE)
    return summary

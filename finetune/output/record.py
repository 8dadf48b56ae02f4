"""What a run writes when it ends, on rank 0: predictions, the training curves, the model card, the
confusion matrix, results.json last (it marks a finished run), then the closing lines on the terminal."""

from __future__ import annotations

import json
import time
from pathlib import Path

from finetune.output.card import hardware, is_model_card, write_model_card
from finetune.output.export import push_to_hub
from finetune.output.plots import CONFUSION_FILE, CURVES_FILE, plot_confusion_matrix, plot_training_curves
from finetune.output.terminal import results_summary
from finetune.output.writing import writing
from finetune.training.checkpoint import remove_export_checkpoint


def write_run_record(run, results: dict, predictions: list | None) -> None:
    """Rank 0 writes; on other ranks it does nothing (no collective)."""
    accelerator, config, state, task = run.accelerator, run.config, run.state, run.task
    if not accelerator.is_main_process:
        return
    output_dir = Path(config.output_dir)
    if predictions is not None:
        with writing("predictions.jsonl", output_dir), (output_dir / "predictions.jsonl").open("w") as f:
            f.writelines(json.dumps(p) + "\n" for p in predictions)
    if config.do_train and config.save_plots:
        with writing(CURVES_FILE, output_dir):
            plot_training_curves(
                output_dir / "metrics.jsonl", output_dir / CURVES_FILE, task.metric_keys(per_class=False)
            )
    card_written = False  # the closing list names only what this run wrote
    if config.do_train:
        wall_s = time.perf_counter() - run.started_s
        card = output_dir / "README.md"
        if card.exists() and not (card.is_file() and is_model_card(card)):  # the user's: kept
            print(f"{card} is not a model card of finetune's: kept as it is, no model card written")
        else:
            card_written = True
            with writing("the model card (README.md)", output_dir):
                machine = hardware(accelerator)
                parts = run.family.card_parts(config, task, results)
                write_model_card(
                    card, config, task, results, run.rows, machine, wall_s, run.given_flags, parts
                )
    if config.save_plots:
        with writing(CONFUSION_FILE, output_dir):  # custom single-label tasks and tagging only
            plot_confusion_matrix(results, output_dir / CONFUSION_FILE)
    # Last: results.json marks a finished run.
    with writing("results.json", output_dir):
        (output_dir / "results.json").write_text(json.dumps(results, indent=2))
    remove_export_checkpoint(config.output_dir, state)
    if summary := results_summary(results, task):
        print(summary)
    curves = f", {CURVES_FILE}" if config.save_plots else ""
    card_listed = ", README.md (model card)" if card_written else ""
    written = [f"model, tokenizer{card_listed}{curves}"] if config.do_train else []
    written += ["predictions.jsonl"] if predictions is not None else []
    logged = config.do_train or bool(run.eval_loaders)
    written.append(
        "results.json, metrics.jsonl, train_config.json" if logged else "results.json, train_config.json"
    )
    print(f"{', '.join(written)}: {output_dir.resolve()}")
    if config.push_to_hub:
        print(f"pushed to {push_to_hub(config.output_dir, config.hub_model_id)}")

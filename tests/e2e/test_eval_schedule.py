"""Evaluation schedule (--eval_strategy, --eval_steps), the best model at the end, early stopping."""

import json
import shutil

import pytest
import torch

from finetune.mnli import cli, main
from tests.helpers import (
    N_VALIDATION,
    read_jsonl,
    reset_accelerate,
    shifted_validation,
    sigterm_in_first_evaluation,
    tiny_args,
    weights,
)


def evaluations(output_dir) -> list[dict]:
    return [r for r in read_jsonl(output_dir / "metrics.jsonl") if "eval_matched_accuracy" in r]


def evaluate_only(model_dir, nli_files, output_dir, *extra) -> dict:
    reset_accelerate()
    args = tiny_args(model_dir, nli_files, output_dir, "--do_train", "false", *extra)
    return main([a for a in args if a != "--train_file" and a != str(nli_files["train"])])


def test_eval_steps_are_recorded_and_eval_loss_picks_the_lowest(tiny_model_dir, nli_files, tmp_path):
    out = tmp_path / "out"
    flags = ["--max_train_steps", "25", "--eval_strategy", "steps", "--eval_steps", "10"]
    results = main(tiny_args(tiny_model_dir, nli_files, out, *flags, "--metric_for_best_model", "eval_loss"))
    evals = evaluations(out)
    # Every 10 steps, and the last step (25) always; 38 steps make an epoch, so no epoch-end evaluation.
    assert [r["step"] for r in evals] == [10, 20, 25]
    assert [r["epoch"] for r in evals] == [round(s / 38, 4) for s in (10, 20, 25)]
    assert all(r["eval_matched_samples"] == N_VALIDATION and r["eval_loss"] > 0 for r in evals)
    # eval_loss: smaller is better, by default.
    assert json.loads((out / "train_config.json").read_text())["greater_is_better"] is False
    best = min(evals, key=lambda r: r["eval_loss"])
    assert (results["best_step"], results["best_metric"]) == (best["step"], best["eval_loss"])
    assert results["best_evaluation"] == best and results["last_evaluation"] == evals[-1]
    assert results["eval_runtime_s"] > 0 and results["stopped_early"] is False


def test_eval_strategy_no_trains_without_evaluating(tiny_model_dir, nli_files, tmp_path):
    out = tmp_path / "out"
    flags = ["--max_train_steps", "6", "--eval_strategy", "no"]
    results = main(tiny_args(tiny_model_dir, nli_files, out, *flags))
    assert not evaluations(out) and not (out / "best_model").exists()
    assert "eval_matched_accuracy" not in results and results["best_step"] is None
    assert results["exported_model_step"] == results["global_step"] == 6
    # Then no validation file is needed at all (HF Trainer's eval_strategy "no" without an eval dataset).
    args = tiny_args(tiny_model_dir, nli_files, tmp_path / "train-only", *flags)
    at = args.index("--validation_file")
    del args[at : at + 2]
    reset_accelerate()
    assert main(args)["global_step"] == 6


def test_a_learning_rate_too_small_to_change_anything_stops_after_patience_plus_one_evaluations(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    out = tmp_path / "out"
    flags = ["--learning_rate", "1e-12", "--eval_strategy", "steps", "--eval_steps", "3"]
    flags += ["--early_stopping_patience", "2", "--save_plots", "true"]  # a finished run's every file
    results = main(tiny_args(tiny_model_dir, nli_files, out, *flags))
    evals = evaluations(out)
    assert [r["step"] for r in evals] == [3, 6, 9]  # the first sets the best; two without improvement
    assert len({r["eval_matched_accuracy"] for r in evals}) == 1
    assert results["stopped_early"] is True and results["early_stopping_step"] == results["global_step"] == 9
    assert "early stopping at step 9: eval_matched_accuracy did not improve" in capsys.readouterr().out
    assert max(r["step"] for r in read_jsonl(out / "metrics.jsonl")) == 9
    finished = ["results.json", "model.safetensors", "README.md", "training_curves.png"]
    assert all((out / name).is_file() for name in finished)
    assert "stopped early" in (out / "README.md").read_text()


def test_the_root_model_is_the_best_one_and_predicts(tiny_model_dir, nli_files, tmp_path, capsys):
    """The exported model, re-evaluated, scores the best evaluation; --do_predict used it too."""
    files = shifted_validation(nli_files, tmp_path)
    out = tmp_path / "out"
    predict = ["--do_predict", "--test_file", str(files["validation"])]
    flags = ["--eval_strategy", "steps", "--eval_steps", "8"]
    results = main(tiny_args(tiny_model_dir, files, out, *flags, *predict))
    assert results["best_step"] < results["global_step"] == 38  # the test needs a best before the end
    assert results["exported_model_step"] == results["best_step"]
    said = f"exporting and predicting with the best model, from step {results['best_step']}"
    assert said in capsys.readouterr().out
    root, best = weights(out), weights(out / "best_model")
    assert all(torch.equal(root[name], best[name]) for name in best)

    again = evaluate_only(out, files, tmp_path / "again", *predict)
    best_eval = results["best_evaluation"]
    assert again["eval_matched_accuracy"] == best_eval["eval_matched_accuracy"]
    assert results["eval_matched_accuracy"] == best_eval["eval_matched_accuracy"]
    assert again["eval_loss"] == pytest.approx(best_eval["eval_loss"], rel=1e-6)
    assert read_jsonl(out / "predictions.jsonl") == read_jsonl(tmp_path / "again" / "predictions.jsonl")
    card = (out / "README.md").read_text()
    assert f"this model: the weights of step {results['best_step']}, the best evaluation" in card

    # --load_best_model_at_end false: the root is the last model; best_model/ still holds the best.
    reset_accelerate()
    last = tmp_path / "last"
    results = main(tiny_args(tiny_model_dir, files, last, *flags, "--load_best_model_at_end", "false"))
    assert results["exported_model_step"] == 38 and results["best_step"] < 38
    assert results["eval_matched_accuracy"] == results["last_evaluation"]["eval_matched_accuracy"]
    best_again = weights(last / "best_model")
    assert all(torch.equal(best[name], best_again[name]) for name in best)
    assert not all(torch.equal(weights(last)[name], best[name]) for name in best)


REFUSED = {
    "eval_steps-without-steps": (["--eval_steps", "10"], "error: --eval_steps is for --eval_strategy steps"),
    "best-without-evaluations": (
        ["--eval_strategy", "no", "--load_best_model_at_end", "true"],
        "error: --load_best_model_at_end needs evaluations",
    ),
    "patience-without-evaluations": (
        ["--eval_strategy", "no", "--early_stopping_patience", "3"],
        "error: --early_stopping_patience counts evaluations",
    ),
    "metric-not-produced": (
        ["--metric_for_best_model", "eval_f1"],
        "error: --metric_for_best_model eval_f1: this run measures eval_matched_accuracy, ",  # and the rest
    ),
}


@pytest.mark.parametrize("flags, error", REFUSED.values(), ids=REFUSED.keys())
def test_refused_before_the_model_loads(flags, error, nli_files, tmp_path, capsys):
    """A model folder that does not exist: the refusal must come before anything tries to load it."""
    assert cli(tiny_args(tmp_path / "no-model", nli_files, tmp_path / "out", *flags)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    # One error line, the last; before it at most datasets' progress bars of a first load (test order).
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors == lines[-1:] and errors[0].startswith(error), lines


def test_sigterm_during_a_mid_epoch_evaluation_resumes_with_that_evaluation(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    """--eval_strategy steps: a preemption during the evaluation at step 10 (mid-epoch) drops it and
    checkpoints step 10; the resumed run evaluates step 10 first and ends as the unbroken run."""
    flags = ["--max_train_steps", "20", "--eval_strategy", "steps", "--eval_steps", "10"]
    full = tmp_path / "full"
    main(tiny_args(tiny_model_dir, nli_files, full, *flags))
    reset_accelerate()

    killed = tmp_path / "killed"
    assert cli(tiny_args(tiny_model_dir, nli_files, killed, *flags), sigterm_in_first_evaluation([])) == 143
    assert "stopped by SIGTERM after step 10; checkpoint saved" in capsys.readouterr().err
    assert not evaluations(killed)
    reset_accelerate()

    results = main(tiny_args(tiny_model_dir, nli_files, killed, *flags, "--resume_from_checkpoint", "auto"))
    assert [r["step"] for r in evaluations(killed)] == [10, 20]
    assert evaluations(killed) == evaluations(full)
    assert results["best_evaluation"] == json.loads((full / "results.json").read_text())["best_evaluation"]
    a, b = weights(full), weights(killed)
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_a_checkpoint_resumed_without_its_best_model_exports_the_last_one(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    """The best model (step 4) lives in the first run's best_model/, not in its checkpoint: resumed in
    another folder, the run says so and exports the last model rather than failing at the end."""
    flags = ["--learning_rate", "1e-12", "--max_train_steps", "12", "--eval_strategy", "steps",
             "--eval_steps", "4", "--checkpointing_steps", "8"]  # fmt: skip
    first = tmp_path / "first"
    assert main(tiny_args(tiny_model_dir, nli_files, first, *flags))["best_step"] == 4
    reset_accelerate()
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copytree(first / "checkpoint-8", moved / "checkpoint-8")
    capsys.readouterr()
    results = main(tiny_args(tiny_model_dir, nli_files, moved, *flags, "--resume_from_checkpoint", "auto"))
    assert "does not hold the best model (step 4" in capsys.readouterr().out
    assert (results["best_step"], results["exported_model_step"]) == (4, 12)
    assert results["eval_matched_accuracy"] == results["last_evaluation"]["eval_matched_accuracy"]

"""--seeds: one configuration over several seeds, each a complete run in seed-<s>/, one summary over them.

A seed's run is the standalone run with --seed s, bit for bit; a relaunch with --resume_from_checkpoint
auto finishes what an interrupted study left and reruns nothing finished; 2 processes train every seed.
"""

import json
import statistics

import pytest
import torch

from finetune.errors import ConfigError
from finetune.mnli import main
from tests.e2e.test_bad_input import fails_cleanly
from tests.e2e.test_distributed import two_process
from tests.helpers import reset_accelerate, snapshot, tiny_args, weights
from tests.warm_ranks import run_warm

STEPS = [
    "--max_train_steps",
    "4",
    "--checkpointing_steps",
    "2",
    "--eval_strategy",
    "steps",
    "--eval_steps",
    "2",
]


def test_seeds_summarize_runs_equal_to_standalone_ones(tiny_model_dir, nli_files, tmp_path, capsys):
    out = tmp_path / "study"
    summary = main(
        tiny_args(tiny_model_dir, nli_files, out, *STEPS, "--seeds", "42,43,44", "--save_plots", "true")
    )
    reset_accelerate()
    assert json.loads((out / "summary.json").read_text()) == summary
    runs = {s: json.loads((out / f"seed-{s}" / "results.json").read_text()) for s in (42, 43, 44)}
    assert [json.loads((out / f"seed-{s}" / "train_config.json").read_text())["seed"] for s in runs] == [
        42,
        43,
        44,
    ]
    for name in ("eval_matched_accuracy", "eval_loss"):
        values = [runs[s][name] for s in runs]
        m = summary["metrics"][name]
        assert m["n"] == 3 and m["values"] == {str(s): runs[s][name] for s in runs}
        assert m["mean"] == pytest.approx(statistics.fmean(values))
        assert m["std"] == pytest.approx(statistics.stdev(values))
        assert (m["min"], m["max"]) == (min(values), max(values))
        half = 4.303 * m["std"] / 3**0.5  # Student's t, 2 degrees of freedom
        assert m["ci95"] == pytest.approx([m["mean"] - half, m["mean"] + half])
    key = summary["metric_for_best_model"]
    assert key == "eval_matched_accuracy" and summary["greater_is_better"] is True
    assert summary["best"]["value"] == max(r[key] for r in runs.values())
    assert summary["median"]["value"] == sorted(r[key] for r in runs.values())[1]
    card = (out / "README.md").read_text()
    assert "eval_matched_accuracy" in card and "±" in card and summary["best"]["folder"] in card
    assert (out / "seed_curves.png").stat().st_size > 0
    assert "eval_matched_accuracy over 3 seeds: " in capsys.readouterr().out

    alone = tmp_path / "alone"
    main(tiny_args(tiny_model_dir, nli_files, alone, *STEPS, "--seed", "43"))
    reset_accelerate()
    a, b = weights(alone), weights(out / "seed-43")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_calibrated_seeds_are_summarized_and_ranked_by_their_exported_models(
    tiny_model_dir, nli_files, tmp_path
):
    """--calibrate temperature with --metric_for_best_model eval_matched_ece: each seed's figure in the
    summary, and the best seed, are those of the calibrated model in its folder (evaluated afresh), not
    of the model before calibration, which the summary keeps under its own name."""
    out = tmp_path / "study"
    from tests.e2e.test_calibration import OVERFIT

    flags = [*OVERFIT[:-1], "--calibrate", "temperature", "--metric_for_best_model", "eval_matched_ece"]
    summary = main(tiny_args(tiny_model_dir, nli_files, out, *flags, "--seeds", "42,43"))
    reset_accelerate()
    evaluated = {}
    for seed in (42, 43):
        evaluated[seed] = main(
            tiny_args(out / f"seed-{seed}", nli_files, tmp_path / f"eval-{seed}", "--do_train", "false")
        )
        reset_accelerate()
    ece = summary["metrics"]["eval_matched_ece"]
    for seed in (42, 43):
        assert ece["values"][str(seed)] == pytest.approx(evaluated[seed]["eval_matched_ece"], abs=1e-5)
    best = min((42, 43), key=lambda s: evaluated[s]["eval_matched_ece"])
    assert summary["best"]["seed"] == best
    before = summary["metrics"]["eval_matched_ece_before_calibration"]["values"]
    assert all(abs(before[s] - ece["values"][s]) > 1e-4 for s in before)


@pytest.mark.subprocess
def test_an_interrupted_study_finishes_with_auto_and_reruns_nothing_finished(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    """SIGKILL in seed 2's third step (after its checkpoint at 2); the relaunch reads seed 1 back as it
    is, resumes seed 2 from its checkpoint and trains seed 3. Relaunched without --resume_from_checkpoint
    auto, the study names it first (--overwrite_output_dir would retrain seed 1)."""
    out = tmp_path / "study"
    args = tiny_args(tiny_model_dir, nli_files, out, *STEPS, "--seeds", "1,2,3")
    env = {"AT_STEP": "3", "SIGNAL": "KILL", "ONLY_IN": "seed-2"}
    killed = run_warm(args, script="tests/probes/signal_at_step.py", env=env)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (out / "seed-1" / "results.json").exists() and not (out / "seed-2" / "results.json").exists()
    assert not (out / "seed-3").exists() and not (out / "summary.json").exists()
    # Relaunched as it was: the way on that keeps seed 1 comes first, not --overwrite_output_dir's.
    said = fails_cleanly(args, out, "relaunch with --resume_from_checkpoint auto", capsys, exit_code=2)
    assert said.index("--resume_from_checkpoint auto") < said.index("--overwrite_output_dir")
    reset_accelerate()
    first = snapshot(out / "seed-1")
    capsys.readouterr()
    summary = main([*args, "--resume_from_checkpoint", "auto"])
    reset_accelerate()
    stdout = capsys.readouterr().out
    assert snapshot(out / "seed-1") == first  # read back, not rerun
    assert f"resuming from {out / 'seed-2' / 'checkpoint-2'} at step 2" in stdout
    assert summary["seeds"] == [1, 2, 3] and summary["metrics"]["eval_loss"]["n"] == 3
    assert all(
        json.loads((out / f"seed-{s}" / "results.json").read_text())["global_step"] == 4 for s in (2, 3)
    )


def test_bad_seeds_and_a_single_runs_folder_are_refused(tiny_model_dir, nli_files, tmp_path, capsys):
    out = tmp_path / "run"
    main(tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "2"))
    reset_accelerate()
    before = snapshot(out)
    with pytest.raises(ConfigError) as refused:
        main(tiny_args(tiny_model_dir, nli_files, out, "--seeds", "1,2"))
    assert refused.value.flag == "--output_dir" and "another folder" in refused.value.fix
    fails_cleanly(
        tiny_args(tiny_model_dir, nli_files, out, "--seeds", "1,2"), out, "--seeds", capsys, exit_code=2
    )
    assert snapshot(out) == before
    with pytest.raises(ConfigError) as refused:
        main(tiny_args(tiny_model_dir, nli_files, tmp_path / "x", "--seeds", "7,7"))
    assert refused.value.flag == "--seeds" and not (tmp_path / "x").exists()


def test_a_summary_or_curves_of_the_users_are_refused_unless_overwritten(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    """--seeds wrote over a summary.json and seed_curves.png of the user's without a word."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "summary.json").write_text('{"my": "numbers"}')
    (out / "seed_curves.png").write_bytes(b"my figure")
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "2", "--seeds", "1")
    line = fails_cleanly(args, out, "holds summary.json and seed_curves.png", capsys, exit_code=2)
    assert "--overwrite_output_dir" in line
    main([*args, "--overwrite_output_dir"])  # asked for: replaced
    reset_accelerate()
    assert json.loads((out / "summary.json").read_text())["seeds"] == [1]
    main([*args, "--resume_from_checkpoint", "auto"])  # the study's own summary: relaunched freely
    reset_accelerate()


@pytest.mark.multiprocess
def test_two_processes_train_every_seed(tiny_model_dir, nli_files, tmp_path):
    out = tmp_path / "study"
    done = two_process(tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "2", "--seeds", "5,6"))
    assert "eval_matched_accuracy over 2 seeds" in done.stdout
    for seed in (5, 6):
        assert json.loads((out / f"seed-{seed}" / "results.json").read_text())["world_size"] == 2
    assert json.loads((out / "summary.json").read_text())["seeds"] == [5, 6]


def test_a_taggers_study_is_titled_by_its_family_without_fixed_counts_and_inside_each_range(tmp_path):
    """A tagger's seeds (issue: titled `# model on mnli`, eval_support_* ± 0 and intervals above 1): the
    title says tagging and its data, a support (every seed's validation rows alike) is said once, not as
    a figure with a spread, and every interval stays inside its metric's range."""
    from finetune.metrics.ranges import metric_range
    from tests.tagging_data import sentences, tiny_tagger, write_conll, write_jsonl

    model = tiny_tagger(tmp_path / "bert")
    train = write_conll(tmp_path / "train.conll", sentences(24, seed=0))
    validation = write_jsonl(tmp_path / "validation.jsonl", sentences(12, seed=1))
    out = tmp_path / "study"
    summary = main([
        "--task_type", "token_classification", "--model_name_or_path", str(model),
        "--train_file", str(train), "--validation_file", str(validation), "--output_dir", str(out),
        "--max_length", "32", "--mixed_precision", "no", "--report_to", "none", "--save_plots", "false",
        "--max_train_steps", "2", "--learning_rate", "5e-3", "--seeds", "1,2,3",
    ])  # fmt: skip
    reset_accelerate()
    card = (out / "README.md").read_text()
    assert "\n# `bert` (a local folder) on tagging (train.conll): 3 seeds\n" in card
    assert "mnli" not in card and str(tmp_path) not in card
    supports = {k for k in json.loads((out / "seed-1" / "results.json").read_text()) if "_support_" in k}
    assert supports and supports <= set(summary["fixed_counts"])
    assert not supports & set(summary["metrics"]) and "| eval_support_" not in card
    assert "eval_words" in summary["fixed_counts"]  # a count, and the same rows for each seed
    for name, m in summary["metrics"].items():
        low, high = metric_range(name)
        assert (low is None or m["ci95"][0] >= low) and (high is None or m["ci95"][1] <= high), name

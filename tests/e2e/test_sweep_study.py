"""A sweep's own folder, journal and identity (finetune/studies/joining.py, journal.py, storage.py): the
folder holds one study and nothing else, the journal stays readable after a worker died writing it, a
study is joined only by the same sweep, and its rerun follows the best trial. The tiny BERT, 4 steps."""

import json
import re
import shutil

import pytest

from finetune.mnli import main
from finetune.studies.sweep_command import sweep_cli, sweep_main
from tests.e2e.test_sweep import TRIAL, report, sweep_yaml
from tests.helpers import refused, reset_accelerate, snapshot, tiny_args, weights

LR = (
    "n_trials: {n}\nsampler: random\nseed: 0\nsearch_space:\n"
    "  learning_rate: {{type: float, low: 1.0e-4, high: 1.0e-2, log: true}}\n"
)


def refused_cleanly(argv, folder, expected: str, capsys) -> str:
    """`sweep_cli(argv)` exits 2 with one `error:` line holding `expected`, and `folder` is untouched."""
    before = snapshot(folder) if folder.exists() else None
    capsys.readouterr()
    code = sweep_cli(argv)
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert errors == err.strip().splitlines()[-1:] and expected in errors[0], err[-2000:]
    assert (snapshot(folder) if folder.exists() else None) == before
    return errors[0]


@pytest.fixture(scope="module")
def one_trial_study(tiny_model_dir, nli_files, tmp_path_factory):
    """A finished study of one trial (journal storage), and the flags that made it; tests copy it."""
    tmp = tmp_path_factory.mktemp("one-trial")
    config = sweep_yaml(tmp, LR.format(n=1))
    argv = ["--sweep_config", config, *tiny_args(tiny_model_dir, nli_files, tmp / "study", *TRIAL)]
    sweep_main(argv)
    reset_accelerate()
    return tmp / "study", argv


def in_copy(study, argv, tmp_path):
    out = tmp_path / "study"
    shutil.copytree(study, out)
    return out, [str(out) if a == str(study) else a for a in argv]


def test_a_torn_last_journal_line_is_dropped_and_a_damaged_one_is_one_line(one_trial_study, tmp_path, capsys):
    study, argv = one_trial_study
    # A worker killed while appending a record: the next worker's record was appended onto it, and from
    # then on every launch died on a JSONDecodeError traceback.
    out, torn = in_copy(study, argv, tmp_path / "torn")
    journal = out / "optuna-journal.log"
    lines = journal.read_bytes().splitlines(keepends=True)
    with journal.open("ab") as f:
        f.write(lines[-1][: len(lines[-1]) // 2])
    grown = sweep_yaml(tmp_path, LR.format(n=2))  # the same study, grown by a trial
    capsys.readouterr()
    assert sweep_cli([*torn[:1], grown, *torn[2:]]) == 0, capsys.readouterr().err[-3000:]
    reset_accelerate()
    assert f"{journal}: its last line was cut off" in capsys.readouterr().out
    assert [(t["number"], t["state"]) for t in report(out)["trials"]] == [(0, "COMPLETE"), (1, "COMPLETE")]
    assert journal.read_bytes().startswith(b"".join(lines))  # every record before it kept

    # A damaged line inside the journal (an older finetune's merged line): named, nothing changed.
    out, damaged = in_copy(study, argv, tmp_path / "damaged")
    journal = out / "optuna-journal.log"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join([*lines[:2], lines[2][:20] + lines[3], *lines[4:]]))
    refused_cleanly(damaged, out, f"{journal}: line 3 is damaged", capsys)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:////no/such/folder/study.db", "cannot open that file (unable to open database file)"),
        ("mongodb://localhost/study", "mongodb:// is not a database Optuna can use"),
        ("sqlite:///{tmp}/notes.txt", "that file is not a database"),
    ],
    ids=["unopenable sqlite path", "unknown scheme", "not a database"],
)
def test_each_storage_mistake_is_one_line(url, expected, tiny_model_dir, nli_files, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a database, " * 100)
    out = tmp_path / "study"
    config = sweep_yaml(tmp_path, LR.format(n=1))
    argv = [
        "--sweep_config",
        config,
        "--storage",
        url.format(tmp=tmp_path),
        *tiny_args(tiny_model_dir, nli_files, out),
    ]
    refused_cleanly(argv, tmp_path, f"error: --storage {url.format(tmp=tmp_path)}: {expected}", capsys)
    with refused("--storage"):
        sweep_main(argv)


def test_a_sweep_refuses_a_folder_holding_other_files_and_replaces_a_run_only_when_told(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    config = sweep_yaml(tmp_path, LR.format(n=1))
    # Another model's config.json beside a README of the user's: both were replaced, exit 0.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("my notes\n")
    (mine / "config.json").write_text('{"model_type": "bert"}\n')
    argv = ["--sweep_config", config, *tiny_args(tiny_model_dir, nli_files, mine, *TRIAL)]
    line = refused_cleanly(argv, mine, "holds files of an earlier run or another model", capsys)
    assert "--overwrite_output_dir" in line

    # A finished single run (beside the user's README, which it kept): its model and card were replaced
    # while its results.json stayed, describing other weights.
    run = tmp_path / "run"
    run.mkdir()
    (run / "README.md").write_text("my notes\n")
    main(tiny_args(tiny_model_dir, nli_files, run, "--max_train_steps", "2"))
    reset_accelerate()
    argv = ["--sweep_config", config, *tiny_args(tiny_model_dir, nli_files, run, *TRIAL)]
    assert "results.json" in refused_cleanly(argv, run, "holds a finished run (", capsys)
    assert sweep_cli([*argv, "--overwrite_output_dir"]) == 0
    reset_accelerate()
    assert "removed the earlier run's" in capsys.readouterr().out
    assert not [n for n in ("results.json", "best_model", "metrics.jsonl") if (run / n).exists()]
    assert weights(run).keys() == weights(run / "trial-0").keys()
    assert all(weights(run)[k].equal(weights(run / "trial-0")[k]) for k in weights(run))
    assert (run / "README.md").read_text() == "my notes\n"  # kept, as a run keeps it


def test_sweeps_sharing_a_storage_under_the_default_name_stay_apart(tiny_model_dir, nli_files, tmp_path):
    """Under one fixed default name the second sweep joined the first's study: it ran nothing (the
    study had its trial), or adopted the other's trials, and reported the other's values."""
    config = sweep_yaml(tmp_path, LR.format(n=1))
    storage = ["--storage", f"sqlite:///{tmp_path / 'shared.db'}"]
    first, second = tmp_path / "first", tmp_path / "second"
    sweep_main(["--sweep_config", config, *storage, *tiny_args(tiny_model_dir, nli_files, first, *TRIAL)])
    reset_accelerate()
    other = tiny_args(tiny_model_dir, nli_files, second, *TRIAL, "--warmup_ratio", "0.5")
    sweep_main(["--sweep_config", config, *storage, *other])
    reset_accelerate()
    assert report(first)["study_name"] != report(second)["study_name"]
    for out in (first, second):
        assert [t["folder"] for t in report(out)["trials"]] == [str(out / "trial-0")]
        best = report(out)["best_trial"]
        recorded = json.loads((out / "trial-0" / "results.json").read_text())
        assert best["folder"] == str(out / "trial-0") and best["value"] == recorded[report(out)["metric"]]
    assert json.loads((second / "trial-0" / "train_config.json").read_text())["warmup_ratio"] == 0.5


def test_a_relaunch_with_other_training_flags_is_refused(one_trial_study, tmp_path, capsys):
    """It joined the old study, whose best trial was then picked across trials trained differently."""
    out, argv = in_copy(*one_trial_study, tmp_path)
    grown = sweep_yaml(tmp_path, LR.format(n=2))
    line = refused_cleanly(
        [*argv[:1], grown, *argv[2:], "--warmup_ratio", "0.5"], out, "--warmup_ratio 0.5", capsys
    )
    recorded = json.loads((out / "study.json").read_text())["identity"]["warmup_ratio"]
    assert f"runs with --warmup_ratio {recorded};" in line and "another --output_dir" in line


def test_a_changed_search_space_is_refused_before_the_running_trial_is_adopted(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    """A trial RUNNING under the old space, adopted under the new one, was a ValueError traceback
    ("Cannot set different distribution kind"), and every worker stopped on it."""
    out = tmp_path / "study"
    argv = [
        "--sweep_config",
        sweep_yaml(tmp_path, LR.format(n=2)),
        *tiny_args(tiny_model_dir, nli_files, out, *TRIAL),
    ]

    def ctrl_c(*launch):  # the worker stopped as its trial starts: the trial stays RUNNING
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep_main(argv, ctrl_c)
    reset_accelerate()
    changed = tmp_path / "changed.yaml"
    changed.write_text(LR.format(n=2).replace("{type: float, low: 1.0e-4, high: 1.0e-2, log: true}",
                                              "{type: categorical, choices: [1.0e-3, 3.0e-3]}"))  # fmt: skip
    line = refused_cleanly(
        ["--sweep_config", str(changed), *argv[2:]], out, "its search space differs", capsys
    )
    assert "learning_rate: float 0.0001..0.01 log" in line and "categorical [0.001, 0.003]" in line


def test_the_rerun_follows_the_best_trial_and_the_report_keeps_it(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    """The study grows by a worse trial, then by a better one. Before: sweep.json lost its rerun block
    at the next report, and a new best was never rerun, without a word."""
    out = tmp_path / "study"
    # Grid order for seed 0: 1e-3, then 1e-9 (learns nothing), then 1e-2, by the loss on the 64 rows
    # each trial trains on (as in test_sweep's pruning test).
    space = (
        "seed: 0\nsampler: grid\nsearch_space:\n  learning_rate: {type: categorical, choices: "
        "[1.0e-2, 1.0e-9, 1.0e-3]}\n"
    )
    memorized = {"train": nli_files["train"], "validation": nli_files["train"]}
    base = tiny_args(tiny_model_dir, memorized, out, *TRIAL, "--max_eval_samples", "64",
                     "--metric_for_best_model", "eval_loss")  # fmt: skip

    def launch(n_trials: int) -> str:
        config = sweep_yaml(tmp_path, f"n_trials: {n_trials}\n{space}")
        capsys.readouterr()
        assert sweep_cli(["--sweep_config", config, *base, "--rerun_best_with_seeds", "1"]) == 0
        reset_accelerate()
        return capsys.readouterr().out

    def rerun_lr(folder) -> float:
        return json.loads((folder / "seed-43" / "train_config.json").read_text())["learning_rate"]

    launch(1)
    assert report(out)["rerun_best_with_seeds"]["trial"] == 0 and rerun_lr(out / "best_seeds") == 1e-3
    first = snapshot(out / "best_seeds")
    launch(2)  # trial 1, worse: the rerun stands, and sweep.json still says so
    assert [t["params"]["learning_rate"] for t in report(out)["trials"]] == [1e-3, 1e-9]
    assert report(out)["best_trial"]["number"] == 0
    assert report(out)["rerun_best_with_seeds"]["trial"] == 0 and snapshot(out / "best_seeds") == first
    said = launch(3)  # trial 2 is the new best: rerun, the earlier rerun kept beside
    assert (
        report(out)["best_trial"]["number"] == 2
        and report(out)["trials"][2]["params"]["learning_rate"] == 1e-2
    )
    assert (
        "the best trial is now 2; best_seeds/ held the rerun of trial 0's params: kept as best_seeds-trial-0/"
        in said
    )
    assert rerun_lr(out / "best_seeds") == 1e-2 and report(out)["rerun_best_with_seeds"]["trial"] == 2
    assert report(out)["rerun_best_with_seeds"]["seeds"] == [43]
    assert snapshot(out / "best_seeds-trial-0") == first


def test_seeds_in_a_sweep_are_refused(tiny_model_dir, nli_files, tmp_path, capsys):
    """Recorded in every trial's train_config.json ("seeds": "1,2") and ignored: each trial ran once."""
    out = tmp_path / "study"
    config = sweep_yaml(tmp_path, LR.format(n=1))
    argv = ["--sweep_config", config, *tiny_args(tiny_model_dir, nli_files, out, "--seeds", "1,2")]
    line = refused_cleanly(argv, out, "--seeds: a sweep trains each trial once", capsys)
    assert "--rerun_best_with_seeds" in line and not out.exists()


def test_the_root_card_finds_every_image_it_shows(tiny_model_dir, nli_files, tmp_path):
    """The best trial's card, copied to the sweep's folder, links its charts by relative names: they are
    copied beside it, the best trial's own."""
    config = sweep_yaml(tmp_path, LR.format(n=1))
    flags = [*TRIAL, "--save_plots", "true", "--task_name", "custom", "--text_columns", "premise,hypothesis"]
    out = tmp_path / "study"
    sweep_main(["--sweep_config", config, *tiny_args(tiny_model_dir, nli_files, out, *flags)])
    card = (out / "README.md").read_text()
    linked = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", card)
    assert set(linked) == {"training_curves.png", "confusion_matrix.png"}
    for name in linked:
        assert (out / name).read_bytes() == (out / "trial-0" / name).read_bytes(), name

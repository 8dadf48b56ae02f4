"""A sweep's own folder, journal and identity (finetune/studies/joining.py, journal.py, storage.py): the
folder holds one study and nothing else, the journal stays readable after a worker died writing it, a
study is joined only by the same sweep, and its rerun follows the best trial. The tiny BERT, 4 steps."""

import shutil

import pytest

from finetune.studies.sweep import sweep_cli, sweep_main
from tests.e2e.test_sweep import TRIAL, report, sweep_yaml
from tests.helpers import refused, reset_accelerate, snapshot, tiny_args

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

"""Every common mistake: one line naming the flag or file and the fix, a non-zero exit, nothing lost.

Each case runs the entry point's `cli(argv)` in this process (as `finetune/mnli.py` does), next to
an output folder holding a finished run, and checks that folder is byte-for-byte unchanged
afterwards. A few cases run the real entry point in a subprocess, for the promise of no traceback
from a fresh interpreter and for what needs a process of its own (a launcher, a file-size limit).
"""

import json
import os
import shutil
import signal

import pytest

from finetune.config.identity import run_identity
from finetune.config.parser import parse_config
from finetune.mnli import cli, main
from finetune.output.prerun import finished_run
from finetune.run import setup
from tests.helpers import PYTHON, REPO, run_cli, snapshot, tiny_args, with_fault, with_flag
from tests.warm_ranks import run_ranks, run_warm

ENTRY = [PYTHON, "finetune/mnli.py"]


@pytest.fixture(scope="module")
def finished(tiny_model_dir, nli_files, tmp_path_factory):
    """A finished run with checkpoints: what every bad invocation must leave alone."""
    out = tmp_path_factory.mktemp("finished") / "out"
    main(tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "10", "--checkpointing_steps", "5"))
    return out


def fails_cleanly(argv, finished, expected: str, capsys, build=None, exit_code: int | None = None) -> str:
    """`cli(argv)` returns non-zero; the last line of stderr is finetune's `error: ...` holding
    `expected`; `finished` is untouched. Returns that line."""
    before = snapshot(finished)
    capsys.readouterr()
    code = cli(argv, build)
    err = capsys.readouterr().err
    assert code != 0 if exit_code is None else code == exit_code, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and expected in last, err[-2000:]
    assert snapshot(finished) == before
    return last


def fails_cleanly_in_a_process(command, finished, expected: str, env=None, file_size_limit_kib=None) -> str:
    """The same through a real process: and no traceback at all on its stderr. `command` a list to
    start, or (with `file_size_limit_kib`, as `ulimit -f`) the flags of `python finetune/mnli.py` in a
    process forked warm (tests/warm_ranks.py)."""
    before = snapshot(finished)
    if file_size_limit_kib is None:
        done = run_cli(command, env=env)
    else:
        done = run_warm(command, env=env, file_size_limit_kib=file_size_limit_kib)
    assert done.returncode != 0
    lines = [line for line in done.stderr.strip().splitlines() if line.startswith("error: ")]
    assert lines and expected in lines[-1], done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == lines[-1] and "Traceback" not in done.stderr
    assert snapshot(finished) == before
    return lines[-1]


@pytest.fixture
def good(tiny_model_dir, nli_files, tmp_path):
    """Working flags for a fresh output folder; each case spoils one thing."""
    return tiny_args(tiny_model_dir, nli_files, tmp_path / "new")


def write(path, text):
    path.write_text(text)
    return str(path)


def write_bytes(path, data):
    path.write_bytes(data)
    return str(path)


GOOD_ROW = '{"premise": "a", "hypothesis": "b", "label": 0}\n'
CSV = "premise,hypothesis,label\nA man sleeps.,Nobody sleeps.,2\n"


CASES = {
    "unknown flag": (lambda a, t: [*a, "--learning_rte", "1e-4"], "unknown argument(s) --learning_rte 1e-4"),
    "HF Trainer's flag name": (
        lambda a, t: [*a, "--max_steps=5"],
        "--max_steps is HF Trainer's or TRL's name, not one here; use --max_train_steps N",
    ),
    "HF Trainer's name in yaml": (
        lambda a, t: [*a, "--config", write(t / "c.yaml", "bf16: true\n")],
        "c.yaml: bf16 is HF Trainer's or TRL's name, not one here; use --mixed_precision bf16",
    ),
    "unknown yaml key": (
        lambda a, t: [*a, "--config", write(t / "c.yaml", "learning_rte: 1e-4\n")],
        "c.yaml: unknown key(s) learning_rte",
    ),
    "yaml that does not parse": (
        lambda a, t: [*a, "--config", write(t / "c.yaml", "learning_rate: [1\n")],
        "c.yaml: not valid YAML",
    ),
    "missing data file": (
        lambda a, t: with_flag(a, "--train_file", str(t / "nope.jsonl")),
        "nope.jsonl does not exist",
    ),
    "unsupported extension": (
        lambda a, t: with_flag(a, "--train_file", str(t / "d.xlsx")),
        "unsupported extension",
    ),
    "empty data file": (lambda a, t: with_flag(a, "--train_file", write(t / "e.csv", "")), "e.csv is empty"),
    "missing columns": (
        lambda a, t: with_flag(a, "--train_file", write(t / "c.jsonl", '{"sentence1": "a", "label": 0}\n')),
        "lacks column(s) premise, hypothesis; found sentence1, label",
    ),
    "labels outside the label set": (
        lambda a, t: with_flag(
            a, "--train_file", write(t / "l.jsonl", '{"premise": "a", "hypothesis": "b", "label": "maybe"}\n')
        ),
        "label value(s) 'maybe' (first at row 0)",
    ),
    "hub id while offline": (
        lambda a, t: with_flag(a, "--model_name_or_path", "bert-base-cased"),
        "not in the Hugging Face cache, and HF_HUB_OFFLINE is set, so the Hub is not asked",
    ),
    "metric that the run does not measure": (
        lambda a, t: with_flag(a, "--metric_for_best_model", "eval_mismatched_accuracy"),
        "this run measures eval_matched_accuracy",
    ),
    "model path that does not exist": (
        lambda a, t: with_flag(a, "--model_name_or_path", str(t / "no-model")),
        "no-model: no such folder; check the path",
    ),
    "max_length beyond the model's positions": (
        lambda a, t: with_flag(a, "--max_length", "4096"),
        "exceeds the model's 128",
    ),
    "zero batch size": (
        lambda a, t: with_flag(a, "--per_device_train_batch_size", "0"),
        "--per_device_train_batch_size",
    ),
    "zero accumulation": (
        lambda a, t: with_flag(a, "--gradient_accumulation_steps", "0"),
        "--gradient_accumulation_steps",
    ),
    "zero epochs": (lambda a, t: with_flag(a, "--num_train_epochs", "0"), "--num_train_epochs"),
    "negative learning rate": (
        lambda a, t: with_flag(a, "--learning_rate", "-1"),
        "--learning_rate must be > 0",
    ),
    "max_train_samples 0": (lambda a, t: with_flag(a, "--max_train_samples", "0"), "--max_train_samples"),
    "malformed jsonl line": (
        lambda a, t: with_flag(
            a, "--train_file", write(t / "m.jsonl", GOOD_ROW + '{"premise": broken\n' + GOOD_ROW)
        ),
        "m.jsonl: line 2 is not valid JSON; fix it to hold one JSON object per line",
    ),
    "jsonl line that is no object": (
        lambda a, t: with_flag(a, "--train_file", write(t / "n.jsonl", GOOD_ROW * 11 + "[1, 2, 3]\n")),
        "n.jsonl: line 12 is a JSON list, not an object; fix it to hold one JSON object per line",
    ),
    "tsv field with a tab inside quotes": (
        lambda a, t: with_flag(
            a, "--train_file", write(t / "q.tsv", 'premise\thypothesis\tlabel\na\tb\t0\n"a\tb"\tc\t0\n')
        ),
        "so no field may hold a tab: write such rows as .csv or .jsonl",
    ),
    "random bytes named jsonl": (
        lambda a, t: with_flag(a, "--train_file", write_bytes(t / "r.jsonl", bytes(range(256)) * 4)),
        "r.jsonl: ",
    ),
    "utf-16 csv": (
        lambda a, t: with_flag(a, "--train_file", write_bytes(t / "u.csv", CSV.encode("utf-16"))),
        "u.csv: not UTF-8 text; save it as UTF-8",
    ),
    "csv row with an extra field": (
        lambda a, t: with_flag(a, "--train_file", write(t / "x.csv", CSV + "a,b,0,extra\n")),
        "x.csv: cannot be parsed (Error tokenizing data. C error: Expected 3 fields in line 3, saw 4)",
    ),
    "csv with only its header": (
        lambda a, t: with_flag(a, "--train_file", write(t / "h.csv", "premise,hypothesis,label\n")),
        "h.csv: holds no rows",
    ),
    "jsonl of blank lines": (
        lambda a, t: with_flag(a, "--train_file", write(t / "b.jsonl", "\n\n\n")),
        "b.jsonl: holds no rows",
    ),
    "max_length below the special tokens": (
        lambda a, t: with_flag(a, "--max_length", "2"),
        "--max_length 2 is below the 5 tokens this tokenizer needs for a pair",
    ),
    "non-finite learning rate": (
        lambda a, t: with_flag(a, "--learning_rate", "nan"),
        "--learning_rate must be a finite",
    ),
    "non-finite weight decay": (
        lambda a, t: with_flag(a, "--weight_decay", "inf"),
        "--weight_decay must be a finite",
    ),
    "wrong type in YAML": (
        lambda a, t: [*a, "--config", write(t / "c.yaml", "learning_rate: abc\n")],
        "c.yaml: learning_rate: 'abc' is not a valid value",
    ),
    "choice outside the list": (
        lambda a, t: with_flag(a, "--lr_scheduler_type", "reduce_lr_on_plateau"),
        "--lr_scheduler_type: invalid choice 'reduce_lr_on_plateau'; choose one of linear,",
    ),
    "checkpointing_steps neither int nor epoch": (
        lambda a, t: with_flag(a, "--checkpointing_steps", "often"),
        "--checkpointing_steps must be a positive integer or 'epoch'",
    ),
    "overwrite and resume": (
        lambda a, t: [*a, "--overwrite_output_dir", "--resume_from_checkpoint", "auto"],
        "--overwrite_output_dir starts the run over and --resume_from_checkpoint continues it: give one",
    ),
    "resume from nothing": (
        lambda a, t: with_flag(a, "--resume_from_checkpoint", str(t / "nothing")),
        "nothing does not exist; give a checkpoint-N folder, or 'auto'",
    ),
    "resume from a folder that is no checkpoint": (
        lambda a, t: with_flag(a, "--resume_from_checkpoint", str(t)),
        "not a complete checkpoint",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_fails_in_one_line(case, good, finished, tmp_path, capsys):
    spoil, expected = CASES[case]
    fails_cleanly(spoil(good, tmp_path), finished, expected, capsys)


@pytest.mark.parametrize(
    ("case", "flag", "value", "expected"),
    [
        (
            "a file",
            "--output_dir",
            "a-file",
            "error: --output_dir {tmp}/a-file is a file; give a folder path",
        ),
        (
            "not writable",
            "--output_dir",
            "/proc/finetune-out",
            "error: --output_dir /proc/finetune-out: cannot write there (No such file or directory); "
            "choose a writable folder",
        ),
    ],
)
def test_output_dir_that_cannot_be_used(case, flag, value, expected, good, finished, tmp_path, capsys):
    (tmp_path / "a-file").write_text("x")
    path = str(tmp_path / value) if case == "a file" else value
    last = fails_cleanly(with_flag(good, flag, path), finished, "--output_dir", capsys)
    assert last == expected.format(tmp=tmp_path)


def test_finished_output_dir_is_refused_and_kept(tiny_model_dir, nli_files, finished, capsys):
    same = ["--max_train_steps", "10", "--checkpointing_steps", "5"]
    last = fails_cleanly(tiny_args(tiny_model_dir, nli_files, finished, *same), finished, "", capsys)
    assert last == (
        f"error: --output_dir {finished} holds a finished run (results.json); choose another folder, or "
        "pass --overwrite_output_dir to replace that run"
    )
    # Another run's flags: named, old and new, since --overwrite_output_dir deletes that run's model.
    other = tiny_args(tiny_model_dir, nli_files, finished, "--max_train_steps", "12", "--seed", "7")
    last = fails_cleanly(other, finished, "", capsys)
    assert last == (
        f"error: --output_dir {finished} holds a finished run (results.json) with --max_train_steps 10, "
        "--seed 42; this run has --max_train_steps 12, --seed 7; relaunch with that run's settings to keep "
        "it, choose another folder, or pass --overwrite_output_dir to delete that run's model and train again"
    )


@pytest.mark.parametrize("model", ["", "best_model"], ids=["the folder", "its best model"])
@pytest.mark.parametrize(
    "extra", [("--do_train", "false"), ("--overwrite_output_dir",)], ids=["evaluate", "train"]
)
def test_the_models_own_folder_is_never_the_output_dir(nli_files, finished, capsys, extra, model):
    """Evaluating a finished run's model (or its best model) into that run's folder would replace its
    run record, and --overwrite_output_dir would delete the model being read."""
    args = [*tiny_args(finished / model, nli_files, finished), *extra]
    last = fails_cleanly(args, finished, "", capsys, exit_code=2)
    assert last == (
        f"error: --output_dir {finished} {'holds' if model else 'is'} the --model_name_or_path folder: this "
        "run would write over the model it reads and its run record; choose another --output_dir"
    )


def test_a_finished_run_relaunched_with_resume_auto_changes_nothing(
    tiny_model_dir, nli_files, finished, capsys
):
    """A requeued job or a restarted script after the end: exit 0, the run as it was."""
    before = snapshot(finished)
    args = tiny_args(
        tiny_model_dir, nli_files, finished, "--max_train_steps", "10", "--checkpointing_steps", "5"
    )
    assert cli([*args, "--resume_from_checkpoint", "auto"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        f"{finished} holds a finished run (results.json, step 10): nothing to resume; to start it over, drop "
        "--resume_from_checkpoint and pass --overwrite_output_dir"
    )
    assert snapshot(finished) == before
    # Not the same run: another warmup, or the model named by another path to the same folder.
    relaunched = [*args, "--resume_from_checkpoint", "auto"]

    def finished(argv):
        config = parse_config(argv)
        return finished_run(config, run_identity(config, world_size=1))

    assert finished([*relaunched, "--warmup_steps", "3"]) is None
    assert (
        finished(with_flag(relaunched, "--model_name_or_path", os.path.relpath(tiny_model_dir))) is not None
    )


def test_resume_from_a_partial_checkpoint(tiny_model_dir, nli_files, finished, tmp_path, capsys):
    partial = tmp_path / ".checkpoint-7.partial"
    partial.mkdir()
    args = tiny_args(tiny_model_dir, nli_files, tmp_path / "out", "--resume_from_checkpoint", str(partial))
    fails_cleanly(args, finished, "not a complete checkpoint (no trainer_state.json)", capsys)


def test_resume_with_another_number_of_processes(tiny_model_dir, nli_files, finished, tmp_path, capsys):
    checkpoint = finished / "checkpoint-10"
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    copy = tmp_path / "checkpoint-10"
    copy.mkdir()
    for f in checkpoint.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    (copy / "trainer_state.json").write_text(
        json.dumps({**state, "identity": {**state["identity"], "world_size": 4}})
    )
    args = tiny_args(tiny_model_dir, nli_files, tmp_path / "out", "--resume_from_checkpoint", str(copy))
    fails_cleanly(args, finished, "saved with 4 processes, this run has 1", capsys)


def test_resume_with_another_model(tiny_model_dir, nli_files, finished, tmp_path, capsys):
    from transformers import AutoConfig, AutoTokenizer, BertForSequenceClassification

    other = tmp_path / "other-model"
    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.intermediate_size = 48
    BertForSequenceClassification(config).save_pretrained(other)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(other)
    args = tiny_args(
        other, nli_files, tmp_path / "out", "--resume_from_checkpoint", str(finished / "checkpoint-10")
    )
    fails_cleanly(args, finished, "was saved from a different model", capsys)


@pytest.mark.subprocess
def test_a_fresh_process_prints_one_line_and_no_traceback(good, finished, tmp_path, capsys):
    """From the command line: a data error found deep in loading (a malformed JSON line, which datasets
    also logs on its own: silenced, the run's line is the only one), and a refused flag."""
    bad = write(tmp_path / "m.jsonl", GOOD_ROW + '{"premise": broken\n')
    before = snapshot(finished)
    done = run_cli([*ENTRY, *with_flag(good, "--train_file", bad)])
    assert done.returncode == 2 and snapshot(finished) == before
    assert done.stderr.strip().splitlines() == [
        f"error: data file {bad}: line 2 is not valid JSON; fix it to hold one JSON object per line"
    ]
    assert cli([*good, "--lr", "1"]) == 2  # refused while parsing: in this process
    assert capsys.readouterr().err.strip() == "error: unknown argument(s) --lr 1; see --help for the flags"


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("config", "gpus"),
    [("single_gpu.yaml", "0"), ("multi_gpu.yaml", "0,1,2,3,4,5,6,7")],
    ids=["single", "multi"],
)
def test_gpu_config_on_a_machine_without_gpus(config, gpus, good, finished):
    """The environment `accelerate launch` derives from a GPU config (its gpu_ids as CUDA_VISIBLE_DEVICES),
    in processes forked warm (tests/warm_ranks.py): every rank refuses at once, in one line."""
    before = snapshot(finished)
    launch = [
        "--config_file",
        f"accelerate_configs/{config}",
        "--num_processes",
        "1" if "single" in config else "2",
    ]
    done = run_ranks(good, launch)
    lines = [line for line in done.stderr.strip().splitlines() if line.startswith("error: ")]
    # Exit 2 from every rank (each refuses on its own); 1 from the launcher.
    assert done.returncode == 1 and set(done.rank_returncodes) == {2}
    assert len(lines) == 1, done.stderr[-2000:]
    assert f"asks for GPU(s) {gpus} but this machine has no CUDA GPU" in lines[0]
    assert "Traceback" not in done.stderr and snapshot(finished) == before


@pytest.mark.subprocess
def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(
    tiny_model_dir, nli_files, finished, tmp_path
):
    """A real write error: RLIMIT_FSIZE makes the 8 MB optimizer file fail with EFBIG, as a full disk does."""
    out = tmp_path / "out"
    main(tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "10", "--checkpointing_steps", "5"))
    (out / "results.json").unlink()  # as if it had stopped after step 5
    shutil.rmtree(out / "checkpoint-10")
    kept = snapshot(out / "checkpoint-5")
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "10", "--checkpointing_steps", "5",
                     "--resume_from_checkpoint", "auto")  # fmt: skip
    expected = "writing checkpoint-10 failed"
    last = fails_cleanly_in_a_process(args, finished, expected, file_size_limit_kib=6000)
    assert "checkpoint-5 is intact" in last
    assert snapshot(out / "checkpoint-5") == kept
    assert not (out / "checkpoint-10").exists() and not list(out.glob(".checkpoint-*"))


@pytest.mark.parametrize(
    ("fault", "at", "flags", "expected"),
    [
        ("oom", 1, [], "out of memory at step 1 with --per_device_train_batch_size 16"),
        ("nan", 7, [], "lower --learning_rate or --max_grad_norm (now 1)"),
        # Clipping off: lowering --max_grad_norm 0 would do nothing; turning it on is what applies.
        ("nan", 7, ["--max_grad_norm", "0"], "clip the gradients with --max_grad_norm 1.0 (clipping is off)"),
    ],
)
def test_oom_and_nan_stop_with_advice(
    fault, at, flags, expected, tiny_model_dir, nli_files, finished, tmp_path, capsys
):
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--checkpointing_steps", "5", *flags)
    last = fails_cleanly(args, finished, expected, capsys, build=with_fault(fault, at), exit_code=1)
    if fault == "nan":
        assert "the loss became NaN or inf at step 7; the last good checkpoint is" in last
        assert "bf16 instead of fp16" not in last  # it ran fp32 on CPU
        assert ("or --max_grad_norm (now" in last) == (not flags)
        assert "checkpoint-5" in last
        assert (out / "checkpoint-5" / "trainer_state.json").exists() and not (out / "checkpoint-10").exists()


def test_ctrl_c_stops_cleanly_and_says_how_to_resume(tiny_model_dir, nli_files, tmp_path, capsys):
    """Ctrl-C at step 7 (sent by the run to itself, so always at that step): the step finishes, a
    checkpoint is written, one line says how to resume, exit 130."""
    out = tmp_path / "out"

    def build(*launch):
        run = setup(*launch)
        step = run.scheduler.step

        def step_then_ctrl_c():
            step()
            if run.state.global_step == 6:  # counted after this call returns: the 7th update
                os.kill(os.getpid(), signal.SIGINT)

        run.scheduler.step = step_then_ctrl_c
        return run

    code = cli(tiny_args(tiny_model_dir, nli_files, out, "--checkpointing_steps", "50"), build)
    err = capsys.readouterr().err
    assert code == 130
    assert err.strip().splitlines()[-1] == (
        f"stopped by SIGINT after step 7; checkpoint saved to {out / 'checkpoint-7'}; "
        "continue with the same command plus --resume_from_checkpoint auto"
    )
    assert (out / "checkpoint-7" / "trainer_state.json").exists() and not (out / "results.json").exists()


def test_ctrl_c_while_reading_the_data_is_one_line(
    tiny_model_dir, nli_files, finished, tmp_path, capsys, monkeypatch
):
    import finetune.families.sequence_classification.family

    def interrupted(config):
        os.kill(os.getpid(), signal.SIGINT)  # Python's own handler: KeyboardInterrupt, here
        raise AssertionError("not interrupted")

    monkeypatch.setattr(finetune.families.sequence_classification.family, "load_splits", interrupted)
    out = tmp_path / "out"
    last = fails_cleanly(tiny_args(tiny_model_dir, nli_files, out), finished, "", capsys, exit_code=130)
    assert last == (
        "error: interrupted by Ctrl-C; the run did not finish (no results.json); its checkpoints, if any, "
        "continue with --resume_from_checkpoint auto"
    )
    assert not out.exists()  # a start that did not finish leaves no folder it made (nor its lock)


@pytest.mark.subprocess
def test_ctrl_c_while_the_script_starts_is_one_line(good, tmp_path):
    """Ctrl-C during the seconds of imports (torch, transformers), before `cli` runs."""
    import subprocess
    import time

    process = subprocess.Popen(
        [*ENTRY, *with_flag(good, "--output_dir", str(tmp_path / "out"))],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(0.5)  # importing torch alone takes longer
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("error: interrupted by Ctrl-C")


@pytest.mark.parametrize("spelling", [["--debug", "true"], ["--debug=true"], ["--debug"], ["yaml"]])
def test_debug_shows_the_traceback_and_keeps_the_exit_code(spelling, good, tmp_path, capsys):
    if spelling == ["yaml"]:
        spelling = ["--config", write(tmp_path / "d.yaml", "debug: true\n")]
    # The second is refused after parsing.
    for flag, value in (("--num_train_epochs", "0"), ("--metric_for_best_model", "eval_nope")):
        capsys.readouterr()
        assert cli([*with_flag(good, flag, value), *spelling]) == 2  # as without --debug, not Python's 1
        err = capsys.readouterr().err.strip().splitlines()
        assert "Traceback (most recent call last):" in err  # --debug keeps the libraries' chatter too
        assert err[-2].startswith(f"finetune.errors.ConfigError: {flag}")
        assert err[-1].startswith(f"error: {flag}")


@pytest.mark.subprocess
def test_a_second_ctrl_c_stops_at_once(tiny_model_dir, nli_files, tmp_path):
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--checkpointing_steps", "5")
    done = run_warm(args, script="tests/probes/double_ctrl_c.py", env={"AT": "7"})
    assert done.returncode == 130, done.stderr[-2000:]
    assert (
        done.stderr.strip().splitlines()[-1] == "error: stopped by a second Ctrl-C; no new checkpoint written"
    )
    assert "Traceback" not in done.stderr
    # Stopped inside step 7: checkpoint-5 is the last one, and no step after it was saved.
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-5"]
    assert not (out / "results.json").exists()


def test_mixed_label_types_in_jsonl_read_like_a_csv(good, tmp_path):
    """Labels 0, 1 and "neutral" in one JSONL column: JSON gives them no single type; they count."""
    names = ["entailment", "neutral", "contradiction"]
    rows = [
        {"premise": f"p{i}", "hypothesis": "h", "label": names[i % 3] if i % 2 else i % 3} for i in range(30)
    ]
    mixed = write(tmp_path / "mixed.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    results = main([*with_flag(good, "--train_file", mixed), "--max_train_steps", "1"])
    assert results["global_step"] == 1


def test_damaged_model_folders(tiny_model_dir, good, finished, tmp_path, capsys):
    import shutil

    truncated = tmp_path / "truncated"
    shutil.copytree(tiny_model_dir, truncated)
    weights_file = truncated / "model.safetensors"
    weights_file.write_bytes(weights_file.read_bytes()[:5000])
    last = fails_cleanly(with_flag(good, "--model_name_or_path", str(truncated)), finished, "", capsys)
    assert last.startswith(f"error: --model_name_or_path {truncated}: a weights file there is damaged")

    no_tokenizer = tmp_path / "no-tokenizer"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_model_dir / name, no_tokenizer / name)
    last = fails_cleanly(with_flag(good, "--model_name_or_path", str(no_tokenizer)), finished, "", capsys)
    assert last == (
        f"error: --model_name_or_path {no_tokenizer}: no tokenizer files there (tokenizer.json, vocab.txt, "
        "...); save the model's tokenizer beside it with tokenizer.save_pretrained"
    )


def test_single_class_training_data(good, finished, tmp_path, capsys):
    rows = "".join(json.dumps({"text": f"t{i}", "tag": "spam"}) + "\n" for i in range(8))
    one_class = write(tmp_path / "one.jsonl", rows)
    args = [*with_flag(with_flag(good, "--train_file", one_class), "--validation_file", one_class),
            "--task_name", "custom", "--text_columns", "text", "--label_column", "tag"]  # fmt: skip
    last = fails_cleanly(args, finished, "", capsys)
    assert last == (
        f"error: --train_file {one_class}: every row has the label 'spam'; a classifier needs at least two "
        "classes in its training data"
    )


def test_an_output_file_that_cannot_be_written(good, finished, tmp_path, capsys):
    """results.json that can't be written (a folder of that name, made once the run has started: root
    ignores read-only bits)."""
    out = tmp_path / "new"

    def build(*launch):
        run = setup(*launch)
        (out / "results.json").mkdir()
        return run

    last = fails_cleanly(good, finished, "", capsys, build=build, exit_code=1)
    assert last.startswith(f"error: writing results.json in {out} failed (Is a directory)")


@pytest.mark.subprocess
def test_disk_full_while_writing_the_best_model(tiny_model_dir, nli_files, finished, tmp_path):
    """RLIMIT_FSIZE of 1 MB: the first evaluation's best-model export fails as on a full disk."""
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "3")
    last = fails_cleanly_in_a_process(args, finished, "", file_size_limit_kib=1000)
    assert last.startswith(f"error: writing the best model in {out} failed (File too large)")

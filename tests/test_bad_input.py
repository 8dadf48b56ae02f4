"""Every common mistake: one line naming the flag or file and the fix, a non-zero exit, nothing lost.

Each case runs the real entry point in a subprocess, next to an output folder holding a finished
run, and checks that folder is byte-for-byte unchanged afterwards.
"""

import json
import os
import signal
import subprocess
import time

import pytest

from tests.conftest import PYTHON, REPO, run_cli, tiny_args

ENTRY = [PYTHON, "finetune/mnli.py"]


@pytest.fixture(scope="module")
def finished(tiny_model_dir, nli_files, tmp_path_factory):
    """A finished run with checkpoints: what every bad invocation must leave alone."""
    out = tmp_path_factory.mktemp("finished") / "out"
    done = run_cli([*ENTRY, *tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "10",
                                       "--checkpointing_steps", "5")])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def fails_cleanly(args, finished, expected: str, env=None, launcher_traceback=False) -> str:
    """The last line of stderr is finetune's `error: ...`; no traceback; `finished` untouched.

    With `launcher_traceback`, `accelerate launch` adds its own report of the failed child after
    that line (it always does); finetune's line must still be there, and no traceback from finetune.
    """
    before = snapshot(finished)
    done = run_cli(args, env=env)
    assert done.returncode != 0
    lines = [line for line in done.stderr.strip().splitlines() if line.startswith("error: ")]
    assert lines and expected in lines[-1], done.stderr[-2000:]
    if launcher_traceback:
        assert "finetune/" not in "".join(
            x for x in done.stderr.splitlines() if x.strip().startswith("File ")
        )
    else:
        assert done.stderr.strip().splitlines()[-1] == lines[-1] and "Traceback" not in done.stderr
    assert snapshot(finished) == before
    return lines[-1]


@pytest.fixture
def good(tiny_model_dir, nli_files, tmp_path):
    """Working flags for a fresh output folder; each case spoils one thing."""
    return tiny_args(tiny_model_dir, nli_files, tmp_path / "new")


def with_flag(args, flag, value):
    args = list(args)
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    return args


def write(path, text):
    path.write_text(text)
    return str(path)


CASES = {
    "unknown flag": (lambda a, t: [*a, "--learning_rte", "1e-4"], "unknown argument(s) --learning_rte 1e-4"),
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
        lambda a, t: with_flag(a, "--train_file", str(t / "d.parquet")),
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
        "(unset HF_HUB_OFFLINE)",
    ),
    "metric that the run does not measure": (
        lambda a, t: with_flag(a, "--metric_for_best_model", "eval_mismatched_accuracy"),
        "this run measures eval_matched_accuracy",
    ),
    "model path that does not exist": (
        lambda a, t: with_flag(a, "--model_name_or_path", str(t / "no-model")),
        "HF_HUB_OFFLINE",
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
    "output_dir is a file": (
        lambda a, t: with_flag(a, "--output_dir", write(t / "a-file", "x")),
        "--output_dir",
    ),
    "output_dir not writable": (
        lambda a, t: with_flag(a, "--output_dir", "/proc/finetune-out"),
        "--output_dir",
    ),
    "checkpointing_steps neither int nor epoch": (
        lambda a, t: with_flag(a, "--checkpointing_steps", "often"),
        "--checkpointing_steps must be a positive integer or 'epoch'",
    ),
    "resume from nothing": (
        lambda a, t: with_flag(a, "--resume_from_checkpoint", str(t / "nothing")),
        "not a complete checkpoint",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_fails_in_one_line(case, good, finished, tmp_path):
    spoil, expected = CASES[case]
    fails_cleanly([*ENTRY, *spoil(good, tmp_path)], finished, expected)


def test_finished_output_dir_is_refused_and_kept(tiny_model_dir, nli_files, finished):
    args = tiny_args(tiny_model_dir, nli_files, finished)
    fails_cleanly(
        [*ENTRY, *args], finished, "holds a finished run (results.json); pass --overwrite_output_dir"
    )


def test_resume_from_a_partial_checkpoint(tiny_model_dir, nli_files, finished, tmp_path):
    partial = tmp_path / ".checkpoint-7.partial"
    partial.mkdir()
    args = tiny_args(tiny_model_dir, nli_files, tmp_path / "out", "--resume_from_checkpoint", str(partial))
    fails_cleanly([*ENTRY, *args], finished, "not a complete checkpoint (no trainer_state.json)")


def test_resume_with_another_number_of_processes(tiny_model_dir, nli_files, finished, tmp_path):
    checkpoint = finished / "checkpoint-10"
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    copy = tmp_path / "checkpoint-10"
    copy.mkdir()
    for f in checkpoint.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    (copy / "trainer_state.json").write_text(json.dumps({**state, "world_size": 4}))
    args = tiny_args(tiny_model_dir, nli_files, tmp_path / "out", "--resume_from_checkpoint", str(copy))
    fails_cleanly([*ENTRY, *args], finished, "saved with 4 processes, this run has 1")


def test_resume_with_another_model(tiny_model_dir, nli_files, finished, tmp_path):
    from transformers import AutoConfig, AutoTokenizer, BertForSequenceClassification

    other = tmp_path / "other-model"
    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.intermediate_size = 48
    BertForSequenceClassification(config).save_pretrained(other)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(other)
    args = tiny_args(
        other, nli_files, tmp_path / "out", "--resume_from_checkpoint", str(finished / "checkpoint-10")
    )
    fails_cleanly([*ENTRY, *args], finished, "was saved from a different model")


@pytest.mark.parametrize(
    ("config", "gpus"),
    [("single_gpu.yaml", "0"), ("multi_gpu.yaml", "0,1,2,3,4,5,6,7")],
    ids=["single", "multi"],
)
def test_gpu_config_on_a_machine_without_gpus(config, gpus, good, finished):
    launch = [os.path.join(os.path.dirname(PYTHON), "accelerate"), "launch", "--config_file",
              f"accelerate_configs/{config}", "--num_processes", "1" if config == "single_gpu.yaml" else "2",
              "finetune/mnli.py"]  # fmt: skip
    expected = f"asks for GPU(s) {gpus} but this machine has no CUDA GPU"
    fails_cleanly([*launch, *good], finished, expected, launcher_traceback=True)


def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(
    tiny_model_dir, nli_files, finished, tmp_path
):
    """A real write error: RLIMIT_FSIZE makes the 8 MB optimizer file fail with EFBIG, as a full disk does."""
    out = tmp_path / "out"
    first = run_cli([*ENTRY, *tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "5",
                                        "--checkpointing_steps", "5")])  # fmt: skip
    assert first.returncode == 0
    (out / "results.json").unlink()
    kept = snapshot(out / "checkpoint-5")
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "10", "--checkpointing_steps", "5",
                     "--resume_from_checkpoint", "auto")  # fmt: skip
    limited = ["bash", "-c", 'ulimit -f 6000 && exec "$@"', "limited", *ENTRY, *args]
    last = fails_cleanly(limited, finished, "writing checkpoint-10 failed")
    assert "checkpoint-5 is intact" in last
    assert snapshot(out / "checkpoint-5") == kept
    assert not (out / "checkpoint-10").exists() and not list(out.glob(".checkpoint-*"))


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("oom", "out of memory at step 1 with --per_device_train_batch_size 16"),
        ("nan", "the loss became NaN or inf at step 7; the last good checkpoint is"),
    ],
)
def test_oom_and_nan_stop_with_advice(fault, expected, tiny_model_dir, nli_files, finished, tmp_path):
    out = tmp_path / "out"
    at = {"oom": "1", "nan": "7"}[fault]
    args = tiny_args(tiny_model_dir, nli_files, out, "--checkpointing_steps", "5")
    last = fails_cleanly(
        [PYTHON, "tests/probes/inject_fault.py", *args], finished, expected, env={"FAULT": fault, "AT": at}
    )
    if fault == "nan":
        assert "checkpoint-5" in last
        assert (out / "checkpoint-5" / "trainer_state.json").exists() and not (out / "checkpoint-10").exists()


def test_ctrl_c_stops_cleanly_and_says_how_to_resume(tiny_model_dir, nli_files, tmp_path):
    out = tmp_path / "out"
    args = tiny_args(
        tiny_model_dir, nli_files, out, "--num_train_epochs", "20", "--checkpointing_steps", "50"
    )
    log = tmp_path / "log"
    with log.open("w") as f:
        process = subprocess.Popen([*ENTRY, *args], cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not (out / "checkpoint-50").exists():
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 130
    text = log.read_text()
    assert "stopped by SIGINT after step" in text and "--resume_from_checkpoint auto" in text
    assert "Traceback" not in text


def test_debug_shows_the_traceback(good):
    done = run_cli([*ENTRY, *with_flag(good, "--num_train_epochs", "0"), "--debug", "true"])
    assert done.returncode != 0
    assert (
        "Traceback" in done.stderr
        and "ConfigError: --num_train_epochs must be a positive integer" in done.stderr
    )

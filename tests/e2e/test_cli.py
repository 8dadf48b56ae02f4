"""The entry point as users start it: plain python, accelerate launch, torchrun; real processes."""

import json
import os

import pytest

from tests.helpers import PYTHON, run_cli, tiny_args

BIN = os.path.dirname(PYTHON)
pytestmark = pytest.mark.subprocess


def results_of(output_dir):
    return json.loads((output_dir / "results.json").read_text())


def test_accelerate_launch_with_the_cpu_config_runs_the_plain_python_entry_point(
    tiny_model_dir, nli_files, tmp_path
):
    """`accelerate launch --config_file accelerate_configs/cpu.yaml finetune/mnli.py`: its simple launcher
    runs `python finetune/mnli.py` (the script's folder first on sys.path), so one run is both entry
    points (each had a run of its own); a run without accelerate's environment is `python -m finetune`
    (tests/e2e/idle_runs.py) and every in-process main()."""
    out = tmp_path / "out"
    launcher = [os.path.join(BIN, "accelerate"), "launch", "--config_file", "accelerate_configs/cpu.yaml"]
    done = run_cli(
        [*launcher, "finetune/mnli.py", *tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "4")]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (results_of(out)["world_size"], results_of(out)["global_step"]) == (1, 4)
    assert f"train_config.json: {out.resolve()}" in done.stdout  # says where everything went
    # The start-up summary names every speed path, resolved, so a user sees what really ran.
    summary = next(line for line in done.stdout.splitlines() if line.startswith("world_size="))
    for path in ("dropout_kernel=packed", "padding_free=", "keep_freed_memory=false", "torch_compile=false",
                 "group_by_length=true", "fused_adamw=true"):  # fmt: skip
        assert path in summary, summary


def test_demo_data_module_is_runnable(tmp_path):
    done = run_cli(
        [PYTHON, "-m", "finetune.demo_data", str(tmp_path), "--n_train", "30", "--n_validation", "9"]
    )
    assert done.returncode == 0, done.stderr
    lines = (tmp_path / "train.jsonl").read_text().splitlines()
    assert len(lines) == 30 and {json.loads(x)["label"] for x in lines} == {0, 1, 2}


def test_help_and_a_bad_flag_answer_before_torch_is_imported(tmp_path):
    """`--help` and a flag refused while parsing take about a second: torch, transformers' models and
    the run are imported only once the flags parsed (not the 6-7 s of imports a run needs). The same for
    the sweep's command line, and its YAML file."""
    probe = (
        "import sys; from finetune.cli import cli; from finetune.studies.sweep_command import sweep_cli\n"
        "code = cli(['--learning_rate', '-1', '--output_dir', sys.argv[1]])\n"
        "try:\n    cli(['--help'])\nexcept SystemExit as exit:\n    code = (code, exit.code)\n"
        "code += (sweep_cli(['--sweep_config', sys.argv[1] + '.yaml', '--output_dir', sys.argv[1]]),)\n"
        "try:\n    sweep_cli(['--help'])\nexcept SystemExit as exit:\n    code += (exit.code,)\n"
        "heavy = ('torch', 'finetune.run', 'accelerate', 'optuna')\n"
        "print(code, sorted(m for m in heavy if m in sys.modules))"
    )
    done = run_cli([PYTHON, "-c", probe, str(tmp_path / "out")])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "(2, 0, 2, 0) []"
    assert "--sweep_config SWEEP.yaml" in done.stdout and "--rerun_best_with_seeds" in done.stdout
    said = done.stderr.strip().splitlines()
    assert said[0] == "error: --learning_rate must be > 0, got -1.0" and len(said) == 2
    assert said[1].startswith(f"error: --sweep_config {tmp_path / 'out'}.yaml: cannot read it"), said
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("name", "said", "code"), [("INT", "interrupted by Ctrl-C", 130), ("TERM", "stopped by SIGTERM", 143)]
)
def test_a_stop_signal_while_the_run_imports_exits_at_once_in_one_line(name, said, code):
    """Once the flags parsed, the run's modules import (torch, transformers: seconds): a Ctrl-C raised
    inside those imports could abort the process from a C++ extension or be swallowed, and the run went
    on. There, a stop signal ends the process at once with one line (finetune.interrupt)."""
    probe = (
        "import os, signal, time; from finetune.interrupt import exit_at_once_while_importing\n"
        f"with exit_at_once_while_importing():\n    os.kill(os.getpid(), signal.SIG{name}); time.sleep(10)\n"
        "print('went on')"
    )
    done = run_cli([PYTHON, "-c", probe])
    assert (done.returncode, done.stdout) == (code, "")
    assert done.stderr.strip().splitlines() == [f"error: {said} while starting; nothing was written"]

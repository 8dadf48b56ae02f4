"""W&B that can't work online: no key, a malformed key, a server that does not answer. The run goes on
offline with one line saying why, starts within seconds, and writes no secret into its folder."""

import socket
import time

import pytest

from finetune.mnli import main
from tests.helpers import reset_accelerate, tiny_args

FAKE_KEY = "0123456789abcdef0123456789abcdef01234567"  # the format of a real one: 40 characters
FAKE_HF_TOKEN = "hf_NotARealTokenButShapedLikeOne0123456789"


@pytest.fixture
def silent_server():
    """A loopback port that accepts connections and never answers: a network that hangs."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


def run_with_wandb(tiny_model_dir, nli_files, out):
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "2")
    args[args.index("--report_to") + 1] = "wandb"
    return main(args)


@pytest.mark.parametrize(
    ("key", "server", "reason"),
    [
        (None, False, "no API key configured"),
        ("abc", False, "the API key is not valid (API key must have 40+ characters, has 3)"),
        (FAKE_KEY, True, "its server did not answer within 3 s"),
    ],
    ids=["no key", "malformed key", "silent server"],
)
def test_wandb_falls_back_to_offline_with_one_line(
    key, server, reason, wandb_env, silent_server, tiny_model_dir, nli_files, tmp_path, capsys
):
    if key is not None:
        wandb_env.setenv("WANDB_API_KEY", key)
    wandb_env.setenv("HF_TOKEN", FAKE_HF_TOKEN)
    if server:
        wandb_env.setenv("WANDB_BASE_URL", silent_server)
    out = tmp_path / "out"
    started = time.perf_counter()
    results = run_with_wandb(tiny_model_dir, nli_files, out)
    assert time.perf_counter() - started < 60  # the run, not a 100 s wait for the network
    assert results["global_step"] == 2
    assert f"W&B: {reason}, logging offline to <output_dir>/wandb" in capsys.readouterr().out
    assert list((out / "wandb").glob("offline-run-*/*.wandb"))
    # No secret from the environment in any file the run wrote (config, logs, card, W&B's files).
    for path in out.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert key in (None, "abc") or key.encode() not in data, path
            assert FAKE_HF_TOKEN.encode() not in data, path


def test_run_name_names_the_wandb_run(wandb_env, tmp_path):
    from accelerate import Accelerator

    from finetune.output.tracking import start_trackers

    wandb_env.setenv("WANDB_MODE", "offline")
    accelerator = Accelerator(cpu=True, log_with="wandb")
    try:
        start_trackers(accelerator, "finetune-test", {"seed": 1}, tmp_path, None, run_name="tiny-bert-nli")
        assert accelerator.get_tracker("wandb", unwrap=True).name == "tiny-bert-nli"
    finally:
        accelerator.end_training()
        reset_accelerate()


def test_each_sweep_trial_is_a_wandb_run_in_the_studys_group(wandb_env, tiny_model_dir, nli_files, tmp_path):
    """--report_to wandb in a sweep: one W&B run per trial (`trial-<n>`), all in the study's group."""
    from finetune.run import setup
    from finetune.studies.sweep_command import sweep_main

    wandb_env.setenv("WANDB_MODE", "offline")
    wandb_env.delenv("WANDB_RUN_GROUP", raising=False)  # the sweep sets it: undone after the test
    seen = []

    def build(args, identity):
        run = setup(args, identity)
        tracker = run.accelerator.get_tracker("wandb", unwrap=True)
        seen.append((tracker.name, tracker.group))
        return run

    sweep = tmp_path / "sweep.yaml"
    grid = "  learning_rate: {type: categorical, choices: [1.0e-3, 3.0e-3]}\n"
    sweep.write_text(f"n_trials: 2\nsampler: grid\nsearch_space:\n{grid}")
    args = tiny_args(tiny_model_dir, nli_files, tmp_path / "study", "--max_train_steps", "2")
    args[args.index("--report_to") + 1] = "wandb"
    sweep_main(["--sweep_config", str(sweep), "--study_name", "lr-study", *args], build)
    reset_accelerate()
    assert seen == [("trial-0", "lr-study"), ("trial-1", "lr-study")]

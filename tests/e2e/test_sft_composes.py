"""Generative fine-tuning composes with the rest, family-blind: a SIGKILLed 2-process run resumes
bitwise; seeds summarise eval_loss (lower is better); a sweep minimises eval_loss; the world check, the
lock and a finished run's relaunch hold as for classifiers; bad settings are one line."""

from __future__ import annotations

import json

import pytest
import torch

from finetune.errors import ConfigError
from finetune.mnli import main
from finetune.studies.sweep import sweep_main
from tests.e2e.test_sft import chat, sft_args  # noqa: F401  (chat: the module's fixture)
from tests.helpers import reset_accelerate, weights
from tests.warm_ranks import run_ranks

STEPS = ("--max_train_steps", "6", "--per_device_train_batch_size", "2", "--learning_rate", "3e-3",
         "--checkpointing_steps", "2", "--logging_steps", "1", "--eval_strategy", "steps",
         "--eval_steps", "3")  # fmt: skip


def test_a_killed_two_process_run_resumes_bitwise(chat, tmp_path):  # noqa: F811
    """SIGKILL at step 5 (after checkpoint-4), then --resume_from_checkpoint auto: the same weights, bit
    for bit, as the run never killed; every rank really ran (world size 2)."""
    unbroken, killed = tmp_path / "unbroken", tmp_path / "killed"
    done = run_ranks(sft_args(chat, unbroken, *STEPS))
    assert done.returncode == 0, done.stderr[-3000:]
    env = {"AT_STEP": "5", "SIGNAL": "KILL", "RANKS": "0,1"}
    died = run_ranks(sft_args(chat, killed, *STEPS), script="tests/probes/signal_at_step.py", env=env)
    assert died.returncode != 0 and not (killed / "results.json").exists()
    resumed = run_ranks(sft_args(chat, killed, *STEPS, "--resume_from_checkpoint", "auto"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    results = json.loads((killed / "results.json").read_text())
    assert results["world_size"] == 2 and results["global_step"] == 6
    a, b = weights(unbroken), weights(killed)
    assert [name for name in a if not torch.equal(a[name], b[name])] == []


def test_seeds_summarise_eval_loss_lower_is_better(chat, tmp_path):  # noqa: F811
    out = tmp_path / "study"
    summary = main(sft_args(chat, out, *STEPS, "--seeds", "1,2"))
    reset_accelerate()
    assert summary["metric_for_best_model"] == "eval_loss" and summary["greater_is_better"] is False
    losses = {s: json.loads((out / f"seed-{s}" / "results.json").read_text())["eval_loss"] for s in (1, 2)}
    assert summary["best"]["value"] == min(losses.values())
    assert summary["metrics"]["eval_perplexity"]["n"] == 2


def test_a_sweep_minimises_eval_loss(chat, tmp_path):  # noqa: F811
    config = tmp_path / "sweep.yaml"
    config.write_text("n_trials: 2\nsampler: grid\nsearch_space:\n  learning_rate: {type: categorical, "
                      "choices: [1.0e-5, 3.0e-3]}\n")  # fmt: skip
    out = tmp_path / "sweep"
    sweep_main(["--sweep_config", str(config), *sft_args(chat, out, *STEPS)])
    report = json.loads((out / "sweep.json").read_text())
    assert report["direction"] == "minimize" and report["metric"] == "eval_loss"
    finished = [t for t in report["trials"] if t["state"] == "COMPLETE"]
    assert len(finished) == 2
    assert report["best_trial"]["value"] == min(t["value"] for t in finished)


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (("--task_name", "sst2"), "--task_name"),
        (("--calibrate", "temperature"), "--calibrate"),
        (("--long_documents", "sliding_window"), "--long_documents"),
        (("--chat_template", "no_such.jinja"), "--chat_template"),
        (("--gguf_file", "no_such.gguf"), "--gguf_file"),
    ],
)
def test_settings_a_causal_lm_cannot_honour_are_one_line(chat, tmp_path, extra, flag):  # noqa: F811
    with pytest.raises(ConfigError) as refused:
        main(sft_args(chat, tmp_path / "out", *extra))
    assert refused.value.flag == flag and "\n" not in str(refused.value)
    assert not (tmp_path / "out").exists()

"""The run's identity and its flags in real runs: the flags as given are never changed, and a finished
LoRA run relaunched with other targets is another run (issue 31). Without a run: tests/unit/."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest

from finetune.config.identity import run_identity
from finetune.config.parser import parse_config
from finetune.mnli import cli, main
from tests.helpers import reset_accelerate, retrained_in_place, tiny_args


def test_flags_are_never_changed_by_the_run(tiny_model_dir, nli_files, tmp_path):
    """What the user asked stays as parsed; train_config.json records it beside what the run resolved."""
    args = parse_config(tiny_args(tiny_model_dir, nli_files, tmp_path / "out", "--max_train_steps", "2"))
    asked = dataclasses.asdict(args)
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.learning_rate = 1.0
    from finetune.run import run_config

    run_config(args)
    assert dataclasses.asdict(args) == asked
    record = json.loads((tmp_path / "out" / "train_config.json").read_text())
    assert record["args"] == json.loads(json.dumps(asked))
    assert record["args"]["metric_for_best_model"] is None and record["args"]["dropout_kernel"] == "auto"
    assert (
        record["resolved"]["metric_for_best_model"]
        == record["metric_for_best_model"]
        == ("eval_matched_accuracy")
    )
    assert record["resolved"]["dropout_kernel"] == record["dropout_kernel"] == "packed"  # auto, on CPU
    assert record["identity"] == json.loads(json.dumps(run_identity(args, 1)))


def test_a_finished_lora_run_relaunched_with_other_targets_is_refused(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    """Issue 31's case: it was taken as the same run, returned the old results and trained nothing."""
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--use_peft", "--max_train_steps", "4")
    args += ["--checkpointing_steps", "2", "--eval_strategy", "no"]
    main(args)
    reset_accelerate()
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    relaunched = [*args, "--resume_from_checkpoint", "auto"]
    assert cli([*relaunched, "--lora_target_modules", "query", "value"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--lora_target_modules all-linear; this run has --lora_target_modules query value" in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    # The same flags again: the finished run, unchanged (exit 0).
    assert cli(relaunched) == 0
    assert "nothing to resume" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert os.path.isdir(out / "checkpoint-4")


def test_a_resume_after_the_base_was_retrained_in_place_is_refused(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    """The same config, file names and sizes, other weights: resuming would mix two models' updates.
    Refused naming the file, the run's folder untouched."""
    base = shutil.copytree(tiny_model_dir, tmp_path / "base")
    out = tmp_path / "out"
    args = tiny_args(base, nli_files, out, "--max_train_steps", "4", "--checkpointing_steps", "2")
    main(args)
    reset_accelerate()
    (out / "results.json").unlink()  # as if stopped after its last checkpoint
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    retrained_in_place(base)
    assert cli([*args, "--resume_from_checkpoint", "auto"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"checkpoint-4 was saved from the model in {base.resolve()} as it was then (model file " in err
    assert "model.safetensors" in err and "resume with the model as it was, or start a new run" in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before

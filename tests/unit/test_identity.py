"""What makes two launches the same run (finetune/config/identity.py): every flag is in it or left out
with a reason; resume and the finished-run check compare it. Real runs: tests/e2e/test_identity.py."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from finetune.config.identity import (
    DERIVED,
    IDENTITY_FLAGS,
    LEFT_OUT,
    differences,
    refuse_other_run,
    run_identity,
)
from finetune.config.parser import parse_config
from finetune.config.train_config import TrainConfig
from finetune.errors import ConfigError
from finetune.output.prerun import finished_run
from tests.helpers import refused, retrained_in_place, tiny_args, with_flag


def identity_of(argv: list[str], world_size: int = 1) -> dict:
    return run_identity(parse_config(argv), world_size)


def test_every_flag_is_in_the_identity_or_left_out_with_a_reason():
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(IDENTITY_FLAGS) | set(LEFT_OUT) == fields
    assert not set(IDENTITY_FLAGS) & set(LEFT_OUT)
    assert len(IDENTITY_FLAGS) == len(set(IDENTITY_FLAGS))
    assert all(reason.strip() for reason in LEFT_OUT.values())
    assert not set(DERIVED) & fields  # the derived entries can't shadow a flag


@pytest.mark.parametrize(
    "changed",
    [
        ["--lora_target_modules", "query", "value"],
        ["--lora_modules_to_save", "classifier", "pooler"],
        ["--label_separator", ";"],
        ["--class_weights", "1,50,1"],
        ["--early_stopping_patience", "2"],
        ["--multi_label_threshold", "0.3"],
        ["--max_eval_samples", "100"],
    ],
)
def test_a_changed_setting_is_another_run(changed, tiny_model_dir, nli_files, tmp_path):
    args = tiny_args(tiny_model_dir, nli_files, tmp_path / "out", "--use_peft")
    then, now = identity_of(args), identity_of([*args, *changed])
    assert differences(then, now) == [changed[0].removeprefix("--")]


@pytest.mark.parametrize(
    "changed",
    [
        ["--per_device_eval_batch_size", "8"],
        ["--padding_free", "false"],
        ["--dropout_kernel", "torch"],
        ["--logging_steps", "7"],
        ["--checkpointing_steps", "3"],
        ["--report_to", "tensorboard"],
        ["--do_predict", "--test_file", "x.csv"],
    ],
)
def test_speed_paths_and_outputs_are_the_same_run(changed, tiny_model_dir, nli_files, tmp_path):
    args = tiny_args(tiny_model_dir, nli_files, tmp_path / "out")
    assert differences(identity_of(args), identity_of([*args, *changed])) == []


def test_the_data_is_compared_by_content_not_by_path(tiny_model_dir, nli_files, tmp_path):
    args = tiny_args(tiny_model_dir, nli_files, tmp_path / "out")
    moved = shutil.copy(nli_files["train"], tmp_path / "moved.jsonl")
    assert differences(identity_of(args), identity_of(with_flag(args, "--train_file", str(moved)))) == []
    # The same number of rows, reversed: another run (issue 32, case 4).
    rows = nli_files["train"].read_text().splitlines(keepends=True)
    edited = tmp_path / "edited.jsonl"
    edited.write_text("".join(reversed(rows)))
    assert differences(identity_of(args), identity_of(with_flag(args, "--train_file", str(edited)))) == [
        "training_data"
    ]


def test_a_model_named_by_another_path_is_the_same_model(tiny_model_dir, nli_files, tmp_path, monkeypatch):
    monkeypatch.chdir(tiny_model_dir.parent)
    args = tiny_args(tiny_model_dir, nli_files, tmp_path / "out")
    relative = with_flag(args, "--model_name_or_path", tiny_model_dir.name)
    assert differences(identity_of(args), identity_of(relative)) == []
    other = shutil.copytree(tiny_model_dir, tmp_path / "other")
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    assert differences(identity_of(args), identity_of(with_flag(args, "--model_name_or_path", str(other))))


def test_the_refusal_names_the_flags_and_the_fix(tiny_model_dir, nli_files, tmp_path):
    args = tiny_args(tiny_model_dir, nli_files, tmp_path / "out", "--use_peft")
    saved = identity_of(args)
    with pytest.raises(ConfigError) as refused:
        refuse_other_run(saved, identity_of([*args, "--use_peft", "false"]), tmp_path / "checkpoint-4")
    assert "with --use_peft true; this run has --use_peft false" in str(refused.value)
    assert refused.value.flag == "--resume_from_checkpoint" and "--overwrite_output_dir" in refused.value.fix
    with pytest.raises(ConfigError, match="saved with 1 processes, this run has 2") as refused:
        refuse_other_run(saved, identity_of(args, world_size=2), tmp_path / "checkpoint-4")
    assert refused.value.fix == "launch 1 processes"
    other = {**saved, "model": "elsewhere (files 0123456789ab)"}
    with pytest.raises(ConfigError, match="was saved from a different model: elsewhere") as refused:
        refuse_other_run(other, saved, tmp_path / "checkpoint-4")
    assert refused.value.flag == "--model_name_or_path"
    with pytest.raises(ConfigError, match="older finetune"):
        refuse_other_run(None, saved, tmp_path / "checkpoint-4")


def test_a_run_recorded_before_a_flag_existed_is_refused_naming_that_flag(
    tiny_model_dir, nli_files, tmp_path
):
    """A checkpoint whose identity predates --window_loss_weighting (ADDED_LATER: window) resumed by a
    sliding-window run (document): one line naming both values, not a KeyError."""
    windows = ["--long_documents", "sliding_window", "--doc_stride", "16"]
    now = identity_of(tiny_args(tiny_model_dir, nli_files, tmp_path / "out", *windows))
    older = {k: v for k, v in now.items() if k not in ("window_loss_weighting", "calibrate")}
    with refused("--resume_from_checkpoint", "--overwrite_output_dir") as error:
        refuse_other_run(older, now, tmp_path / "checkpoint-4")
    assert "with --window_loss_weighting window; this run has --window_loss_weighting document" in str(
        error.value
    )


def test_a_finished_run_is_found_only_by_its_own_identity(tiny_model_dir, nli_files, tmp_path):
    """In process, on a folder that holds a finished run's two records."""
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--resume_from_checkpoint", "auto")
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"global_step": 9}))
    (out / "train_config.json").write_text(json.dumps({"identity": identity_of(args)}))
    predict = ["--do_predict", "--test_file", "x.csv"]
    for same in ([], predict, ["--report_to", "tensorboard"]):
        config = parse_config([*args, *same])
        assert finished_run(config, run_identity(config, 1)) == {"global_step": 9}
    for other in (["--label_separator", ";"], ["--class_weights", "balanced"], ["--seed", "1"]):
        config = parse_config([*args, *other])
        assert finished_run(config, run_identity(config, 1)) is None
    # A causal LM's: without --predict_with_generate the length of a generation sets only the predictions'.
    lm = [*args, "--task_type", "causal_lm"]
    (out / "train_config.json").write_text(json.dumps({"identity": identity_of(lm)}))
    for same in ([], predict, [*predict, "--generation_max_new_tokens", "32"]):
        config = parse_config([*lm, *same])
        assert finished_run(config, run_identity(config, 1)) == {"global_step": 9}


def test_generation_length_is_the_same_run_unless_evaluations_generate(tiny_model_dir, nli_files, tmp_path):
    """--generation_max_new_tokens decides the run only through --predict_with_generate's evaluations
    (their eval_exact_match can pick the model); otherwise only the predictions' length."""
    args = tiny_args(tiny_model_dir, nli_files, tmp_path / "out", "--task_type", "causal_lm")
    assert differences(identity_of(args), identity_of([*args, "--generation_max_new_tokens", "32"])) == []
    generating = [*args, "--predict_with_generate"]
    assert differences(
        identity_of(generating), identity_of([*generating, "--generation_max_new_tokens", "32"])
    ) == ["generation_max_new_tokens"]
    # A run recorded with it (before it was left out) is still the same run.
    recorded = {**identity_of(args), "generation_max_new_tokens": 128}
    assert differences(recorded, identity_of([*args, "--generation_max_new_tokens", "32"])) == []


def test_a_finished_run_in_the_folder_is_refused_naming_what_differs(tiny_model_dir, nli_files, tmp_path):
    """Relaunched without resuming it: the refusal names the flags (old -> new), since following
    --overwrite_output_dir deletes that run's model and trains again."""
    from finetune.output.prerun import check_output_dir

    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out)
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"global_step": 9}))
    (out / "train_config.json").write_text(json.dumps({"identity": identity_of(args)}))
    config = parse_config([*args, "--warmup_steps", "3"])
    with refused("--warmup_steps", "--overwrite_output_dir") as error:
        check_output_dir(config, False, run_identity(config, 1))
    assert "with --warmup_steps 0; this run has --warmup_steps 3" in str(error.value)
    with refused("--output_dir", "--overwrite_output_dir") as error:
        check_output_dir(parse_config(args), False, identity_of(args, world_size=2))
    assert "with processes 1; this run has processes 2" in str(error.value)


@pytest.mark.parametrize("whole_file_bytes", [None, 1024], ids=["hashed whole", "sampled per tensor"])
def test_a_base_retrained_in_place_is_another_model(
    whole_file_bytes, tiny_model_dir, nli_files, tmp_path, monkeypatch
):
    """Same config, names and sizes (what `model` fingerprints): `model_files` tells it by content, and
    the resume is refused naming the file. Above WHOLE_FILE_BYTES (1 KiB here: the path multi-GB weights
    take) each tensor is sampled, so a retrained head alone is seen too; rewriting the same bytes is not
    a change."""
    from finetune.config import model_files

    if whole_file_bytes:
        monkeypatch.setattr(model_files, "WHOLE_FILE_BYTES", whole_file_bytes)
    base = shutil.copytree(tiny_model_dir, tmp_path / "base")
    args = tiny_args(base, nli_files, tmp_path / "out")
    saved = identity_of(args)
    (base / "model.safetensors").write_bytes((base / "model.safetensors").read_bytes())  # same bytes
    assert differences(saved, identity_of(args)) == []
    retrained_in_place(base, only="classifier.weight")
    now = identity_of(args)
    assert differences(saved, now) == ["model_files"]
    with refused("--model_name_or_path", "resume with the model as it was") as error:
        refuse_other_run(saved, now, tmp_path / "checkpoint-4")
    message = str(error.value)
    assert (
        f"was saved from the model in {base.resolve()} as it was then (model file model.safetensors "
        in message
    )
    assert "config.json" not in message  # only the file that changed is named
    # A run recorded before model_files existed compares as before.
    older = {k: v for k, v in saved.items() if k != "model_files"}
    assert differences(older, now) == []

"""Checkpoints a resume can trust and output folders one run owns (#24): a damaged checkpoint is
skipped (auto) or refused (explicit); a folder of an earlier run is resumed or cleared on purpose,
and only by a run of the same configuration; a live run's folder is refused, a dead run's taken over.

In process, a 4-step run with a checkpoint every 2 steps; every refusal leaves the folder as it was.
"""

import json
import os
import shutil
import socket
import subprocess
from datetime import datetime

import pytest
import torch

from finetune.mnli import cli, main
from finetune.output.lock import LOCK_FILE
from finetune.run import setup
from finetune.training.checkpoint import damage
from tests.e2e.test_bad_input import fails_cleanly
from tests.helpers import reset_accelerate, tiny_args, weights, with_flag

STEPS = ["--max_train_steps", "4", "--checkpointing_steps", "2"]
HOST = socket.gethostname()


@pytest.fixture(scope="module")
def unbroken(tiny_model_dir, nli_files, tmp_path_factory):
    """The reference: 4 steps, never interrupted; checkpoint-2 and checkpoint-4 with manifests."""
    out = tmp_path_factory.mktemp("unbroken") / "out"
    main(tiny_args(tiny_model_dir, nli_files, out, *STEPS))
    reset_accelerate()
    assert not (out / LOCK_FILE).exists()  # a finished run leaves no lock
    return out


def died_after_step_4(unbroken, folder):
    """The reference's checkpoints without its final outputs: a run that died after step 4."""
    folder.mkdir()
    for name in ("checkpoint-2", "checkpoint-4"):
        shutil.copytree(unbroken / name, folder / name)
    return folder


def _flip_middle_byte(data: bytes) -> bytes:
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    return bytes(flipped)


TRUNCATED = {  # damage: (file, what is left of it)
    "model.safetensors truncated": ("model.safetensors", lambda data: data[: len(data) // 2]),
    "optimizer.bin truncated": ("optimizer.bin", lambda data: data[:-100]),
    "random_states_0.pkl emptied": ("random_states_0.pkl", lambda data: b""),
}
# The same size and often the same format (a NaN in the weights or the moments): the checksum tells.
DAMAGES = {
    **TRUNCATED,
    "model.safetensors flipped": ("model.safetensors", _flip_middle_byte),
    "optimizer.bin flipped": ("optimizer.bin", _flip_middle_byte),
}


def spoil(checkpoint, damage_name) -> str:
    """Damages one file; returns what the manifest check says about it."""
    name, damaged = DAMAGES[damage_name]
    file = checkpoint / name
    written = file.read_bytes()
    file.write_bytes(damaged(written))
    if file.stat().st_size == len(written):
        return f"{name} is damaged (checksum differs)"
    return f"{name} is damaged (truncated: {file.stat().st_size:,} of {len(written):,} bytes)"


@pytest.mark.parametrize("with_manifest", [True, False], ids=["manifest", "no-manifest"])
@pytest.mark.parametrize("name", TRUNCATED)
def test_damage_is_found_with_or_without_a_manifest(name, with_manifest, unbroken, tmp_path):
    checkpoint = shutil.copytree(unbroken / "checkpoint-4", tmp_path / "checkpoint-4")
    if not with_manifest:  # written before manifests existed: accepted when its files load
        (checkpoint / "manifest.json").unlink()
    assert damage(checkpoint) is None
    said = spoil(checkpoint, name)
    found = damage(checkpoint)
    if with_manifest:
        assert found == said
    else:  # the file itself must fail to parse or load
        file = DAMAGES[name][0]
        assert found.startswith(f"{file} is damaged (") and "truncated" not in found, found


@pytest.mark.parametrize("name", DAMAGES)
def test_auto_skips_a_damaged_checkpoint_and_ends_bitwise_equal(
    name, unbroken, tiny_model_dir, nli_files, tmp_path, capsys
):
    out = died_after_step_4(unbroken, tmp_path / "out")
    (out / "checkpoint-2" / "manifest.json").unlink()  # an older checkpoint without a manifest still resumes
    said = spoil(out / "checkpoint-4", name)
    capsys.readouterr()
    results = main(tiny_args(tiny_model_dir, nli_files, out, *STEPS, "--resume_from_checkpoint", "auto"))
    stdout = capsys.readouterr().out
    assert [line for line in stdout.splitlines() if "skipping" in line] == [
        f"--resume_from_checkpoint auto: skipping {out / 'checkpoint-4'}: {said}"
    ]
    assert f"resuming from {out / 'checkpoint-2'} at step 2" in stdout.splitlines()  # a line of its own
    assert results["global_step"] == 4
    a, b = weights(unbroken), weights(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert damage(out / "checkpoint-4") is None  # rewritten by the resumed run
    assert not (out / LOCK_FILE).exists()


@pytest.mark.parametrize("name", DAMAGES)
def test_an_explicit_damaged_checkpoint_is_refused(
    name, unbroken, tiny_model_dir, nli_files, tmp_path, capsys
):
    out = died_after_step_4(unbroken, tmp_path / "out")
    checkpoint = out / "checkpoint-4"
    said = spoil(checkpoint, name)
    args = tiny_args(tiny_model_dir, nli_files, out, *STEPS, "--resume_from_checkpoint", str(checkpoint))
    last = fails_cleanly(args, out, "", capsys, exit_code=2)
    assert last == (
        f"error: --resume_from_checkpoint {checkpoint}: {said}; give an earlier checkpoint, or 'auto' for "
        "the newest intact one in --output_dir"
    )


def test_auto_with_every_checkpoint_damaged_is_refused(unbroken, tiny_model_dir, nli_files, tmp_path, capsys):
    out = died_after_step_4(unbroken, tmp_path / "out")
    spoil(out / "checkpoint-2", "optimizer.bin truncated")
    spoil(out / "checkpoint-4", "model.safetensors flipped")
    args = tiny_args(tiny_model_dir, nli_files, out, *STEPS, "--resume_from_checkpoint", "auto")
    last = fails_cleanly(args, out, "", capsys, exit_code=2)
    assert last == (
        f"error: --resume_from_checkpoint auto: every checkpoint in {out} is damaged; start over with "
        "--overwrite_output_dir instead, or choose another --output_dir"
    )


def test_a_fresh_start_over_an_earlier_runs_checkpoints_is_refused(
    unbroken, tiny_model_dir, nli_files, tmp_path, capsys
):
    out = died_after_step_4(unbroken, tmp_path / "out")
    last = fails_cleanly(tiny_args(tiny_model_dir, nli_files, out, *STEPS), out, "", capsys, exit_code=2)
    assert last == (
        f"error: --output_dir {out} holds checkpoints of an earlier run (checkpoint-4); continue it with "
        "--resume_from_checkpoint auto, pass --overwrite_output_dir to remove them and start over, or "
        "choose another folder"
    )


def test_overwrite_output_dir_removes_the_earlier_runs_outputs(
    unbroken, tiny_model_dir, nli_files, tmp_path, capsys
):
    out = died_after_step_4(unbroken, tmp_path / "out")
    shutil.copytree(unbroken / "best_model", out / "best_model")
    for name in ("metrics.jsonl", "results.json"):
        shutil.copy(unbroken / name, out / name)
    (out / ".checkpoint-6.partial").mkdir()
    (out / "notes.txt").write_text("mine")
    # A LoRA run's adapter and predictions, a larger model's second shard: stale beside the new model.
    (out / "adapter").mkdir()
    (out / "predictions.jsonl").write_text("{}\n")
    (out / "model-00002-of-00002.safetensors").write_bytes(b"old")
    capsys.readouterr()
    main(tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "3", "--overwrite_output_dir"))
    assert (
        "--overwrite_output_dir: removed the earlier run's 2 checkpoint(s), .checkpoint-6.partial, "
        f"best_model, adapter, metrics.jsonl, results.json, predictions.jsonl, the model files from {out}"
    ) in capsys.readouterr().out.splitlines()
    assert not (out / "adapter").exists() and not (out / "predictions.jsonl").exists()
    assert sorted(p.name for p in out.glob("model*.safetensors")) == ["model.safetensors"]
    assert not list(out.glob("checkpoint-*")) and not list(out.glob(".checkpoint-*"))
    assert json.loads((out / "results.json").read_text())["global_step"] == 3
    assert (out / "notes.txt").read_text() == "mine"  # not the earlier run's: kept


def test_overwrite_output_dir_keeps_the_earlier_run_when_the_new_one_is_refused(
    unbroken, tiny_model_dir, nli_files, tmp_path, capsys
):
    """The refusal comes at model load, after the flags and files passed: nothing is removed yet."""
    out = tmp_path / "out"
    shutil.copytree(unbroken, out)
    args = tiny_args(tiny_model_dir, nli_files, out, "--overwrite_output_dir", "--use_peft")
    fails_cleanly(with_flag(args, "--lora_target_modules", "no_such_layer"), out, "no_such_layer", capsys)
    assert (out / "results.json").exists() and list(out.glob("checkpoint-*"))


def test_auto_refuses_a_checkpoint_of_another_learning_rate(
    unbroken, tiny_model_dir, nli_files, tmp_path, capsys
):
    out = died_after_step_4(unbroken, tmp_path / "out")
    args = tiny_args(tiny_model_dir, nli_files, out, *STEPS, "--resume_from_checkpoint", "auto")
    last = fails_cleanly(with_flag(args, "--learning_rate", "1e-3"), out, "", capsys, exit_code=2)
    assert last == (
        f"error: --resume_from_checkpoint {out / 'checkpoint-4'} was saved by a run with --learning_rate "
        "0.003; this run has --learning_rate 0.001; resume with that run's settings, or start a new run "
        "(--overwrite_output_dir or another --output_dir)"
    )
    # Settings the optimizer state or the schedule would otherwise silently override.
    changed = with_flag(with_flag(args, "--weight_decay", "0.5"), "--warmup_steps", "5")
    last = fails_cleanly(changed, out, "", capsys, exit_code=2)
    assert "this run has --warmup_steps 5, --weight_decay 0.5;" in last
    # Other rows or other batches mid-epoch would train some rows twice and others never.
    regrouped = with_flag(with_flag(args, "--group_by_length", "false"), "--max_train_samples", "150")
    last = fails_cleanly(regrouped, out, "", capsys, exit_code=2)
    assert "this run has --max_train_samples 150, --group_by_length false;" in last


def test_an_mnli_run_does_not_resume_a_custom_tasks_checkpoint(tiny_model_dir, nli_files, tmp_path, capsys):
    rows = tmp_path / "tags.jsonl"
    rows.write_text("".join(json.dumps({"text": f"t{i}", "tag": "abc"[i % 3]}) + "\n" for i in range(48)))
    out = tmp_path / "out"
    custom = ["--task_name", "custom", "--text_columns", "text", "--label_column", "tag", *STEPS]
    main(tiny_args(tiny_model_dir, {"train": rows, "validation": rows}, out, *custom))
    reset_accelerate()
    args = tiny_args(tiny_model_dir, nli_files, out, *STEPS, "--resume_from_checkpoint", "auto")
    last = fails_cleanly(args, out, "", capsys, exit_code=2)
    saved, now = last.split(" was saved by a run with ")[1].split("; this run has ")[:2]
    assert saved.startswith("training data sha256 ") and now.startswith("training data sha256 ")
    assert "--task_name custom, --text_columns text, --label_column tag" in saved
    assert "--task_name mnli, --text_columns none, --label_column label" in now


def write_lock(folder, pid):
    folder.mkdir(parents=True, exist_ok=True)
    started = datetime.now().astimezone().isoformat()
    (folder / LOCK_FILE).write_text(json.dumps({"pid": pid, "host": HOST, "started": started}))


def refused_while_held(argv: list[str], out, capsys) -> str:
    """`argv`'s run, while a live process holds `out`'s lock: one line (exit 2) naming that process, and
    the folder untouched. Returns the line."""
    with subprocess.Popen(["sleep", "30"]) as other:
        try:
            write_lock(out, other.pid)
            last = fails_cleanly(argv, out, "", capsys, exit_code=2)
        finally:
            other.kill()
    assert last.startswith(f"error: --output_dir {out} is in use by another run (pid {other.pid} on {HOST}, ")
    return last


def test_a_folder_held_by_a_live_run_is_refused(tiny_model_dir, nli_files, tmp_path, capsys):
    out = tmp_path / "out"
    last = refused_while_held(tiny_args(tiny_model_dir, nli_files, out), out, capsys)
    assert last.endswith("; wait for it to finish or choose another folder")


def test_the_lock_of_a_run_that_is_gone_is_taken_over_then_released(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    out = tmp_path / "out"
    gone = subprocess.Popen(["true"])
    gone.wait()
    write_lock(out, gone.pid)
    held = {}

    def build(*launch):
        run = setup(*launch)
        held.update(json.loads((out / LOCK_FILE).read_text()))
        return run

    capsys.readouterr()
    assert cli(tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "2"), build) == 0
    assert (
        f"{out / LOCK_FILE}: taking over the lock of pid {gone.pid} on {HOST}, which is no longer running"
        in capsys.readouterr().out.splitlines()
    )
    assert held["pid"] == os.getpid() and held["host"] == HOST
    assert not (out / LOCK_FILE).exists()


def test_a_checkpoint_folder_is_not_a_model(unbroken, nli_files, tmp_path, capsys):
    checkpoint = unbroken / "checkpoint-4"
    args = tiny_args(checkpoint, nli_files, tmp_path / "eval", "--do_train", "false")
    last = fails_cleanly(args, unbroken, "", capsys, exit_code=2)
    assert last == (
        f"error: --model_name_or_path {checkpoint} is a training checkpoint (state for "
        "--resume_from_checkpoint), not a model: give the run's --output_dir, or its best_model/"
    )


def test_a_manifest_of_sizes_only_still_passes(unbroken, tmp_path):
    """As checkpoints written before checksums have it: {file: bytes}."""
    checkpoint = shutil.copytree(unbroken / "checkpoint-4", tmp_path / "checkpoint-4")
    manifest = checkpoint / "manifest.json"
    listed = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({name: entry["bytes"] for name, entry in listed.items()}))
    assert damage(checkpoint) is None
    spoil(checkpoint, "optimizer.bin truncated")
    assert damage(checkpoint).startswith("optimizer.bin is damaged (truncated")


def test_random_bytes_of_the_same_size_are_damage_not_an_unsafe_pickle(unbroken, tmp_path):
    """Not "holds Python objects other than tensors": the checksum speaks before anything unpickles."""
    checkpoint = shutil.copytree(unbroken / "checkpoint-4", tmp_path / "checkpoint-4")
    file = checkpoint / "optimizer.bin"
    file.write_bytes(os.urandom(file.stat().st_size))
    assert damage(checkpoint) == "optimizer.bin is damaged (checksum differs)"


def test_full_determinism_is_the_same_run_and_resumes_bitwise(unbroken, tiny_model_dir, nli_files, tmp_path):
    """--full_determinism (HF Trainer's flag; the remedy on CUDA, where two runs of the same flags differ
    in the last bits) turns torch's deterministic algorithms on, and resumes the checkpoint of a run
    made without it: the same run, ending bit for bit where the unbroken one did."""
    from unittest import mock

    out = died_after_step_4(unbroken, tmp_path / "out")
    shutil.rmtree(out / "checkpoint-4")
    try:
        with mock.patch.dict(os.environ):  # transformers sets CUBLAS_WORKSPACE_CONFIG and friends
            args = tiny_args(tiny_model_dir, nli_files, out, *STEPS, "--full_determinism")
            main([*args, "--resume_from_checkpoint", "auto"])
            assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
        reset_accelerate()
    a, b = weights(unbroken), weights(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

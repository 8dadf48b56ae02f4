"""The output folder is never written over silently: another model's files, an earlier run's outputs
without results.json (stopped while exporting), the user's own README (issue 32, cases 1 and 2)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from finetune.mnli import cli
from finetune.output.card import is_model_card
from tests.helpers import reset_accelerate, snapshot, tiny_args


def refused(capsys, argv, folder) -> str:
    before = snapshot(folder)
    capsys.readouterr()
    assert cli(argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert snapshot(folder) == before
    reset_accelerate()
    return last


def test_a_folder_holding_another_model_and_a_readme_is_refused_and_the_readme_kept(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    out = shutil.copytree(tiny_model_dir, tmp_path / "gpt2-copy")
    (out / "README.md").write_text("# My notes on this model\n")
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "2")
    last = refused(capsys, args, out)
    assert last.startswith(f"error: --output_dir {out} holds files of an earlier run or another model")
    assert "model files" in last and "--overwrite_output_dir" in last
    # Told to replace them: the model is replaced, the user's README is not.
    model_before = (out / "model.safetensors").read_bytes()
    assert cli([*args, "--overwrite_output_dir"]) == 0
    assert (out / "README.md").read_text() == "# My notes on this model\n"
    said = capsys.readouterr().out
    assert f"{out / 'README.md'} is not a model card of finetune's: kept as it is" in said
    # The closing list of what was written names only what this run wrote: not the user's README.
    listed = [line for line in said.splitlines() if line.startswith("model, tokenizer")]
    assert len(listed) == 1 and "README.md" not in listed[0], said[-2000:]
    assert (out / "model.safetensors").read_bytes() != model_before and (out / "results.json").exists()
    # Without it, the card this run writes is listed.
    (out / "README.md").unlink()
    reset_accelerate()
    assert cli([*args, "--overwrite_output_dir"]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("model, tokenizer")]
    assert listed[0].startswith("model, tokenizer, README.md (model card)")
    assert is_model_card(out / "README.md")


def test_an_export_stopped_before_results_json_is_protected_from_another_run(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    """A run stopped while exporting leaves best_model/ and the model but no results.json: another run
    is refused (it would replace that best model); the same run starts over and finishes."""
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "2")
    assert cli(args) == 0
    reset_accelerate()
    (out / "results.json").unlink()
    last = refused(capsys, [*args, "--learning_rate", "1e-3"], out)
    assert "best_model" in last and "train_config.json" in last and "--overwrite_output_dir" in last
    assert cli(args) == 0  # this run's own unfinished folder
    assert (out / "results.json").exists()


def test_sigterm_while_exporting_is_one_line_and_the_relaunch_finishes_the_export(
    tiny_model_dir, nli_files, tmp_path, capsys, monkeypatch
):
    """Issue 32, case 2: a stop signal after training (exporting the model) is the stop line and exit
    143, not a silent death; --resume_from_checkpoint auto then finishes the run."""
    import os
    import signal

    import finetune.run

    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "4", "--checkpointing_steps", "2")
    export = finetune.run.export_model

    def sigterm_then_export(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)  # its handler raises at the next line: nothing is exported
        return export(*a, **k)

    monkeypatch.setattr(finetune.run, "export_model", sigterm_then_export)
    capsys.readouterr()
    assert cli(args) == 143
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith("error: stopped by SIGTERM; the run did not finish (no results.json)")
    )
    assert (out / "checkpoint-4").is_dir() and (out / "best_model").is_dir()
    assert not (out / "results.json").exists() and not (out / "model.safetensors").exists()
    monkeypatch.undo()
    reset_accelerate()
    assert cli([*args, "--resume_from_checkpoint", "auto"]) == 0
    assert (out / "results.json").exists() and (out / "model.safetensors").exists()


def test_the_checkpoint_written_for_the_export_holds_no_optimizer_moments_and_finishes_the_run(
    tiny_model_dir, nli_files, tmp_path, capsys, monkeypatch
):
    """The last step (3) has no scheduled checkpoint, so one is written for the export alone: without
    AdamW's moments (they would only cost time and disk: no step follows), yet a stop during the export
    and the relaunch end with the weights of a run never stopped."""
    import json
    import os
    import signal

    import torch

    import finetune.run
    from tests.helpers import weights

    whole = tmp_path / "whole"
    assert cli(tiny_args(tiny_model_dir, nli_files, whole, "--max_train_steps", "3")) == 0
    reset_accelerate()
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "3", "--checkpointing_steps", "2")
    export = finetune.run.export_model

    def sigterm_then_export(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)
        return export(*a, **k)

    monkeypatch.setattr(finetune.run, "export_model", sigterm_then_export)
    assert cli(args) == 143
    kept, scheduled = out / "checkpoint-3", out / "checkpoint-2"
    assert json.loads((kept / "trainer_state.json").read_text())["for_export"] is True
    moments = torch.load(kept / "optimizer.bin", weights_only=True)["state"]
    assert moments == {} and torch.load(scheduled / "optimizer.bin", weights_only=True)["state"]
    monkeypatch.undo()
    reset_accelerate()
    capsys.readouterr()
    assert cli([*args, "--resume_from_checkpoint", "auto"]) == 0
    a, b = weights(whole), weights(out)
    assert [name for name in a if not torch.equal(a[name], b[name])] == []
    assert not kept.exists()  # written for the export alone: gone once results.json is


def test_a_finished_run_relaunched_with_do_predict_predicts_with_its_model(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    """Issue 32: it said "nothing to resume" and wrote no predictions. Now the finished model predicts;
    nothing of the run changes but predictions.jsonl and results.json's predict_samples."""
    from tests.helpers import read_jsonl

    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "2", "--checkpointing_steps", "2")
    assert cli(args) == 0
    reset_accelerate()
    before = snapshot(out)
    relaunched = [
        *args,
        "--resume_from_checkpoint",
        "auto",
        "--do_predict",
        "--test_file",
        str(nli_files["validation"]),
    ]
    assert cli(relaunched) == 0
    after = snapshot(out)
    changed = {str(k) for k in after if before.get(k) != after[k]}
    assert changed == {"predictions.jsonl", "results.json"}, changed
    rows = read_jsonl(out / "predictions.jsonl")
    results = json.loads((out / "results.json").read_text())
    assert len(rows) == results["predict_samples"] == 151 and [r["row"] for r in rows] == list(range(151))
    assert {k: v for k, v in results.items() if k != "predict_samples"} == json.loads(
        before[Path("results.json")]
    )
    assert "nothing to resume" in capsys.readouterr().out


def test_every_file_of_a_lora_run_has_the_mode_its_umask_gives(tiny_model_dir, nli_files, tmp_path):
    """Weights (the model, best_model/, adapter/, a checkpoint's) as readable as config.json beside
    them: safetensors wrote them -rw------- whatever the umask. 0o002 gives group write, unlike the
    common 0o022, so a mode left by chance does not pass."""
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "2", "--checkpointing_steps", "1")
    previous = os.umask(0o002)
    try:
        assert cli([*args, "--use_peft", "--lora_r", "4"]) == 0
    finally:
        os.umask(previous)
    modes = {str(f.relative_to(out)): oct(f.stat().st_mode & 0o777) for f in out.rglob("*") if f.is_file()}
    for weights in ("model.safetensors", "best_model/model.safetensors", "adapter/adapter_model.safetensors"):
        assert weights in modes
    assert any(name.startswith("checkpoint-1/") and name.endswith(".safetensors") for name in modes)
    assert {name: mode for name, mode in modes.items() if mode != oct(0o664)} == {}


def test_the_root_and_best_model_hold_one_copy_when_the_root_is_the_best(tiny_model_dir, nli_files, tmp_path):
    """The best evaluation is the last step's: the root's weights and best_model/'s are the same bytes,
    kept once (hard links; the demo-sft's 1.1 GB twice before), best_model/ still a complete model with
    its record. An export into one folder first takes its name off a shared file, so no writer can
    change the other folder's model through it."""
    from transformers import AutoModelForSequenceClassification

    out = tmp_path / "out"
    assert cli([*tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "2"), "--use_peft"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["exported_model_step"] == results["best_step"] == 2
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        assert (out / name).samefile(out / "best_model" / name) and (out / name).stat().st_nlink == 2, name
    assert json.loads((out / "best_model" / "eval_results.json").read_text())["step"] == 2
    AutoModelForSequenceClassification.from_pretrained(out / "best_model")  # ready for pipeline
    root = (out / "model.safetensors").read_bytes()
    from finetune.output.export import _unshare

    _unshare(out / "best_model")
    assert not (out / "best_model" / "model.safetensors").exists()
    assert not (out / "best_model" / "eval_results.json").exists()  # claims no step it lacks
    assert (out / "model.safetensors").read_bytes() == root
    assert (out / "model.safetensors").stat().st_nlink == 1

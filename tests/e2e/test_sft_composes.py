"""Generative fine-tuning composes with the rest, family-blind: a SIGKILLed 2-process run resumes
bitwise; seeds summarise eval_loss (lower is better); a sweep minimises eval_loss; the world check, the
lock and a finished run's relaunch hold as for classifiers; bad settings are one line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from finetune.errors import ConfigError
from finetune.mnli import cli, main
from finetune.studies.sweep_command import sweep_main
from tests.chat_models import build_tiny_lm
from tests.e2e.test_sft import ONE_UPDATE, chat, first_update, sft_args  # noqa: F401  (chat: the module's fixture)
from tests.helpers import assert_sharded, read_jsonl, reset_accelerate, weights
from tests.warm_ranks import run_ranks, run_warm

STEPS = ("--max_train_steps", "6", "--per_device_train_batch_size", "2", "--learning_rate", "3e-3",
         "--checkpointing_steps", "2", "--logging_steps", "1", "--eval_strategy", "steps",
         "--eval_steps", "3")  # fmt: skip


PACKED = (*STEPS, "--packing", "true", "--save_total_limit", "2")


@pytest.fixture(scope="module")
def packed_ddp(chat, tmp_path_factory):  # noqa: F811
    """Packed, on 2 processes (DDP), the loss whole: the unbroken run the packed resume below ends as,
    and the DDP run test_fsdp_on_cpu_shards_sft_as_ddp_and_resumes_bitwise_after_sigkill compares
    FSDP's with. Its output folder."""
    out = tmp_path_factory.mktemp("packed_ddp") / "out"
    done = run_ranks(sft_args(chat, out, *PACKED, "--chunked_loss", "false"))
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_a_packed_two_process_run_resumed_from_its_checkpoint_ends_bitwise(chat, packed_ddp, tmp_path):  # noqa: F811
    """Packed, on 2 processes (DDP): a run left with checkpoint-4 alone (as one that died after it),
    relaunched with --resume_from_checkpoint auto, ends with the same weights, bit for bit, as the run
    never stopped; every rank really ran (world size 2). (A SIGKILL itself, on 2 ranks: packed under
    FSDP in test_fsdp_on_cpu_shards_sft_as_ddp_and_resumes_bitwise_after_sigkill, and under DDP in
    test_fault_tolerance.py; here the checkpoint is copied from the unbroken run, one launch fewer.)"""
    unbroken, killed = packed_ddp, tmp_path / "killed"
    killed.mkdir()
    shutil.copytree(unbroken / "checkpoint-4", killed / "checkpoint-4")
    flags = (*PACKED, "--chunked_loss", "false", "--resume_from_checkpoint", "auto")
    resumed = run_ranks(sft_args(chat, killed, *flags))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {killed / 'checkpoint-4'} at step 4" in resumed.stdout
    results = json.loads((killed / "results.json").read_text())
    assert results["world_size"] == 2 and results["global_step"] == 6
    assert json.loads((unbroken / "results.json").read_text())["world_size"] == 2
    a, b = weights(unbroken), weights(killed)
    assert [name for name in a if not torch.equal(a[name], b[name])] == []


def test_sigterm_stops_after_its_step_with_a_checkpoint_and_the_relaunch_ends_bitwise_equal(chat, tmp_path):  # noqa: F811
    """SIGTERM during step 3 (a real signal, in its own process): the step finishes, checkpoint-3, exit
    143 with one line; the relaunch with --resume_from_checkpoint auto ends bit for bit as a run never
    stopped."""
    unbroken, out = tmp_path / "unbroken", tmp_path / "out"
    main(sft_args(chat, unbroken, *STEPS))
    reset_accelerate()
    told = {"AT_STEP": "3", "SIGNAL": "TERM", "RANKS": "0"}
    stopped = run_warm(sft_args(chat, out, *STEPS), script="tests/probes/signal_at_step.py", env=told)
    said = [line for line in (stopped.stdout + stopped.stderr).splitlines() if line.startswith("stopped by")]
    assert stopped.returncode == 143 and len(said) == 1, stopped.stderr[-3000:]
    assert said[0].startswith(f"stopped by SIGTERM after step 3; checkpoint saved to {out / 'checkpoint-3'}")
    main(sft_args(chat, out, *STEPS, "--resume_from_checkpoint", "auto"))
    a, b = weights(unbroken), weights(out)
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
        (("--padding_free", "true"), "--padding_free"),  # classification's speed paths, asked by name
        (("--dropout_kernel", "packed"), "--dropout_kernel"),
        (("--cuda_graphs", "true"), "--cuda_graphs"),
    ],
)
def test_settings_a_causal_lm_cannot_honour_are_one_line(chat, tmp_path, extra, flag):  # noqa: F811
    with pytest.raises(ConfigError) as refused:
        main(sft_args(chat, tmp_path / "out", *extra))
    assert refused.value.flag == flag and "\n" not in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_a_dataset_folder_a_carved_validation_split_and_row_caps(chat, tmp_path):  # noqa: F811
    """--dataset_name as a local folder of split files (no GLUE subset asked for); a validation split
    carved from the training rows with --seed; --max_train_samples and --max_eval_samples cap the rows."""
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.jsonl").write_text(chat["train"].read_text())
    (folder / "validation.jsonl").write_text(chat["validation"].read_text())
    files = ("--train_file", str(chat["train"]), "--validation_file", str(chat["validation"]))
    args = [a for a in sft_args(chat, tmp_path / "folder", "--max_train_steps", "1") if a not in files]
    caps = ("--max_train_samples", "10", "--max_eval_samples", "5")
    results = main([*args, "--dataset_name", str(folder), *caps])
    reset_accelerate()
    assert results["eval_samples"] == 5 and results["train_samples"] == 10  # one update: batch 32 > 10 rows
    without_validation = files[2:]
    args = [
        a
        for a in sft_args(chat, tmp_path / "carved", "--max_train_steps", "1")
        if a not in without_validation
    ]
    carved = main([*args, "--validation_split_percentage", "25"])
    assert carved["eval_samples"] == 6 and carved["train_samples"] == 18  # 25% of 24 rows held out


def test_generating_at_evaluations_leaves_training_as_it_was(chat, tmp_path):  # noqa: F811
    """Evaluation draws nothing from the RNG dropout uses: with LoRA dropout, the training losses are the
    same bits whether each step's evaluation generates or not."""
    lora = ("--use_peft", "true", "--lora_dropout", "0.1", "--max_train_steps", "4",
            "--per_device_train_batch_size", "4", "--learning_rate", "1e-2", "--eval_strategy", "steps",
            "--eval_steps", "1", "--logging_steps", "1", "--generation_max_new_tokens", "4")  # fmt: skip
    plain, generating = tmp_path / "plain", tmp_path / "generating"
    main(sft_args(chat, plain, *lora))
    reset_accelerate()
    main(sft_args(chat, generating, *lora, "--predict_with_generate", "true"))
    losses = [
        [r["loss"] for r in read_jsonl(out / "metrics.jsonl") if "loss" in r] for out in (plain, generating)
    ]
    assert len(losses[0]) == 4 and losses[0] == losses[1]


def test_a_folder_held_by_a_live_run_is_refused_in_one_line(chat, tmp_path, capsys):  # noqa: F811
    """The output-folder lock holds for a causal LM run as for a classifier: another live run's folder is
    refused in one line (exit 2), its lock and files untouched."""
    from tests.e2e.test_checkpoints import refused_while_held

    out = tmp_path / "out"
    refused_while_held(sft_args(chat, out), out, capsys)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_gradient_checkpointing_gives_the_same_update(chat, tmp_path, lora):  # noqa: F811
    """--gradient_checkpointing recomputes the activations in the backward: one update's loss and gradient
    norm are those of the run without it, in full and with LoRA (whose frozen embeddings give the
    checkpointed layers inputs that need no gradient)."""
    peft = ("--use_peft", "true", "--lora_dropout", "0") if lora else ()
    batch = ("--per_device_train_batch_size", "8")
    updates = []
    for name, extra in (("plain", ()), ("checkpointed", ("--gradient_checkpointing", "true"))):
        main(sft_args(chat, tmp_path / name, *ONE_UPDATE, *batch, *peft, *extra))
        reset_accelerate()
        updates.append(first_update(tmp_path / name))
    plain, checkpointed = updates
    assert plain["grad_norm"] > 0
    assert checkpointed["loss"] == pytest.approx(plain["loss"], rel=1e-6)
    assert checkpointed["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-5)


def fsdp_on_cpu(config: str = "fsdp.yaml", *extra: str) -> list[str]:
    return ["--config_file", f"accelerate_configs/{config}", "--num_processes", "2", "--gpu_ids", "all",
            "--mixed_precision", "no", *extra]  # fmt: skip


def sharded_like_ddp(fsdp_out, ddp_out) -> dict:
    """Both on 2 ranks, one run FSDP2 (each rank half of every parameter, gradient and moment), the other
    DDP: the same losses, evaluation and weights to float tolerance (only the reductions' order
    differs), and the same tensors exported (a tied head written once, as DDP's export writes it,
    though FSDP's gathered state dict holds it apart from the embeddings)."""
    fsdp, ddp = (json.loads((out / "results.json").read_text()) for out in (fsdp_out, ddp_out))
    assert fsdp["world_size"] == ddp["world_size"] == 2 and fsdp["global_step"] == ddp["global_step"]
    assert fsdp["distributed_type"] == "FSDP" and ddp["distributed_type"] == "MULTI_CPU"
    assert_sharded(fsdp)
    logged = [
        [r["loss"] for r in read_jsonl(out / "metrics.jsonl") if "loss" in r] for out in (fsdp_out, ddp_out)
    ]
    assert len(logged[0]) == fsdp["global_step"] and logged[0] == pytest.approx(logged[1], rel=1e-5)
    assert fsdp.get("eval_loss") == pytest.approx(ddp.get("eval_loss"), rel=1e-5)
    a, b = weights(fsdp_out), weights(ddp_out)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)
    return json.loads((fsdp_out / "train_config.json").read_text())  # what it trained with


@pytest.mark.multiprocess
def test_fsdp_on_cpu_shards_sft_as_ddp_and_resumes_bitwise_after_sigkill(chat, packed_ddp, tmp_path, capsys):  # noqa: F811
    """fsdp.yaml on 2 CPU ranks, packed: DDP's losses and weights with each rank holding half; SIGKILLed at
    step 5 (after checkpoint-4), resumed to the unbroken run's bits, --save_total_limit 2 keeping the two
    newest sharded checkpoints and no partial folder; the export a full model `pipeline` generates with;
    resume on one process refused in one line. Unpacked, a tied head, with a block class the model lacks
    set on the command line: the model's own is wrapped, said once, and DDP's losses again. LoRA
    (fsdp_lora.yaml): sharded, DDP's losses, exported merged and as adapter/. Every FSDP run's loss is
    chunked (--chunked_loss auto, chunks of 8 target tokens, recomputed in the backward), every DDP run's
    whole: the chunks call the output layer after the forward, which killed FSDP2's backward."""
    from transformers import pipeline

    chunked, whole = ("--chunked_loss_tokens", "8"), ("--chunked_loss", "false")
    ddp, unbroken, killed = packed_ddp, tmp_path / "unbroken", tmp_path / "killed"  # ddp: PACKED, whole
    packed = (*PACKED, *chunked)  # the FSDP runs'
    done = run_ranks(sft_args(chat, unbroken, *packed), fsdp_on_cpu())
    assert done.returncode == 0, done.stderr[-3000:]
    trained = sharded_like_ddp(unbroken, ddp)
    chosen = trained["resolved"]  # --chunked_loss auto's verdict
    assert trained["packing"] and (chosen["chunked_loss"], chosen["chunked_loss_tokens"]) == ("true", 8)
    env = {"AT_STEP": "5", "SIGNAL": "KILL", "RANKS": "0,1"}
    died = run_ranks(sft_args(chat, killed, *packed), fsdp_on_cpu(), "tests/probes/signal_at_step.py", env)
    assert died.returncode != 0 and not (killed / "results.json").exists()
    assert sorted(p.name for p in killed.glob("*checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    resumed = run_ranks(sft_args(chat, killed, *packed, "--resume_from_checkpoint", "auto"), fsdp_on_cpu())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    results = json.loads((killed / "results.json").read_text())
    assert (
        results["world_size"] == 2 and results["global_step"] == 6 and results["distributed_type"] == "FSDP"
    )
    a, b = weights(unbroken), weights(killed)
    assert [name for name in a if not torch.equal(a[name], b[name])] == []
    assert sorted(p.name for p in killed.glob("*checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    generate = pipeline("text-generation", model=str(killed))
    assert isinstance(generate("hello", max_new_tokens=2)[0]["generated_text"], str)
    alone = tmp_path / "alone"  # the sharded checkpoint, resumed on one process
    shutil.copytree(killed / "checkpoint-4", alone / "checkpoint-4")
    assert cli(sft_args(chat, alone, *packed, "--resume_from_checkpoint", "auto")) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: --resume_from_checkpoint") and "saved with 2 processes" in error

    short = ("--max_train_steps", "2", "--per_device_train_batch_size", "2", "--logging_steps", "1")
    tied = {**chat, "model": build_tiny_lm("qwen2", tmp_path / "tied_lm", tied=True)}
    plain_ddp, plain = tmp_path / "plain_ddp", tmp_path / "plain"
    done = run_ranks(sft_args(tied, plain_ddp, *short, *whole))
    assert done.returncode == 0, done.stderr[-3000:]
    wrong_block = fsdp_on_cpu("fsdp.yaml", "--fsdp_transformer_layer_cls_to_wrap", "BertLayer")
    done = run_ranks(sft_args(tied, plain, *short, *chunked), wrong_block)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("fsdp_transformer_layer_cls_to_wrap names BertLayer, which") == 1
    trained = sharded_like_ddp(plain, plain_ddp)
    assert not trained["packing"] and trained["resolved"]["chunked_loss"] == "true"
    lora_ddp, lora = tmp_path / "lora_ddp", tmp_path / "lora"  # fsdp_lora.yaml: merged, and its adapter
    done = run_ranks(sft_args(chat, lora_ddp, *short, "--use_peft", "true", *whole))
    assert done.returncode == 0, done.stderr[-3000:]
    lora_args = sft_args(chat, lora, *short, "--use_peft", "true", *chunked)
    done = run_ranks(lora_args, fsdp_on_cpu("fsdp_lora.yaml"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert sharded_like_ddp(lora, lora_ddp)["resolved"]["chunked_loss"] == "true"
    results = json.loads((lora / "results.json").read_text())
    assert (
        results["world_size"] == 2 and results["distributed_type"] == "FSDP" and results["global_step"] == 2
    )
    assert_sharded(results)
    assert weights(lora).keys() == weights(chat["model"]).keys()
    assert (lora / "adapter" / "adapter_model.safetensors").is_file()

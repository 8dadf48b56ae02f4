"""The same loop on 2 real processes (gloo on CPU): launchers, agreement, accumulation, FSDP.

Every test asserts the world size it really got: a launcher that silently starts one process,
or two processes that each think they are alone, must fail here.
"""

import json
import math
import os
import shutil

import pytest
import torch
from transformers import pipeline

from finetune.mnli import cli, main
from tests.helpers import (
    N_VALIDATION,
    PYTHON,
    assert_same_weights,
    assert_sharded,
    free_port,
    read_jsonl,
    reference_weights,
    run_cli,
    shifted_validation,
    tiny_args,
    weights,
    with_flag,
    without_dropout,
)
from tests.warm_ranks import run_ranks

pytestmark = pytest.mark.multiprocess
BIN = os.path.dirname(PYTHON)
ACCELERATE = os.path.join(BIN, "accelerate")


def accelerate_launch(config_file: str, *launch_args: str) -> list[str]:
    return [
        ACCELERATE,
        "launch",
        "--config_file",
        config_file,
        "--main_process_port",
        str(free_port()),
        *launch_args,
    ]


def two_process(script_args: list[str], launcher: list[str] | None = None, script="finetune/mnli.py"):
    """The job on 2 ranks: through `launcher`'s command, or (none given) forked from the warm process
    with the environment `accelerate launch` gives them for the config file the tests document."""
    done = run_cli([*launcher, script, *script_args]) if launcher else run_ranks(script_args, script=script)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def results_of(output_dir):
    return json.loads((output_dir / "results.json").read_text())


def losses(output_dir) -> list[float]:
    return [r["loss"] for r in read_jsonl(output_dir / "metrics.jsonl") if "loss" in r]


def documented_args(tiny_model_dir, nli_files, output_dir, *extra: str) -> list[str]:
    """One epoch with a checkpoint at step 10 and W&B (offline: no key here)."""
    args = tiny_args(
        tiny_model_dir, nli_files, output_dir, "--checkpointing_steps", "10", "--save_plots", "true", *extra
    )
    args[args.index("--report_to") + 1] = "wandb"
    return args


@pytest.fixture(scope="module")
def documented_run(tiny_model_dir, nli_files, tmp_path_factory):
    """`documented_args` on 2 ranks with the config file the tests document: made once, read twice."""
    out = tmp_path_factory.mktemp("documented") / "out"
    two_process(documented_args(tiny_model_dir, nli_files, out))
    return out


def test_two_ranks_agree_and_only_rank_zero_writes(documented_run):
    """The config file the tests document: identical replicas, every row evaluated once, one writer."""
    out = documented_run
    results = results_of(out)
    assert (results["world_size"], results["distributed_type"]) == (2, "MULTI_CPU")
    assert results["replicas_identical"] is True  # sha256 of every parameter, gathered from both ranks
    # 151 rows over 2 ranks x 64: Accelerate pads the last batch; gather_for_metrics drops the padding.
    assert results["eval_matched_samples"] == N_VALIDATION
    steps = [r["step"] for r in read_jsonl(out / "metrics.jsonl")]
    assert steps == [5, 10, 15, 19, 19]  # 4 logging lines + 1 evaluation, each written once
    assert len(list((out / "wandb").glob("offline-run-*"))) == 1
    checkpoint = out / "checkpoint-10"
    # Each rank saves its own RNG state; the model and optimizer are written once, by rank 0.
    assert sorted(p.name for p in checkpoint.glob("random_states_*")) == [
        "random_states_0.pkl",
        "random_states_1.pkl",
    ]
    assert len(list(checkpoint.glob("model*.safetensors"))) == 1
    expected = [
        "README.md", "best_model", "checkpoint-10", "config.json", "metrics.jsonl", "model.safetensors",
        "results.json", "tokenizer.json", "tokenizer_config.json", "train_config.json", "training_curves.png",
        "wandb",
    ]  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == expected


def test_accumulation_all_reduces_once_per_optimizer_step(tiny_model_dir, nli_files, tmp_path):
    """With accumulation 2, DDP's no_sync must skip the all-reduce on every other micro-batch. (Forked
    warm: the subject is the run's DDP; torchrun's own launch is the restart tests'.)"""
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--gradient_accumulation_steps", "2")
    done = two_process(args, script="tests/probes/count_allreduce.py")
    # One world of two: one start-up summary (rank 0's), identical replicas.
    results = results_of(out)
    assert results["world_size"] == 2 and results["replicas_identical"] is True
    assert done.stdout.count("world_size=2") == 1
    micro_batches = math.ceil(600 / (16 * 2))  # 19 per rank; the last window is partial
    for rank in (0, 1):
        counted = json.loads((out / f"allreduce_rounds_rank{rank}.json").read_text())
        assert counted["global_step"] == math.ceil(micro_batches / 2) == 10
        assert counted["rounds"] == 10  # one all-reduce round per optimizer step, not 19


def test_partial_last_window_over_two_ranks_matches_one_big_batch(tiny_model_dir, nli_files, tmp_path):
    """10 pairs, 2 ranks x batch 2 x accumulation 2: the second update holds one micro-batch per rank, of
    one pair each (the last global batch's 2 pairs, cut evenly), and each pair is trained once; the
    reference averages each window's pairs."""
    model_dir = without_dropout(tiny_model_dir, tmp_path / "model")
    out = tmp_path / "out"
    flags = ["--max_train_samples", "10", "--per_device_train_batch_size", "2",
             "--gradient_accumulation_steps", "2", "--learning_rate", "1e-2",
             "--lr_scheduler_type", "constant", "--warmup_ratio", "0", "--max_grad_norm", "0"]  # fmt: skip
    two_process(tiny_args(model_dir, nli_files, out, *flags))
    results = results_of(out)
    assert (results["world_size"], results["global_step"], results["train_samples"]) == (2, 2, 10)
    windows = [list(range(8)), [8, 9]]
    assert_same_weights(weights(out), reference_weights(model_dir, nli_files, windows, 1e-2, 4))


@pytest.mark.parametrize(
    ("rows", "batch", "accumulation", "windows"),
    [
        (13, 4, 1, [range(8), range(8, 13)]),  # the last global batch's 5 rows cut 3 and 2
        (9, 2, 2, [range(8), [8]]),  # its 1 row: rank 1 runs a placeholder, weighing nothing
    ],
)
def test_rows_dividing_neither_batch_nor_ranks_are_each_trained_once(
    tiny_model_dir, nli_files, tmp_path, rows, batch, accumulation, windows
):
    """2 processes against 1 with the same global batch: the same loss every update, train_samples the
    row count, the weights of plain PyTorch's update per window of each row once, and each of the 151
    validation rows evaluated once."""
    model_dir = without_dropout(tiny_model_dir, tmp_path / "model")
    flags = ["--max_train_samples", str(rows), "--gradient_accumulation_steps", str(accumulation),
             "--learning_rate", "1e-2", "--lr_scheduler_type", "constant", "--warmup_ratio", "0",
             "--max_grad_norm", "0", "--logging_steps", "1"]  # fmt: skip
    one, two = tmp_path / "one", tmp_path / "two"
    main(
        with_flag(
            tiny_args(model_dir, nli_files, one, *flags), "--per_device_train_batch_size", str(2 * batch)
        )
    )
    two_process(
        with_flag(tiny_args(model_dir, nli_files, two, *flags), "--per_device_train_batch_size", str(batch))
    )
    results = [results_of(out) for out in (one, two)]
    assert [r["world_size"] for r in results] == [1, 2]
    assert [r["train_samples"] for r in results] == [rows, rows]
    assert [r["global_step"] for r in results] == [2, 2]
    assert losses(two) == pytest.approx(losses(one), rel=1e-5)
    assert [r["eval_matched_samples"] for r in results] == [N_VALIDATION] * 2
    assert results[1]["eval_matched_loss"] == pytest.approx(results[0]["eval_matched_loss"], rel=1e-5)
    reference = reference_weights(model_dir, nli_files, [list(w) for w in windows], 1e-2, 2 * batch)
    assert_same_weights(weights(two), reference)


def test_compressed_gradients_over_two_ranks(documented_run, tiny_model_dir, nli_files, tmp_path, capsys):
    """fp16 all-reduces a half-precision copy of the gradients: the same job without the hook ends
    a rounding away, and not on the same bits (which a hook that was never registered would give)."""
    out = tmp_path / "fp16"
    two_process(documented_args(tiny_model_dir, nli_files, out, "--ddp_comm_hook", "fp16"))
    results = results_of(out)
    assert results["world_size"] == 2 and results["global_step"] == 19 and results["replicas_identical"]
    fp16, none = weights(out), weights(documented_run)
    assert not all(torch.equal(fp16[name], none[name]) for name in none)
    assert len(losses(out)) == 4 and losses(out) == pytest.approx(losses(documented_run), rel=1e-5)
    bf16 = tiny_args(tiny_model_dir, nli_files, tmp_path / "bf16", "--ddp_comm_hook", "bf16")
    assert cli(bf16) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: --ddp_comm_hook bf16 needs CUDA")


FSDP_ON_CPU = ["--config_file", "accelerate_configs/fsdp.yaml", "--num_processes", "2", "--gpu_ids", "all",
               "--mixed_precision", "no"]  # fmt: skip


def test_the_fsdp_config_shards_on_cpu_as_ddp_trains_and_resumes_and_exports(
    tiny_model_dir, nli_files, tmp_path
):
    """accelerate_configs/fsdp.yaml on 2 CPU processes: FSDP2 really shards (finetune lifts Accelerate's
    GPU-only gate, and says so in the start line), each rank holding half of the parameters, gradients
    and optimizer state; the losses and weights are DDP's to float tolerance; a sharded checkpoint
    resumes to the unbroken run's bits; the export (the best model: validation labels shifted by one,
    so the best evaluation comes before the last) is a full state dict `pipeline` loads."""
    full, resumed, ddp = tmp_path / "full", tmp_path / "resumed", tmp_path / "ddp"
    nli_files = shifted_validation(nli_files, tmp_path)
    # 8 of the epoch's 19 steps: a checkpoint mid-epoch, evaluations at 4 and 8, a loss logged every 2
    args = ["--max_train_steps", "8", "--checkpointing_steps", "4", "--eval_strategy", "steps",
            "--eval_steps", "4", "--logging_steps", "2"]  # fmt: skip
    done = run_ranks(tiny_args(tiny_model_dir, nli_files, full, *args), FSDP_ON_CPU)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("fsdp=FSDP2 (on CPU: finetune lifts Accelerate's GPU-only gate)") == 1
    two_process(tiny_args(tiny_model_dir, nli_files, ddp, *args))  # cpu_multiprocess.yaml: DDP
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-4", resumed / "checkpoint-4")  # mid-epoch
    # With the best model so far (a run resumed in its own folder finds it there).
    shutil.copytree(full / "best_model", resumed / "best_model")
    done = run_ranks(
        tiny_args(tiny_model_dir, nli_files, resumed, *args, "--resume_from_checkpoint", "auto"), FSDP_ON_CPU
    )
    assert done.returncode == 0, done.stderr[-3000:]
    a, b, c = results_of(full), results_of(resumed), results_of(ddp)
    assert a["world_size"] == b["world_size"] == c["world_size"] == 2
    assert a["global_step"] == b["global_step"] == c["global_step"] == 8
    assert a["distributed_type"] == b["distributed_type"] == "FSDP" and c["distributed_type"] == "MULTI_CPU"
    # Fails the day Accelerate engages FSDP on CPU itself: then finetune's lift can go.
    assert a["fsdp_gate_lifted"] and "fsdp_gate_lifted" not in c
    assert_sharded(a)
    assert losses(full) == pytest.approx(losses(ddp), rel=1e-5) and len(losses(full)) == 4
    assert a["eval_matched_accuracy"] == b["eval_matched_accuracy"] == c["eval_matched_accuracy"]
    assert_same_weights(weights(full), weights(ddp))
    assert all(torch.equal(t, weights(resumed)[name]) for name, t in weights(full).items())  # bitwise
    assert a["best_step"] < 8 and a["exported_model_step"] == a["best_step"]
    root, best = weights(full), weights(full / "best_model")
    assert all(torch.equal(root[name], best[name]) for name in best)
    classify = pipeline("text-classification", model=str(full))  # the export loads as any model does
    label = classify([{"text": "A man sings.", "text_pair": "Someone sings."}])[0]["label"]
    assert label in {"entailment", "neutral", "contradiction"}


def test_fsdp_in_bf16_on_cpu_computes_in_bf16_and_reduces_in_fp32(tiny_model_dir, nli_files, tmp_path):
    """fsdp.yaml's own bf16 on 2 CPU ranks: FSDP2 gathers the parameters in bf16 and reduce-scatters the
    gradients in fp32 (read from its parameter groups inside the run), the shards and the moments stay
    fp32 and so does the export; a sharded checkpoint is written on the way."""
    out = tmp_path / "out"
    launch = FSDP_ON_CPU[: FSDP_ON_CPU.index("--mixed_precision")]  # the config's bf16
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "3", "--checkpointing_steps", "2")
    done = run_ranks(with_flag(args, "--mixed_precision", "auto"), launch)
    assert done.returncode == 0, done.stderr[-3000:]
    results = results_of(out)
    assert results["world_size"] == 2 and results["distributed_type"] == "FSDP"
    assert results["mixed_precision"] == "bf16" and results["global_step"] == 3
    assert_sharded(results)
    assert {(s["param_dtype"], s["reduce_dtype"]) for s in results["fsdp_shards"]} == {
        ("bfloat16", "float32")
    }
    assert {t.dtype for t in weights(out).values()} == {torch.float32}
    assert (out / "checkpoint-2").is_dir()


def test_an_fsdp_config_on_one_process_says_it_has_nothing_to_shard(
    tiny_model_dir, nli_files, tmp_path, monkeypatch, capsys
):
    """`accelerate launch --config_file fsdp.yaml --num_processes 1` on CPU: one process, said in one line."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    results = main(tiny_args(tiny_model_dir, nli_files, tmp_path / "out", "--max_train_steps", "1"))
    assert results["world_size"] == 1 and results["distributed_type"] == "NO"
    said = capsys.readouterr().out
    assert (
        said.count("notice: the accelerate config asks for FSDP, but one process has nothing to shard") == 1
    )

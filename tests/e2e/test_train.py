"""End to end, in process: the real entry point trains a tiny BERT on a few hundred pairs."""

import json
import shutil
import time

import pytest
import torch

from finetune.mnli import cli, main
from finetune.speed.padding_free import padding_free_pays
from tests.helpers import (
    N_TRAIN,
    N_VALIDATION,
    assert_same_weights,
    read_jsonl,
    reference_weights,
    refused,
    reset_accelerate,
    sigterm_in_first_evaluation,
    tiny_args,
    weights,
    without_dropout,
)

RESULT_FIELDS = {
    "eval_matched_accuracy",
    "eval_matched_samples",
    "global_step",
    "epoch",
    "train_runtime_s",
    "train_samples_per_second",
    "train_tokens_per_second",
}
LOG_FIELDS = {"step", "epoch", "loss", "learning_rate", "grad_norm", "samples_per_second"}


def test_results_json_has_the_promised_fields(trained):
    output_dir, results = trained
    saved = json.loads((output_dir / "results.json").read_text())
    assert saved == results
    assert saved.keys() >= RESULT_FIELDS
    assert saved["eval_matched_samples"] == N_VALIDATION
    assert saved["global_step"] == 3 * 38  # ceil(600 / 16) updates per epoch
    assert saved["epoch"] == 3
    assert saved["train_samples_per_second"] > 0 and saved["train_tokens_per_second"] > 0


def test_loss_goes_down_and_every_step_is_logged(trained):
    output_dir, _ = trained
    records = read_jsonl(output_dir / "metrics.jsonl")
    train_lines = [r for r in records if "loss" in r]
    eval_lines = [r for r in records if "eval_matched_accuracy" in r]
    assert all(r.keys() >= LOG_FIELDS for r in train_lines)
    assert [r["step"] for r in train_lines] == [*range(5, 114, 5), 114]
    assert [r["epoch"] for r in eval_lines] == [1, 2, 3]
    assert all(r["eval_matched_samples"] == N_VALIDATION for r in eval_lines)
    # Chance is ln 3 = 1.099; one 5-step line is noisy, so the last epoch's lines are averaged.
    first = train_lines[0]["loss"]
    last_epoch = [r["loss"] for r in train_lines if r["epoch"] > 2]
    assert sum(last_epoch) / len(last_epoch) < 0.8 * first, (first, last_epoch)
    assert eval_lines[-1]["eval_matched_accuracy"] > 0.5  # chance is 1/3


def test_saved_model_loads_in_a_pipeline_and_predicts_label_names(trained, nli_files):
    from transformers import pipeline

    output_dir, _ = trained
    classifier = pipeline("text-classification", model=str(output_dir), device="cpu")
    rows = [json.loads(line) for line in nli_files["validation"].read_text().splitlines()[:20]]
    predictions = classifier([{"text": r["premise"], "text_pair": r["hypothesis"]} for r in rows])
    assert {p["label"] for p in predictions} <= {"entailment", "neutral", "contradiction"}
    assert (output_dir / "model.safetensors").is_file()
    config = json.loads((output_dir / "config.json").read_text())
    assert config["id2label"] == {"0": "entailment", "1": "neutral", "2": "contradiction"}


def test_train_config_json_is_the_resolved_configuration(trained):
    output_dir, _ = trained
    config = json.loads((output_dir / "train_config.json").read_text())
    assert config["num_train_epochs"] == 3 and config["per_device_train_batch_size"] == 16
    assert config["world_size"] == 1 and config["mixed_precision"] == "no"
    assert config["dropout_kernel"] == "packed"  # auto, on CPU
    # auto, on this machine's CPU: the product's rule (tests/unit/test_cpu_classes.py has every class)
    assert config["padding_free"] == ("true" if padding_free_pays("cpu", torch_compile=False) else "false")
    assert config["keep_freed_memory"] == "false"  # auto, in fp32
    assert config["plan"]["total_updates"] == 114


def test_mismatched_split_is_evaluated_when_given(tiny_model_dir, nli_files, tmp_path):
    """The mismatched split (here the first 77 training rows) is scored on its own rows: as an
    evaluate-only run of the exported model scores that file, and unlike the matched split."""
    args = tiny_args(tiny_model_dir, nli_files, tmp_path / "out", "--max_train_steps", "3")
    results = main(
        [*args, "--validation_mismatched_file", str(nli_files["train"]), "--max_eval_samples", "77"]
    )
    assert results["eval_matched_samples"] == 77 and results["eval_mismatched_samples"] == 77
    reset_accelerate()
    alone = main(
        ["--model_name_or_path", str(tmp_path / "out"), "--validation_file", str(nli_files["train"]),
         "--do_train", "false", "--output_dir", str(tmp_path / "eval"), "--report_to", "none",
         "--mixed_precision", "no", "--max_length", "64", "--max_eval_samples", "77"]
    )  # fmt: skip
    assert results["eval_mismatched_loss"] == pytest.approx(alone["eval_matched_loss"], rel=1e-5)
    assert results["eval_mismatched_accuracy"] == alone["eval_matched_accuracy"]
    assert results["eval_mismatched_loss"] != pytest.approx(results["eval_matched_loss"], rel=1e-3)
    logged = [r for r in read_jsonl(tmp_path / "out" / "metrics.jsonl") if "eval_matched_loss" in r]
    assert logged and all(r["eval_mismatched_samples"] == 77 for r in logged)


def test_partial_accumulation_window_is_scaled_by_its_real_size(tiny_model_dir, nli_files, tmp_path):
    """10 pairs as micro-batches 4+4 | 2 (accumulation 2) must update exactly like batches 8 | 2.

    The last window holds one micro-batch of 2 pairs: dividing its sum by the nominal 8 pairs of a
    window (what plain `accelerate.accumulate`, HF Trainer and Lightning do) shrinks that step 4x.
    """
    model_dir = without_dropout(tiny_model_dir, tmp_path / "model")
    accumulated = tmp_path / "accumulated"
    main(tiny_args(model_dir, nli_files, accumulated, "--max_train_samples", "10", "--learning_rate", "1e-2",
                   "--lr_scheduler_type", "constant", "--warmup_ratio", "0", "--max_grad_norm", "0",
                   "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2"))  # fmt: skip
    assert_same_weights(
        weights(accumulated), reference_weights(model_dir, nli_files, [range(8), range(8, 10)], 1e-2, 4)
    )


def test_warmup_steps_ramp_the_learning_rate_then_the_schedule_decays_it(tiny_model_dir, nli_files, tmp_path):
    out = tmp_path / "out"
    flags = ["--max_train_steps", "6", "--logging_steps", "1", "--warmup_steps", "3", "--warmup_ratio", "0.5"]
    main(tiny_args(tiny_model_dir, nli_files, out, *flags))
    rates = [r["learning_rate"] for r in read_jsonl(out / "metrics.jsonl") if "learning_rate" in r]
    peak = 3e-3  # tiny_args' --learning_rate; linear warmup over 3 steps, then linear decay to 0
    assert rates == pytest.approx([peak / 3, 2 * peak / 3, peak, 2 * peak / 3, peak / 3, 0.0])


def test_adam_flags_reach_the_optimizer(tiny_model_dir, nli_files, tmp_path):
    groups = []

    def build(*launch):
        from finetune.run import setup

        run = setup(*launch)
        groups.extend({"betas": g["betas"], "eps": g["eps"]} for g in run.optimizer.param_groups)
        return run

    flags = [
        "--max_train_steps",
        "1",
        "--adam_beta1",
        "0.8",
        "--adam_beta2",
        "0.98",
        "--adam_epsilon",
        "1e-6",
    ]
    main(tiny_args(tiny_model_dir, nli_files, tmp_path / "out", *flags), build)
    assert groups and all(g == {"betas": (0.8, 0.98), "eps": 1e-6} for g in groups)


def test_resume_mid_epoch_ends_bitwise_equal(tiny_model_dir, nli_files, tmp_path):
    """Stop-and-resume from a mid-epoch checkpoint ends with the same weights as an unbroken run."""
    full = tmp_path / "full"
    args = ["--num_train_epochs", "2", "--checkpointing_steps", "25"]
    main(tiny_args(tiny_model_dir, nli_files, full, *args))
    reset_accelerate()
    assert sorted(p.name for p in full.glob("checkpoint-*")) == [
        "checkpoint-25",
        "checkpoint-50",
        "checkpoint-75",
    ]

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-25", resumed / "checkpoint-25")  # step 25 of 38: mid-epoch 0
    results = main(tiny_args(tiny_model_dir, nli_files, resumed, *args, "--resume_from_checkpoint", "auto"))
    assert results["global_step"] == 76
    a, b = weights(full), weights(resumed)
    assert all(torch.equal(a[name], b[name]) for name in a)
    after = [r for r in read_jsonl(resumed / "metrics.jsonl") if "loss" in r]
    before = {r["step"]: r["loss"] for r in read_jsonl(full / "metrics.jsonl") if "loss" in r}
    assert after and all(r["loss"] == before[r["step"]] for r in after)


def test_sigterm_during_evaluation_abandons_it_and_resumes_exactly(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    """Preemption while evaluating: the evaluation is dropped, not finished, the finished epoch is
    checkpointed within seconds, and the resumed run evaluates again and ends as an unbroken run."""
    args = ["--num_train_epochs", "2"]
    full = tmp_path / "full"
    main(tiny_args(tiny_model_dir, nli_files, full, *args))
    reset_accelerate()

    signalled_at = []
    build = sigterm_in_first_evaluation(signalled_at)

    killed = tmp_path / "killed"
    assert cli(tiny_args(tiny_model_dir, nli_files, killed, *args), build) == 143
    assert time.perf_counter() - signalled_at[0] < 10  # a preemption notice gives ~30 s
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"stopped by SIGTERM after step 38; checkpoint saved to {killed / 'checkpoint-38'}; "
        "continue with the same command plus --resume_from_checkpoint auto"
    )
    assert not [r for r in read_jsonl(killed / "metrics.jsonl") if "eval_matched_accuracy" in r]
    reset_accelerate()

    results = main(tiny_args(tiny_model_dir, nli_files, killed, *args, "--resume_from_checkpoint", "auto"))
    assert results["global_step"] == 76
    assert [r["step"] for r in read_jsonl(killed / "metrics.jsonl") if "eval_matched_accuracy" in r] == [
        38,
        76,
    ]
    a, b = weights(full), weights(killed)
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_save_total_limit_keeps_the_newest(tiny_model_dir, nli_files, tmp_path):
    out = tmp_path / "out"
    main(tiny_args(tiny_model_dir, nli_files, out, "--checkpointing_steps", "10", "--save_total_limit", "2"))
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-20", "checkpoint-30"]
    assert not list(out.glob(".checkpoint-*"))


def test_refuses_to_overwrite_a_finished_run(trained, tiny_model_dir, nli_files):
    output_dir, _ = trained
    before = (output_dir / "results.json").read_bytes()
    with refused("--num_train_epochs", "--overwrite_output_dir"):  # the flag that differs, named
        main(tiny_args(tiny_model_dir, nli_files, output_dir))
    assert (output_dir / "results.json").read_bytes() == before


def test_tensorboard_tracker_writes_events(tiny_model_dir, nli_files, tmp_path):
    """--report_to tensorboard: every number of every metrics.jsonl line is a TensorBoard scalar under
    its own name at that line's step (and no W&B run is started). Merges test_tracker_selection's
    tensorboard case, which trained the same run to check only that an event file existed."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "5")
    main([*args[: args.index("--report_to")], "--report_to", "tensorboard"])
    assert not list(out.glob("wandb/offline-run-*"))
    logged = {}
    for events in {path.parent for path in out.rglob("events.out.tfevents.*")}:
        accumulator = EventAccumulator(str(events)).Reload()
        for tag in accumulator.Tags()["scalars"]:
            logged.setdefault(tag, []).extend((e.step, e.value) for e in accumulator.Scalars(tag))
    expected = {}
    for record in read_jsonl(out / "metrics.jsonl"):
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                expected.setdefault(key, []).append((record["step"], value))
    assert {"loss", "learning_rate", "grad_norm", "eval_matched_accuracy"} <= expected.keys()
    assert logged.keys() >= expected.keys(), sorted(expected.keys() - logged.keys())
    for key, points in expected.items():
        assert [step for step, _ in logged[key]] == [step for step, _ in points], key
        assert [value for _, value in logged[key]] == pytest.approx([v for _, v in points], rel=1e-6), key


def test_mfu_is_logged_against_the_given_peak(trained, tiny_model_dir, nli_files, tmp_path):
    from transformers import AutoModelForSequenceClassification

    from finetune.model.flops import non_embedding_parameters

    assert "train_mfu" not in trained[1]  # no peak given, no guess
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "10", "--peak_tflops", "0.5")
    results = main(args)
    n = non_embedding_parameters(AutoModelForSequenceClassification.from_pretrained(tiny_model_dir))
    assert 0 < n < 40_000  # 2 layers of hidden 32; the 30k-token embedding table is not counted
    assert results["train_mfu"] == pytest.approx(6 * n * results["train_tokens_per_second"] / 0.5e12)
    lines = [r for r in read_jsonl(out / "metrics.jsonl") if "loss" in r]
    assert len(lines) == 2
    assert all(r["mfu"] == pytest.approx(6 * n * r["tokens_per_second"] / 0.5e12) for r in lines)


def test_a_second_run_in_one_process_takes_its_own_precision(tiny_model_dir, nli_files, tmp_path):
    """A notebook's second run: Accelerate's process-wide state outlived the first, so an Accelerator asking
    another precision was refused ("AcceleratorState has already been initialized"). It bit where
    --mixed_precision auto resolves to bf16 (AMX and AVX512-BF16 CPUs, GPUs) after a run in fp32."""
    first = main(tiny_args(tiny_model_dir, nli_files, tmp_path / "fp32", "--max_train_steps", "2"))
    second = main(tiny_args(tiny_model_dir, nli_files, tmp_path / "bf16", "--max_train_steps", "2",
                            "--mixed_precision", "bf16"))  # fmt: skip
    assert (first["mixed_precision"], second["mixed_precision"]) == ("no", "bf16")


@pytest.mark.slow
def test_torch_compile_trains_exports_and_resumes_with_or_without_compile(
    tiny_model_dir, nli_files, tmp_path, capsys, monkeypatch
):
    """Compiled (~1-2 min on CPU): the exported weights carry the model's own names (no compile
    wrapper prefix), have trained, and evaluate to the accuracy the run reported. Its checkpoint
    resumes compiled, or eager to debug it: weights and optimizer state load under the model's own
    names and the run ends where the unbroken one did. Dropout is off: inductor draws its masks from
    its own generator, so eager would draw others.

    The compile cache line: with an inductor cache folder of this test's own, the first run misses;
    the resumed one, dynamo's in-process state cleared as a new process starts, is served by the
    cache. Nothing from earlier runs or tests (the user's /tmp cache, dynamo's caches, inductor's
    process-wide counters, which the line reads) can decide either."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))

    def as_a_new_process():
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()

    model_dir = without_dropout(tiny_model_dir, tmp_path / "model")
    full = tmp_path / "full"
    # One shape (rows padded to --max_length, padding-free layers off): one compilation per run.
    args = ["--max_train_steps", "6", "--checkpointing_steps", "3", "--logging_steps", "1",
            "--padding_free", "false", "--pad_to_multiple_of", "64"]  # fmt: skip
    as_a_new_process()
    capsys.readouterr()
    results = main(tiny_args(model_dir, nli_files, full, *args, "--torch_compile"))
    reset_accelerate()
    assert "torch.compile: compile cache missed" in capsys.readouterr().out
    assert results["global_step"] == 6
    trained_weights, initial = weights(full), weights(model_dir)
    assert trained_weights.keys() == initial.keys()
    assert not torch.equal(trained_weights["classifier.weight"], initial["classifier.weight"])
    evaluated = main(
        ["--model_name_or_path", str(full), "--validation_file", str(nli_files["validation"]),
         "--do_train", "false", "--output_dir", str(tmp_path / "eval"), "--report_to", "none",
         "--mixed_precision", "no", "--max_length", "64"]
    )  # fmt: skip
    reset_accelerate()
    assert evaluated["eval_matched_accuracy"] == results["eval_matched_accuracy"]
    for compile_flags in (["--torch_compile"], []):
        resumed = tmp_path / f"resumed{len(compile_flags)}"
        resumed.mkdir()
        shutil.copytree(full / "checkpoint-3", resumed / "checkpoint-3")
        flags = [*args, "--resume_from_checkpoint", "auto", *compile_flags]
        as_a_new_process()
        capsys.readouterr()
        results = main(tiny_args(model_dir, nli_files, resumed, *flags))
        reset_accelerate()
        assert results["global_step"] == 6
        line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("torch.compile:")]
        if compile_flags:  # the same shapes as the first run: inductor's cache serves them, and says so
            assert len(line) == 1 and "compile cache hit" in line[0], line
        else:
            assert not line  # eager: nothing compiled, nothing to report
        assert [r["step"] for r in read_jsonl(resumed / "metrics.jsonl") if "loss" in r] == [4, 5, 6]
        assert_same_weights(weights(resumed), weights(full))
    torch._dynamo.reset()  # no compiled graph of this test's models outlives it


def test_resume_mid_log_window_logs_and_totals_as_the_unbroken_run(tiny_model_dir, nli_files, tmp_path):
    """Checkpoint at step 25, lines every 10 steps: the resumed run's line at 30 covers steps 21-30 as
    the unbroken run's does (the checkpoint keeps the open window's sums); results.json counts every
    pair trained and the training seconds of both segments."""
    args = ["--logging_steps", "10", "--checkpointing_steps", "25"]  # 38 steps in the epoch
    full = tmp_path / "full"
    expected = main(tiny_args(tiny_model_dir, nli_files, full, *args))
    reset_accelerate()
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-25", resumed / "checkpoint-25")
    before_s = json.loads((resumed / "checkpoint-25" / "trainer_state.json").read_text())["train_runtime_s"]
    tic = time.perf_counter()
    results = main(tiny_args(tiny_model_dir, nli_files, resumed, *args, "--resume_from_checkpoint", "auto"))
    segment_wall_s = time.perf_counter() - tic

    after = [(r["step"], r["loss"]) for r in read_jsonl(resumed / "metrics.jsonl") if "loss" in r]
    lines = {r["step"]: r["loss"] for r in read_jsonl(full / "metrics.jsonl") if "loss" in r}
    assert [step for step, _ in after] == [30, 38]
    assert all(loss == pytest.approx(lines[step], rel=1e-6, abs=0) for step, loss in after), (after, lines)
    assert results["train_samples"] == expected["train_samples"] == N_TRAIN  # one epoch
    # The whole run's seconds: the first segment's (up to its checkpoint) plus this one's.
    assert 0 < before_s < results["train_runtime_s"] < before_s + segment_wall_s
    assert results["train_samples_per_second"] == results["train_samples"] / results["train_runtime_s"]

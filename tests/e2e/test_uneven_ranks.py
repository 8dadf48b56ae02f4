"""Row counts that divide neither the batch nor the world size, on 2 real processes (gloo), in every
family: each row is trained once an epoch (a rank the last global batch leaves without a row runs a
placeholder weighing nothing), so every update's loss and gradient norm are one process's with the same
global batch and plain PyTorch's, train_samples is the row count, each evaluation row counts once, and a
run resumed mid-epoch ends bitwise equal. (Classification's updates against plain PyTorch's weights:
tests/e2e/test_distributed.py.)"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from finetune.families.token_classification.tags import label_order
from finetune.mnli import main
from tests.e2e.test_sft import chat, keeping_packs, sft_args  # noqa: F401  (chat: that module's fixture)
from tests.e2e.test_sft import reference_loss_and_norm as lm_reference
from tests.e2e.test_tagging import reference_loss_and_norm as tag_reference
from tests.e2e.test_tagging import tag_args
from tests.helpers import read_jsonl, tiny_args, weights, with_flag, without_dropout
from tests.tagging_data import sentences, tiny_tagger, write_jsonl
from tests.warm_ranks import run_ranks

pytestmark = pytest.mark.multiprocess
ROWS = 13


def updates(out) -> list[dict]:
    return [r for r in read_jsonl(out / "metrics.jsonl") if "loss" in r]


def results_of(out) -> dict:
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def thirteen(chat, tmp_path_factory):  # noqa: F811
    """The SFT fixture with its first 13 training rows."""
    path = tmp_path_factory.mktemp("thirteen") / "train.jsonl"
    path.write_text("".join(line + "\n" for line in chat["train"].read_text().splitlines()[:ROWS]))
    return {**chat, "train": path}


def test_sft_updates_on_two_ranks_are_one_process_updates(thirteen, tmp_path):
    """13 rows, 1 process x 6 x 2 and 2 processes x 3 x 2: the updates hold 12 rows, then 1 (rank 1 runs a
    placeholder); the same loss and gradient norm at each, 13 training rows, and the 7 validation rows
    (odd: one rank's last batch is evened out by Accelerate, gather_for_metrics drops it) once each."""
    flags = ("--num_train_epochs", "1", "--logging_steps", "1", "--learning_rate", "3e-3",
             "--gradient_accumulation_steps", "2", "--per_device_eval_batch_size", "2")  # fmt: skip
    one, two = tmp_path / "one", tmp_path / "two"
    main(sft_args(thirteen, one, *flags, "--per_device_train_batch_size", "6"))
    done = run_ranks(sft_args(thirteen, two, *flags, "--per_device_train_batch_size", "3"))
    assert done.returncode == 0, done.stderr[-3000:]
    results = [results_of(out) for out in (one, two)]
    assert [r["world_size"] for r in results] == [1, 2]
    assert [(r["train_samples"], r["global_step"]) for r in results] == [(ROWS, 2)] * 2
    first, second = updates(one), updates(two)
    assert [u["loss"] for u in second] == pytest.approx([u["loss"] for u in first], rel=1e-5)
    assert [u["grad_norm"] for u in second] == pytest.approx([u["grad_norm"] for u in first], rel=1e-4)
    assert [r["eval_samples"] for r in results] == [7, 7]
    assert results[1]["eval_loss"] == pytest.approx(results[0]["eval_loss"], rel=1e-5)


def test_a_packed_update_on_two_ranks_is_plain_pytorch_mean_over_every_target_token(thirteen, tmp_path):
    """--packing: the 13 rows in a few packs of up to 256 tokens, one pack per rank and micro-batch, all in
    one update (an odd count of packs leaves rank 1 a placeholder): plain PyTorch's loss and gradient norm
    on the rows alone; train_samples counts the 13 documents."""
    flags = ("--packing", "--max_train_steps", "1", "--logging_steps", "1", "--learning_rate", "1e-6",
             "--eval_strategy", "no", "--per_device_train_batch_size", "1",
             "--gradient_accumulation_steps", "8")  # fmt: skip
    packs = []
    main(with_flag(sft_args(thirteen, tmp_path / "one", *flags), "--max_length", "256"), keeping_packs(packs))
    assert sum(len(pack) for pack in packs) == ROWS and len(packs) % 2 == 1  # so a placeholder runs
    two = tmp_path / "two"
    done = run_ranks(with_flag(sft_args(thirteen, two, *flags), "--max_length", "256"))
    assert done.returncode == 0, done.stderr[-3000:]
    results = results_of(two)
    assert (results["world_size"], results["train_samples"], results["global_step"]) == (2, ROWS, 1)
    loss, norm = lm_reference(thirteen, max_length=256)
    assert updates(two)[0]["loss"] == pytest.approx(loss, rel=1e-5)
    assert updates(two)[0]["grad_norm"] == pytest.approx(norm, rel=1e-4)


def test_a_tagging_update_on_two_ranks_is_plain_pytorch_mean_over_every_labelled_sub_token(tmp_path):
    """13 sentences, 2 processes x 6 x 2: one update of 12 sentences and 1 (rank 1 runs a placeholder);
    1 process x 13 and plain PyTorch give its loss and gradient norm; the 15 validation sentences once."""
    rows = sentences(ROWS, seed=2)
    labels = label_order(tag for row in rows for tag in row["ner_tags"])
    ner = {"model": tiny_tagger(tmp_path / "bert", labels),  # its head kept: the run's tags are these
           "train": write_jsonl(tmp_path / "train.jsonl", rows),
           "validation": write_jsonl(tmp_path / "validation.jsonl", sentences(15, seed=1))}  # fmt: skip
    flags = ("--max_train_steps", "1", "--logging_steps", "1", "--learning_rate", "1e-3",
             "--eval_strategy", "steps", "--eval_steps", "1", "--label_all_tokens",
             "--per_device_eval_batch_size", "4")  # fmt: skip
    one, two = tmp_path / "one", tmp_path / "two"
    main(tag_args(ner, one, *flags, "--per_device_train_batch_size", str(ROWS)))
    done = run_ranks(tag_args(ner, two, *flags, "--per_device_train_batch_size", "6",
                              "--gradient_accumulation_steps", "2"))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = [results_of(out) for out in (one, two)]
    assert [r["world_size"] for r in results] == [1, 2]
    assert [r["train_samples"] for r in results] == [ROWS, ROWS]  # each sentence fits one window
    loss, norm = tag_reference(ner["model"], rows)
    for out in (one, two):
        assert updates(out)[0]["loss"] == pytest.approx(loss, rel=1e-5)
        assert updates(out)[0]["grad_norm"] == pytest.approx(norm, rel=1e-4)
    assert [r["eval_samples"] for r in results] == [15, 15]
    assert results[1]["eval_f1"] == pytest.approx(results[0]["eval_f1"], abs=1e-12)
    assert results[1]["eval_loss"] == pytest.approx(results[0]["eval_loss"], rel=1e-5)


def test_a_run_resumed_mid_epoch_with_a_placeholder_ends_bitwise_equal(tiny_model_dir, nli_files, tmp_path):
    """13 pairs on 2 ranks x 2: 4 micro-batches an epoch, rank 1's last a placeholder; 2 epochs, a
    checkpoint every 3 steps (mid-epoch). Resumed from checkpoint-3, the run ends with the unbroken run's
    weights, bit for bit, and both count 26 training rows."""
    model_dir = without_dropout(tiny_model_dir, tmp_path / "model")
    flags = ("--max_train_samples", str(ROWS), "--per_device_train_batch_size", "2",
             "--num_train_epochs", "2", "--checkpointing_steps", "3", "--eval_strategy", "no")  # fmt: skip
    unbroken, out = tmp_path / "unbroken", tmp_path / "out"
    done = run_ranks(tiny_args(model_dir, nli_files, unbroken, *flags))
    assert done.returncode == 0, done.stderr[-3000:]
    out.mkdir()
    shutil.copytree(unbroken / "checkpoint-3", out / "checkpoint-3")
    resumed = run_ranks(tiny_args(model_dir, nli_files, out, *flags, "--resume_from_checkpoint", "auto"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {out / 'checkpoint-3'} at step 3" in resumed.stdout
    results = [results_of(folder) for folder in (unbroken, out)]
    assert [(r["world_size"], r["global_step"], r["train_samples"]) for r in results] == [(2, 8, 26)] * 2
    a, b = weights(unbroken), weights(out)
    assert a.keys() == b.keys() and [name for name in a if not torch.equal(a[name], b[name])] == []

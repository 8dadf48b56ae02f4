"""Memory controls: --auto_find_batch_size keeps the global batch and the results; gradient
checkpointing changes no result and trains with frozen embeddings (as under LoRA)."""

from __future__ import annotations

import json

import pytest

from finetune.mnli import main
from tests.helpers import (
    assert_same_weights,
    reset_accelerate,
    tiny_args,
    weights,
)
from tests.probes.out_of_memory_above import out_of_memory_above
from tests.warm_ranks import run_ranks

FITS_ROWS = 4  # the probe's device "has memory" for this many training rows per forward


def test_auto_find_batch_size_halves_the_batch_and_keeps_the_results(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    steps = ["--max_train_steps", "3", "--max_train_samples", "96"]
    probe = out_of_memory_above(FITS_ROWS)
    try:
        found = main(
            tiny_args(tiny_model_dir, nli_files, tmp_path / "auto", *steps, "--auto_find_batch_size", "true")
        )
    finally:
        probe.remove()
    assert (
        "auto_find_batch_size: out of memory at --per_device_train_batch_size 16; training at 4 with "
        "--gradient_accumulation_steps 4 (same global batch)"
    ) in capsys.readouterr().out
    resolved = json.loads((tmp_path / "auto" / "train_config.json").read_text())
    assert resolved["per_device_train_batch_size"] == 4 and resolved["gradient_accumulation_steps"] == 4
    assert resolved["plan"]["global_batch_size"] == 16 and resolved["plan"]["total_updates"] == 3
    reset_accelerate()
    # The same run started at the batch it chose: same data order, dropout masks, steps and weights.
    flags = ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "4"]
    direct = main(tiny_args(tiny_model_dir, nli_files, tmp_path / "direct", *steps, *flags))
    assert found["global_step"] == direct["global_step"] == 3
    assert found["eval_matched_accuracy"] == direct["eval_matched_accuracy"]
    assert_same_weights(weights(tmp_path / "auto"), weights(tmp_path / "direct"))


def test_auto_find_batch_size_keeps_a_batch_that_fits(tiny_model_dir, nli_files, tmp_path, capsys):
    steps = ["--max_train_steps", "1", "--max_train_samples", "32", "--auto_find_batch_size", "true"]
    main(tiny_args(tiny_model_dir, nli_files, tmp_path / "out", *steps))
    assert "auto_find_batch_size: --per_device_train_batch_size 16 fits" in capsys.readouterr().out


def test_gradient_checkpointing_changes_no_result(tiny_model_dir, nli_files, tmp_path):
    # Dropout on (packed kernel, padding-free layers): recomputation must redraw the same masks.
    # padding-free asked for: auto leaves it off on CPUs with AMX.
    steps = ["--max_train_steps", "3", "--max_train_samples", "48", "--padding_free", "true"]
    main(tiny_args(tiny_model_dir, nli_files, tmp_path / "plain", *steps))
    reset_accelerate()
    main(
        tiny_args(
            tiny_model_dir, nli_files, tmp_path / "recomputed", *steps, "--gradient_checkpointing", "true"
        )
    )
    resolved = json.loads((tmp_path / "recomputed" / "train_config.json").read_text())
    assert resolved["gradient_checkpointing"] is True and resolved["padding_free"] == "true"
    assert_same_weights(weights(tmp_path / "plain"), weights(tmp_path / "recomputed"))


@pytest.mark.parametrize("family", ["llama"])
def test_gradient_checkpointing_on_a_decoder(family, tmp_path, nli_files):
    from tests.backbones import build_tiny

    model_dir = build_tiny(family, tmp_path / "model")
    steps = ["--max_train_steps", "2", "--max_train_samples", "32", "--gradient_checkpointing", "true"]
    results = main(tiny_args(model_dir, nli_files, tmp_path / "out", *steps))
    assert results["global_step"] == 2


@pytest.mark.multiprocess
def test_auto_find_batch_size_ranks_agree_on_the_smallest_fit(tiny_model_dir, nli_files, tmp_path):
    # Rank 0 fits 8 rows, rank 1 only 4: both must train at 4 (one global batch, one step plan).
    out = tmp_path / "out"
    flags = ["--auto_find_batch_size", "true", "--max_train_steps", "2", "--max_train_samples", "96"]
    args = tiny_args(tiny_model_dir, nli_files, out, *flags)
    done = run_ranks(args, script="tests/probes/out_of_memory_above.py", env={"FITS_ROWS": "8,4"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "training at 4 with --gradient_accumulation_steps 4 (same global batch)" in done.stdout
    resolved = json.loads((out / "train_config.json").read_text())
    assert resolved["world_size"] == 2 and resolved["plan"]["global_batch_size"] == 32
    assert resolved["per_device_train_batch_size"] == 4 and resolved["gradient_accumulation_steps"] == 4
    assert json.loads((out / "results.json").read_text())["global_step"] == 2

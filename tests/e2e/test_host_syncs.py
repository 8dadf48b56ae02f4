"""The hot path never waits for the device: no host read of a tensor between log lines."""

from __future__ import annotations

import contextlib
import traceback

import pytest
import torch

from finetune.mnli import cli, main
from tests.backbones import build_tiny
from tests.helpers import tiny_args, with_fault

READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__")
# Where the loop reads the device on purpose, at most once per log line, checkpoint or epoch.
ALLOWED = {"_train_record", "_raise_if_diverged", "flush", "_save", "_evaluate_and_keep_best"}


@contextlib.contextmanager
def host_reads():
    """Every host read of a tensor made by finetune/training/loop.py's train() outside ALLOWED and outside
    data loading (the sampler and collator work on CPU tensors by design), as stack summaries."""
    reads: list[str] = []
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counting(name):
        original = originals[name]

        def read(self, *args, **kwargs):
            frames = traceback.extract_stack()[:-1]
            in_step = any(f.name == "train" and f.filename.endswith("training/loop.py") for f in frames)
            excused = any(
                f.name in ALLOWED or "torch/utils/data" in f.filename or "finetune/data/" in f.filename
                for f in frames
            )
            if in_step and not excused:
                reads.append(f"Tensor.{name} at " + " < ".join(f"{f.name}:{f.lineno}" for f in frames[-4:]))
            return original(self, *args, **kwargs)

        return read

    for name in READS:
        setattr(torch.Tensor, name, counting(name))
    try:
        yield reads
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


@pytest.mark.parametrize("padding_free", ["false", "varlen"])
def test_no_host_reads_between_log_lines(padding_free, tiny_model_dir, nli_files, tmp_path):
    """38 optimizer steps with one log line (the last step), the epoch's short last window
    included: zero host reads of a tensor outside the log line, evaluation and checkpoint. With one
    process the stop-signal check reads a Python flag; with several it is one all-reduce and read per
    step (StopSignals.requested), the one wait left on the hot path."""
    args = tiny_args(tiny_model_dir, nli_files, tmp_path / "out", "--logging_steps", "1000",
                     "--padding_free", padding_free, "--pad_to_multiple_of", "16")  # fmt: skip
    with host_reads() as reads:
        results = main(args)
    assert results["global_step"] == 38
    assert reads == []


def test_no_host_reads_with_a_decoder(nli_files, tmp_path):
    """A Llama: transformers' causal mask asks whether the batch holds padding (to use is_causal) unless
    the mask is always built, as with bucketed lengths; --cuda_graphs's checked warm-up counts that as a
    wait for the device."""
    model = build_tiny("llama", tmp_path / "llama")
    args = tiny_args(
        model, nli_files, tmp_path / "out", "--logging_steps", "1000", "--pad_to_multiple_of", "16"
    )
    with host_reads() as reads:
        main(args)
    assert reads == []


def test_nan_far_from_a_log_line_fails_naming_its_step_and_saves_nothing(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    """NaN logits from micro-batch 7 on, no log line until the last step: the step is skipped on the
    device, the flag is read before the epoch's evaluation, and the run fails naming step 7; no
    best_model/ or exported weights are written."""
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--logging_steps", "1000", "--pad_to_multiple_of", "16")
    assert cli(args, with_fault("nan", at_micro_batch=7)) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: the loss became NaN or inf at step 7; the last good checkpoint is none")
    assert not (out / "best_model").exists() and not (out / "model.safetensors").exists()

"""The hot path never waits for the device: no host read of a tensor between log lines."""

from __future__ import annotations

import contextlib
import traceback

import pytest
import torch

from finetune.mnli import main
from tests.helpers import tiny_args

READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__")
# Where the loop reads the device on purpose, at most once per log line, checkpoint or epoch.
ALLOWED = {"_train_record", "_raise_if_diverged", "flush", "_save", "_evaluate_and_keep_best"}


@contextlib.contextmanager
def host_reads():
    """Every host read of a tensor made by finetune/loop.py's train() outside ALLOWED and outside
    data loading (the sampler and collator work on CPU tensors by design), as stack summaries."""
    reads: list[str] = []
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counting(name):
        original = originals[name]

        def read(self, *args, **kwargs):
            frames = traceback.extract_stack()[:-1]
            in_step = any(f.name == "train" and f.filename.endswith("finetune/loop.py") for f in frames)
            excused = any(
                f.name in ALLOWED
                or "torch/utils/data" in f.filename
                or f.filename.endswith("finetune/data.py")
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

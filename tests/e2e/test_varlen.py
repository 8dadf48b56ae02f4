"""--padding_free varlen, end to end: a run trains. The attention itself: tests/unit/test_varlen.py."""

from __future__ import annotations

from finetune.mnli import main
from tests.helpers import tiny_args


def test_varlen_training_runs_end_to_end(tiny_model_dir, nli_files, tmp_path):
    """A whole run (training, evaluation on the same packed path, export) with --padding_free varlen
    on CPU: every step taken, every evaluation row counted once; the export loads without this package."""
    varlen = main(tiny_args(tiny_model_dir, nli_files, tmp_path / "varlen", "--padding_free", "varlen",
                            "--pad_to_multiple_of", "16"))  # fmt: skip
    assert varlen["global_step"] == 38
    assert varlen["eval_matched_samples"] == 151
    assert 0.0 <= varlen["eval_matched_accuracy"] <= 1.0
    from transformers import AutoModelForSequenceClassification

    exported = AutoModelForSequenceClassification.from_pretrained(tmp_path / "varlen")  # plain transformers
    assert not exported.config._attn_implementation.startswith("finetune")

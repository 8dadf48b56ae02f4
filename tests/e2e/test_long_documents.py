"""--long_documents sliding_window end to end: documents of 400-800 tokens whose label one verdict sentence
decides, placed anywhere; the tiny BERT at --max_length 128 reads it only through windows. Documents are
counted once on 2 processes, and finetune.long_documents.score_document gives predictions.jsonl's lines.
--window_loss_weighting document, on short and long documents, resumes and accumulates exactly.

The windows and the grouping alone: tests/unit/test_windows.py."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from finetune.errors import ConfigError
from finetune.long_documents import score_document
from finetune.mnli import main
from tests.e2e.test_distributed import two_process
from tests.helpers import read_jsonl, reset_accelerate, weights, without_dropout
from tests.task_data import write_long_documents, write_mixed_length_documents

N_TRAIN, N_VALIDATION = 160, 60


def long_args(model_dir, files, output_dir, *extra: str) -> list[str]:
    return [
        "--model_name_or_path", str(model_dir), "--task_name", "custom", "--text_columns", "text",
        "--train_file", str(files["train"]), "--validation_file", str(files["validation"]),
        "--output_dir", str(output_dir), "--per_device_train_batch_size", "16", "--learning_rate", "3e-3",
        "--num_train_epochs", "3", "--max_length", "128", "--logging_steps", "50", "--mixed_precision", "no",
        "--report_to", "none", "--save_plots", "false", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_long_documents(tmp_path_factory.mktemp("long"), N_TRAIN, N_VALIDATION)


@pytest.fixture(scope="module")
def runs(tiny_model_dir, files, tmp_path_factory):
    """The same training truncated and windowed (max of the windows; predictions of the validation
    documents): {strategy: (output_dir, results)}."""
    found = {}
    windowed = ["--long_documents", "sliding_window", "--window_aggregation", "max"]
    predict = ["--do_predict", "--test_file", str(files["validation"])]
    for name, extra in (("truncate", []), ("sliding_window", [*windowed, *predict])):
        out = tmp_path_factory.mktemp(name) / "out"
        found[name] = out, main(long_args(tiny_model_dir, files, out, *extra))
        reset_accelerate()
    return found


def test_windows_find_the_verdict_that_truncation_cuts_off(runs):
    (_, truncated), (out, windowed) = runs["truncate"], runs["sliding_window"]
    assert truncated["eval_accuracy"] <= 0.7  # balanced labels: near chance
    assert windowed["eval_accuracy"] >= 0.9
    assert windowed["eval_samples"] == truncated["eval_samples"] == N_VALIDATION  # documents, not windows
    assert windowed["train_samples"] > 4 * truncated["train_samples"]  # each window one example
    predictions = read_jsonl(out / "predictions.jsonl")
    assert [p["row"] for p in predictions] == list(range(N_VALIDATION))
    assert min(p["windows"] for p in predictions) >= 4
    recorded = json.loads((out / "train_config.json").read_text())
    assert (recorded["long_documents"], recorded["doc_stride"], recorded["window_aggregation"]) == (
        "sliding_window", None, "max",
    )  # fmt: skip
    assert recorded["identity"]["long_documents"] == "sliding_window"
    assert "sliding windows of 128 tokens overlapping by 32" in (out / "README.md").read_text()


def test_score_document_gives_the_lines_of_predictions_jsonl(runs, files):
    out, _ = runs["sliding_window"]
    documents = read_jsonl(files["validation"])
    for line in read_jsonl(out / "predictions.jsonl")[:8]:
        alone = score_document(out, documents[line["row"]]["text"])  # settings from train_config.json
        assert alone["label"] == line["label"] and alone["windows"] == line["windows"]
        assert alone["probabilities"] == pytest.approx(line["probabilities"], abs=1e-5)


@pytest.mark.multiprocess
def test_two_processes_count_every_document_once(runs, files, tmp_path):
    """Evaluate-only on 2 ranks (the windowing read back from train_config.json): the documents' count
    and metrics of 1 process, and each document's prediction as it gets scored alone."""
    model, _ = runs["sliding_window"]
    evaluate = ["--do_train", "false", "--do_predict", "--test_file", str(files["validation"])]
    evaluate += ["--per_device_eval_batch_size", "7"]  # windows of a document split across batches, ranks
    one = main(long_args(model, files, tmp_path / "one", *evaluate))
    reset_accelerate()
    two_process(long_args(model, files, tmp_path / "two", *evaluate), script="finetune/glue.py")
    two = json.loads((tmp_path / "two" / "results.json").read_text())
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert two["eval_samples"] == one["eval_samples"] == N_VALIDATION
    assert two["predict_samples"] == N_VALIDATION
    for key in ("eval_accuracy", "eval_f1_macro", "eval_loss"):
        assert two[key] == pytest.approx(one[key], abs=1e-5)
    documents = read_jsonl(files["validation"])
    predictions = read_jsonl(tmp_path / "two" / "predictions.jsonl")
    assert [p["row"] for p in predictions] == list(range(N_VALIDATION))
    for line in predictions[::6]:
        alone = score_document(model, documents[line["row"]]["text"])
        assert alone["label"] == line["label"] and alone["windows"] == line["windows"]
        assert alone["probabilities"] == pytest.approx(line["probabilities"], abs=1e-5)


WEIGHTED = ["--long_documents", "sliding_window", "--max_train_steps", "4", "--group_by_length", "false"]
WEIGHTED += ["--eval_strategy", "no"]  # the same windows in every update, however they are split


@pytest.fixture(scope="module")
def weighted(tiny_model_dir, tmp_path_factory):
    """--window_loss_weighting document (the default) on short and long documents, dropout off (other
    batch splits draw other masks), 4 steps, a checkpoint every 2: (model, files, output_dir)."""
    folder = tmp_path_factory.mktemp("weighted")
    files = write_mixed_length_documents(folder, 24, 8)
    model = without_dropout(tiny_model_dir, folder / "model")
    main(long_args(model, files, folder / "out", *WEIGHTED, "--checkpointing_steps", "2"))
    reset_accelerate()
    return model, files, folder / "out"


def assert_close_weights(a: dict, b: dict) -> None:
    for name in a:  # a softmax key bias's gradient is rounding noise (tests/helpers.assert_same_weights)
        if not name.endswith("attention.self.key.bias"):
            torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)


def test_document_weighting_resumes_bitwise_and_accumulates_exactly(weighted, tmp_path):
    """Resumed from its step-2 checkpoint, the run ends bit for bit where the unbroken one did; 8 windows x 2
    accumulated micro-batches update as 16 at once (the weights' sum of the whole update divides it)."""
    model, files, unbroken = weighted
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(unbroken / "checkpoint-2", resumed / "checkpoint-2")
    main(
        long_args(
            model, files, resumed, *WEIGHTED, "--checkpointing_steps", "2", "--resume_from_checkpoint", "auto"
        )
    )
    reset_accelerate()
    accumulated = tmp_path / "accumulated"
    accumulate = ["--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2"]
    main(long_args(model, files, accumulated, *WEIGHTED, *accumulate))
    a, b = weights(unbroken), weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert_close_weights(a, weights(accumulated))
    recorded = json.loads((unbroken / "train_config.json").read_text())
    assert recorded["window_loss_weighting"] == recorded["identity"]["window_loss_weighting"] == "document"
    assert "weighing 1 / its document's windows" in (unbroken / "README.md").read_text()
    assert all(line["loss"] > 0 for line in read_jsonl(unbroken / "metrics.jsonl") if "loss" in line)


def test_a_stride_without_room_and_a_second_text_too_long_are_refused(tiny_model_dir, files, tmp_path):
    windowed = ["--long_documents", "sliding_window"]
    with pytest.raises(ConfigError) as stride:
        main(long_args(tiny_model_dir, files, tmp_path / "a", *windowed, "--doc_stride", "126"))
    assert stride.value.flag == "--doc_stride" and "below 126" in stride.value.fix
    reset_accelerate()
    pairs = tmp_path / "pairs.jsonl"  # the document as the second text: it alone exceeds --max_length
    rows = [{"q": "the verdict?", "text": r["text"], "label": r["label"]} for r in read_jsonl(files["train"])]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows[:8]))
    args = long_args(tiny_model_dir, {"train": pairs, "validation": pairs}, tmp_path / "b", *windowed)
    with pytest.raises(ConfigError) as second:
        main([*args, "--text_columns", "q,text"])
    assert second.value.flag == "--max_length" and "--max_length" in second.value.fix


def test_the_max_length_a_refusal_names_runs(tiny_model_dir, tmp_path):
    """Pairs whose 70-token second text leaves --max_length 64 no room: the --max_length the refusal
    names trains (it named 74, which the default --doc_stride, a quarter of it, then refused)."""
    pairs = tmp_path / "pairs.jsonl"
    rows = [{"text": " ".join(["the"] * 50), "q": " ".join(["a"] * 70), "label": ("yes", "no")[i % 2]}
            for i in range(8)]  # fmt: skip
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    windowed = ["--long_documents", "sliding_window", "--text_columns", "text,q", "--max_train_steps", "2"]
    args = long_args(tiny_model_dir, {"train": pairs, "validation": pairs}, tmp_path / "out", *windowed)
    args[args.index("--max_length") + 1] = "64"
    with pytest.raises(ConfigError) as refused:
        main(args)
    reset_accelerate()
    named = re.search(r"--max_length (\d+) or more", refused.value.fix)
    assert refused.value.flag == "--max_length" and named, refused.value
    args[args.index("--max_length") + 1] = named.group(1)
    assert main(args)["global_step"] == 2
    reset_accelerate()


@pytest.mark.parametrize(
    ("family", "kind"),
    [("llama", "regression"), ("bert", "multi-label")],
)
def test_decoders_regression_and_multi_label_score_documents(family, kind, files, tmp_path):
    """A decoder (left padding, its last token) and the other task kinds: one line per document, as
    score_document gives it alone (1 epoch: no learning asked for)."""
    from tests.backbones import build_tiny

    model_dir = build_tiny(family, tmp_path / "model")
    rows = read_jsonl(files["validation"])[:12]
    if kind == "regression":
        rows = [{"text": r["text"], "label": float(r["label"] == "positive")} for r in rows]
    else:
        labels = [[r["label"], "verdict"][: 1 + i % 2] for i, r in enumerate(rows)]
        rows = [{"text": r["text"], "label": label} for r, label in zip(rows, labels, strict=True)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    args = long_args(model_dir, {"train": data, "validation": data}, out, "--num_train_epochs", "1")
    extra = ["--long_documents", "sliding_window", "--max_length", "64", "--doc_stride", "16"]
    results = main([*args, *extra, "--do_predict", "--test_file", str(data)])
    reset_accelerate()
    assert results["eval_samples"] == results["predict_samples"] == len(rows)
    # Evaluate-only reads the windows back, their size (--max_length 64, not the default) included.
    evaluate = ["--model_name_or_path", str(out), "--validation_file", str(data), "--do_train", "false",
                "--report_to", "none", "--mixed_precision", "no"]  # fmt: skip
    again = main([*evaluate, "--output_dir", str(tmp_path / "again")])
    reset_accelerate()
    assert again["eval_loss"] == pytest.approx(results["eval_loss"], abs=1e-6)
    # --long_documents truncate given: none of the windows' settings is read back (nor refused).
    cut = main([*evaluate, "--output_dir", str(tmp_path / "cut"), "--long_documents", "truncate"])
    reset_accelerate()
    assert cut["eval_samples"] == len(rows) and cut["eval_loss"] != pytest.approx(results["eval_loss"])
    for line in read_jsonl(out / "predictions.jsonl")[::5]:
        alone = score_document(out, rows[line["row"]]["text"])
        assert alone["windows"] == line["windows"] > 1
        if kind == "regression":
            assert alone["score"] == pytest.approx(line["score"], abs=1e-5)
        else:
            assert alone["labels"] == line["labels"]
            assert alone["probabilities"] == pytest.approx(line["probabilities"], abs=1e-5)

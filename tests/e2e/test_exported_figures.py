"""results.json's figures are the exported model's: under `--mixed_precision bf16` over fp32 weights (auto's
choice on bf16 CPUs and GPUs) training evaluates under autocast, and the export computes in fp32 as
`pipeline` runs it; for every family, results.json equals a plain fp32 forward of the exported folder on the
validation rows (accuracy exactly, losses to float rounding), while training's own evaluation (under
autocast, best_evaluation) does not. bf16 is forced: `auto` resolves to fp32 on a CPU without native bf16,
where nothing would be autocast."""

from __future__ import annotations

import json
import random

import pytest
import torch
import torch.nn.functional as F
from seqeval.metrics import f1_score
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
)

from finetune.families.causal_lm.conversations import encode_row
from finetune.mnli import main
from tests.chat_models import build_tiny_lm
from tests.e2e.test_sft import conversation
from tests.helpers import read_jsonl, reset_accelerate, tiny_args
from tests.tagging_data import sentences, tiny_tagger, write_conll, write_jsonl
from tests.warm_ranks import run_ranks

TIGHT = 1e-6  # fp32 against fp32, batched against one row alone; bf16 autocast moves it 5e-6 or more


def assert_training_evaluated_otherwise(results: dict, loss_key: str, reference_loss: float) -> None:
    """The run's own evaluation during training was autocast's: else the test proves nothing here."""
    assert results["mixed_precision"] == "bf16"
    assert results["best_evaluation"][loss_key] != pytest.approx(reference_loss, rel=TIGHT)


def test_classification_results_are_the_exported_models(tiny_model_dir, nli_files, tmp_path):
    """MNLI-style pairs: eval_matched_accuracy and eval_matched_loss in results.json, and predictions.jsonl's
    probabilities, are the exported folder's in fp32; an evaluate-only run under bf16 reports the same."""
    out = tmp_path / "out"
    results = main(tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "30", "--eval_strategy",
                             "steps", "--eval_steps", "15", "--mixed_precision", "bf16", "--do_predict",
                             "--test_file", str(nli_files["validation"])))  # fmt: skip
    reset_accelerate()
    rows = read_jsonl(nli_files["validation"])
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    with torch.no_grad():
        logits = torch.cat([
            model(**tokenizer(r["premise"], r["hypothesis"], truncation=True, max_length=64,
                              return_tensors="pt")).logits
            for r in rows
        ])  # fmt: skip
    labels = torch.tensor([r["label"] for r in rows])
    loss = float(F.cross_entropy(logits, labels))
    assert results["eval_matched_accuracy"] == int((logits.argmax(-1) == labels).sum()) / len(rows)
    assert results["eval_matched_loss"] == pytest.approx(loss, rel=TIGHT)
    assert_training_evaluated_otherwise(results, "eval_matched_loss", loss)
    names = model.config.id2label
    predicted = [
        [line["probabilities"][names[i]] for i in range(3)] for line in read_jsonl(out / "predictions.jsonl")
    ]
    assert torch.allclose(torch.tensor(predicted), logits.softmax(-1), atol=1e-6)
    evaluated = main(["--model_name_or_path", str(out), "--validation_file", str(nli_files["validation"]),
                      "--do_train", "false", "--output_dir", str(tmp_path / "eval"), "--report_to", "none",
                      "--mixed_precision", "bf16", "--max_length", "64"])  # fmt: skip
    assert evaluated["eval_matched_accuracy"] == results["eval_matched_accuracy"]
    assert evaluated["eval_matched_loss"] == pytest.approx(loss, rel=TIGHT)


def test_sft_results_are_the_exported_models(tmp_path):
    """A tiny Llama with ChatML: eval_loss (per target token) and eval_perplexity in results.json are the
    exported folder's in fp32, over the same target tokens."""
    rng = random.Random(0)
    model_dir = build_tiny_lm("llama", tmp_path / "llama")
    train, validation = tmp_path / "train.jsonl", tmp_path / "validation.jsonl"
    train.write_text("".join(json.dumps(conversation(rng)) + "\n" for _ in range(24)))
    validation.write_text("".join(json.dumps(conversation(rng)) + "\n" for _ in range(7)))
    out = tmp_path / "out"
    results = main(["--task_type", "causal_lm", "--model_name_or_path", str(model_dir), "--train_file",
                    str(train), "--validation_file", str(validation), "--output_dir", str(out),
                    "--max_length", "64", "--mixed_precision", "bf16", "--report_to", "none",
                    "--save_plots", "false", "--max_train_steps", "4", "--eval_strategy", "steps",
                    "--eval_steps", "2", "--learning_rate", "1e-3"])  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for number, line in enumerate(validation.read_text().splitlines()):
            row = encode_row(json.loads(line), "messages", tokenizer, max_length=64, row_number=number,
                             source="v")  # fmt: skip
            labels = torch.tensor(row.labels[1:])
            logits = model(input_ids=torch.tensor([row.input_ids])).logits[0, :-1]
            total += float(F.cross_entropy(logits, labels, reduction="sum"))
            count += int((labels != -100).sum())
    assert results["eval_tokens"] == count
    assert results["eval_loss"] == pytest.approx(total / count, rel=TIGHT)
    assert results["eval_perplexity"] == pytest.approx(torch.tensor(total / count).exp().item(), rel=TIGHT)
    assert_training_evaluated_otherwise(results, "eval_loss", total / count)


@pytest.mark.parametrize(
    "processes", [1, pytest.param(2, marks=pytest.mark.multiprocess)], ids=["one-process", "two-processes"]
)
def test_tagging_results_are_the_exported_models(tmp_path, processes):
    """The tiny BERT tagger, on one process and on two (DDP's wrapper around the model, 15 sentences: one
    repeated): eval_f1 and eval_accuracy (word by word, each word read from its first sub-token) and
    eval_loss (over those sub-tokens) are the exported folder's in fp32."""
    validation_rows = sentences(15, seed=1)
    out = tmp_path / "out"
    train = write_conll(tmp_path / "train.conll", sentences(48, seed=0))
    validation = write_jsonl(tmp_path / "validation.jsonl", validation_rows)
    model_dir = tiny_tagger(tmp_path / "bert")
    argv = ["--task_type", "token_classification", "--model_name_or_path", str(model_dir), "--train_file",
            str(train), "--validation_file", str(validation), "--output_dir", str(out), "--max_length", "64",
            "--mixed_precision", "bf16", "--report_to", "none", "--save_plots", "false", "--num_train_epochs",
            "2", "--per_device_train_batch_size", "8", "--learning_rate", "5e-3"]  # fmt: skip
    if processes == 1:
        results = main(argv)
    else:
        done = run_ranks(argv)
        assert done.returncode == 0, done.stderr[-3000:]
        results = json.loads((out / "results.json").read_text())
    assert results["world_size"] == processes
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForTokenClassification.from_pretrained(out).eval()
    names, ids = model.config.id2label, model.config.label2id
    predicted, total, count, right, words = [], 0.0, 0, 0, 0
    with torch.no_grad():
        for row in validation_rows:
            encoded = tokenizer(row["tokens"], is_split_into_words=True, return_tensors="pt")
            firsts = [
                i
                for i, w in enumerate(encoded.word_ids())
                if w is not None and w != encoded.word_ids()[i - 1]
            ]
            assert len(firsts) == len(row["tokens"])  # every word in one window
            logits = model(**encoded).logits[0, firsts]
            gold = torch.tensor([ids[tag] for tag in row["ner_tags"]])
            total += float(F.cross_entropy(logits, gold, reduction="sum"))
            count += len(firsts)
            tags = logits.argmax(-1)
            right, words = right + int((tags == gold).sum()), words + len(firsts)
            predicted.append([names[int(i)] for i in tags])
    gold_tags = [row["ner_tags"] for row in validation_rows]
    assert results["eval_f1"] == f1_score(gold_tags, predicted, zero_division=0)
    assert results["eval_accuracy"] == right / words
    assert results["eval_loss"] == pytest.approx(total / count, rel=TIGHT)
    assert_training_evaluated_otherwise(results, "eval_loss", total / count)

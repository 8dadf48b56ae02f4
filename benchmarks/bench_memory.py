"""`make bench-memory`: peak RSS per rank of SFT on 2 CPU ranks, one invocation, one configuration at a time.

SmolLM2-135M (its GGUF dequantised once to a plain folder, as bench_sft does) trains on `text` rows at
least --max_length tokens long, so every micro-batch is full and every token a target. A configuration is
named `DIST-WEIGHTS-LOSS`: DIST ddp (cpu_multiprocess.yaml) or fsdp (fsdp.yaml / fsdp_lora.yaml, FSDP2),
WEIGHTS full, lora (--use_peft) or qlora (--use_peft --load_in_4bit), LOSS chunked (--chunked_loss true)
or whole (false). Combinations the toolkit refuses (chunked or 4-bit under FSDP) are reported as refused,
not run. `--model 1b`: a Llama decoder built from a config with about 1B parameters (random weights,
SmolLM2's tokenizer), written once, tensor by tensor (benchmarks/random_decoder.py: about one shard of
memory to build); the headline pair is `fsdp-full-whole` against `ddp-full-whole`, where
DDP (every rank a whole model, its gradients and AdamW's two moments: ~16 GB a rank in fp32) may not
start on the machine: a run that dies is reported with its exit status, not retried.

Each configuration is one `accelerate launch` of 2 ranks; each rank prints its own peak RSS
(getrusage's ru_maxrss, the rank process alone) and, from rank 0, steps/s over the run's training
seconds. Figures go to stdout and --output (JSON). Measure on an otherwise idle machine.

    python -m benchmarks.bench_memory [--max_lengths 1024,2048] [--configs ddp-full-chunked,...]
    python -m benchmarks.bench_memory --model 1b --max_lengths 1024 --max_steps 3
    python -m benchmarks.bench_memory --max_lengths 64 --configs ddp-full-whole --max_steps 1  # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.bench_sft import plain_model

CONFIGS = ("ddp-full-chunked", "ddp-full-whole", "fsdp-full-whole", "ddp-lora-chunked", "ddp-lora-whole",
           "fsdp-lora-whole", "ddp-qlora-chunked", "ddp-qlora-whole")  # fmt: skip
CONFIGS_1B = ("fsdp-full-whole", "ddp-full-whole")
WORDS = ["calm", "bright", "slow", "old", "gentle", "cold", "small", "deep", "river", "stone", "north"]


def text_rows(count: int, tokens: int, seed: int) -> list[dict]:
    """`text` rows of more words than `tokens` (each word at least one token): cut to --max_length, every
    row is full and all of it a target."""
    rng = random.Random(seed)
    return [{"text": " ".join(rng.choice(WORDS) for _ in range(tokens + 16))} for _ in range(count)]


def parse(name: str) -> tuple[str, str, str]:
    dist, weights, loss = name.split("-")
    if (
        dist not in ("ddp", "fsdp")
        or weights not in ("full", "lora", "qlora")
        or loss not in ("chunked", "whole")
    ):
        sys.exit(f"--configs: {name} is not DIST-WEIGHTS-LOSS (ddp|fsdp, full|lora|qlora, chunked|whole)")
    return dist, weights, loss


def refused(dist: str, weights: str, loss: str) -> str | None:
    """Why the toolkit refuses this combination (docs/distributed.md), or None."""
    if dist == "fsdp" and loss == "chunked":
        return "--chunked_loss under FSDP is refused (its backward crashes)"
    if dist == "fsdp" and weights == "qlora":
        return "4-bit under FSDP is refused (bitsandbytes cannot shard)"
    return None


def launch_args(dist: str, weights: str) -> list[str]:
    config = {"ddp": "cpu_multiprocess.yaml", "fsdp": "fsdp_lora.yaml" if weights != "full" else "fsdp.yaml"}
    return ["--config_file", f"accelerate_configs/{config[dist]}", "--num_processes", "2",
            "--gpu_ids", "all", "--mixed_precision", "no"]  # fmt: skip


def run_args(args, model: Path, data: Path, out: Path, max_length: int, weights: str, loss: str) -> list[str]:
    return [
        "--task_type", "causal_lm", "--model_name_or_path", str(model),
        "--train_file", str(data / f"train_{max_length}.jsonl"), "--output_dir", str(out),
        "--max_length", str(max_length), "--per_device_train_batch_size", str(args.batch_size),
        "--max_train_steps", str(args.max_steps), "--learning_rate", "1e-5", "--eval_strategy", "no",
        "--mixed_precision", "no", "--report_to", "none", "--save_plots", "false",
        "--logging_steps", str(args.max_steps), "--chunked_loss", "true" if loss == "chunked" else "false",
        *(["--use_peft", "true"] if weights != "full" else []),
        *(["--load_in_4bit", "true"] if weights == "qlora" else []),
    ]  # fmt: skip


def worker(argv: list[str]) -> None:
    """One rank of a launched run: the toolkit's run, then this rank's peak RSS (and rank 0's steps/s)."""
    from finetune.cli import main

    results = main(argv)
    rank = int(os.environ.get("RANK", "0"))
    figures = {"rank": rank, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if results and rank == 0:
        figures["steps_per_second"] = results["global_step"] / results["train_runtime_s"]
        figures["distributed_type"] = results["distributed_type"]  # FSDP really engaged (or MULTI_CPU)
    print("BENCH " + json.dumps(figures), flush=True)


def measure(args, model: Path, data: Path, name: str, max_length: int) -> dict:
    dist, weights, loss = parse(name)
    why = refused(dist, weights, loss)
    if why:
        return {"config": name, "max_length": max_length, "refused": why}
    out = Path(tempfile.mkdtemp(prefix=f"bench-memory-{name}-"))
    flags = run_args(args, model, data, out, max_length, weights, loss)
    command = [sys.executable, "-m", "accelerate.commands.launch", *launch_args(dist, weights),
               "-m", "benchmarks.bench_memory", "--worker", *flags]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    ranks = [json.loads(x[6:]) for x in done.stdout.splitlines() if x.startswith("BENCH ")]
    row = {"config": name, "max_length": max_length, "returncode": done.returncode}
    if done.returncode != 0 or len(ranks) != 2:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {**row, "failed": tail[-300:]}  # a rank killed for memory: DDP could not start or train
    ranks.sort(key=lambda r: r["rank"])
    row["peak_rss_mib"] = [round(r["peak_rss_mib"]) for r in ranks]
    row["steps_per_second"] = ranks[0].get("steps_per_second")
    row["distributed_type"] = ranks[0].get("distributed_type")
    return row


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        return worker(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["smollm2", "1b"], default="smollm2")
    parser.add_argument(
        "--configs", help=f"default: {','.join(CONFIGS)} (--model 1b: {','.join(CONFIGS_1B)})"
    )
    parser.add_argument("--max_lengths", default="1024,2048")
    parser.add_argument("--max_steps", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=1)
    parser.add_argument("--output", default="bench_memory.json")
    args = parser.parse_args()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "finetune-bench"
    model = plain_model(cache / "smollm2-135m")
    if args.model == "1b":
        from benchmarks.random_decoder import decoder_1b

        model = decoder_1b(cache / "llama-1b-random", model)
    configs = args.configs.split(",") if args.configs else list(CONFIGS_1B if args.model == "1b" else CONFIGS)
    for name in configs:
        parse(name)  # every name checked before the first run
    lengths = [int(x) for x in args.max_lengths.split(",")]
    data = Path(tempfile.mkdtemp(prefix="bench-memory-data-"))
    for length in lengths:  # enough rows for every rank's every step
        rows = text_rows(2 * args.batch_size * args.max_steps, length, seed=length)
        (data / f"train_{length}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    measured = []
    for length in lengths:
        for name in configs:
            row = measure(args, model, data, name, length)
            print(json.dumps(row), flush=True)
            measured.append(row)
    Path(args.output).write_text(json.dumps({"model": args.model, "runs": measured}, indent=2))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()

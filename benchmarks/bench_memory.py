"""`make bench-memory`: peak RSS per rank of SFT on 2 CPU ranks, this toolkit and TRL's SFTTrainer, one
configuration at a time.

SmolLM2-135M (its GGUF dequantised once to a plain folder, as bench_sft does) trains on `text` rows at
least --max_length tokens long, so every micro-batch is full and every token a target; every run gets the
same folder, rows, --max_length, batch, steps, learning rate 1e-5 and fp32, as 2 ranks of one `accelerate
launch`. A toolkit configuration is named `DIST-WEIGHTS-LOSS`: DIST ddp (cpu_multiprocess.yaml) or fsdp
(fsdp.yaml / fsdp_lora.yaml, FSDP2), WEIGHTS full, lora (--use_peft) or qlora (--use_peft --load_in_4bit,
nf4), LOSS chunked (--chunked_loss true) or whole (false). Combinations the toolkit refuses (4-bit under
FSDP) are reported as refused, not run. A TRL configuration, `trl-WEIGHTS` or
`trl-WEIGHTS-no_gc`, is TRL's SFTTrainer under TRL's own virtualenv (--trl_python) launched with
cpu_multiprocess.yaml (DDP), the same LoRA (the toolkit's defaults) and nf4; everything else TRL's default:
TRL 1.x checkpoints activations by default (SFTConfig's gradient_checkpointing=True) and scores tokens
with its fused LM head (log-probs in tiles, no whole logits; no flag turns it off), so `-no_gc` (gradient
checkpointing off) is the like-for-like row; each row records what its run got.

`--model 1b`: a Llama decoder of about 1B parameters (random weights, SmolLM2's tokenizer), written once,
tensor by tensor, so building it needs about one shard of memory; the headline pair is `fsdp-full-whole`
against `ddp-full-whole`, where DDP (every rank a whole model, its gradients and AdamW's two moments: ~16
GB a rank in fp32) may not start on the machine. A run that dies (the kernel's OOM killer: SIGKILL) is
reported with its exit status and the reason, not retried; ranks offer themselves to the OOM killer first
(oom_score_adj), so the driver survives to report it.

Each rank prints its own peak RSS (getrusage's ru_maxrss, the rank process alone) and rank 0 steps/s over
its run's training seconds. Figures go to stdout, a closing table (each row's larger rank against
ddp-full-whole's at the same length) and --output (JSON, rewritten after every run). Measure on an idle
machine.

    python -m benchmarks.bench_memory                 # --max_lengths 1024, CONFIGS: ~12 minutes on 2 cores
    python -m benchmarks.bench_memory --max_lengths 1024,2048 --configs ddp-full-whole,trl-full-no_gc
    python -m benchmarks.bench_memory --model 1b --max_lengths 1024 --max_steps 3
    python -m benchmarks.bench_memory --max_lengths 64 --max_steps 1 --configs ddp-full-whole  # smoke
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks.bench_sft import plain_model
from benchmarks.processes import ROOT, emit, lora_config, peak_rss_mib, run_process, trl_python

# The default invocation, sized to ~12 minutes on 2 cores at --max_length 1024 (estimated from bench-sft's
# tokens/s: ~1 minute a launch, TRL's longer): the toolkit's baseline and its memory levers one at a time,
# TRL's three weights with its defaults, and full and LoRA without its activation checkpointing
# (like-for-like with the toolkit's rows, which checkpoint nothing).
CONFIGS = ("ddp-full-whole", "ddp-full-chunked", "fsdp-full-whole", "fsdp-full-chunked", "ddp-lora-chunked",
           "ddp-qlora-chunked", "trl-full", "trl-full-no_gc", "trl-lora", "trl-lora-no_gc",
           "trl-qlora")  # fmt: skip
# by --configs
MORE = ("ddp-lora-whole", "fsdp-lora-whole", "fsdp-lora-chunked", "ddp-qlora-whole", "trl-qlora-no_gc")
CONFIGS_1B = ("fsdp-full-whole", "ddp-full-whole")
BASELINE = "ddp-full-whole"
WORDS = ["calm", "bright", "slow", "old", "gentle", "cold", "small", "deep", "river", "stone", "north"]
LEARNING_RATE = 1e-5
NOTES = ("gradient_checkpointing", "loaded_in_4bit", "loss")  # what a TRL row records it got


def text_rows(count: int, tokens: int, seed: int) -> list[dict]:
    """`text` rows of more words than `tokens` (each word at least one token): cut to --max_length, every
    row is full and all of it a target."""
    rng = random.Random(seed)
    return [{"text": " ".join(rng.choice(WORDS) for _ in range(tokens + 16))} for _ in range(count)]


def parse(name: str) -> tuple[str, str, str]:
    """(dist, weights, loss); a TRL row's dist is `trl` and its loss `default` or `no_gc`."""
    parts = name.split("-")
    if parts[0] == "trl" and len(parts) in (2, 3):
        parts = parts if len(parts) == 3 else [*parts, "default"]
        if parts[1] in ("full", "lora", "qlora") and parts[2] in ("default", "no_gc"):
            return parts[0], parts[1], parts[2]
    elif len(parts) == 3:
        dist, weights, loss = parts
        if dist in ("ddp", "fsdp") and weights in ("full", "lora", "qlora") and loss in ("chunked", "whole"):
            return dist, weights, loss
    sys.exit(
        f"--configs: {name} is neither DIST-WEIGHTS-LOSS (ddp|fsdp, full|lora|qlora, chunked|whole) nor "
        "trl-WEIGHTS[-no_gc]"
    )


def refused(dist: str, weights: str, loss: str) -> str | None:
    """Why the toolkit refuses this combination (docs/distributed.md), or None."""
    if dist == "fsdp" and weights == "qlora":
        return "4-bit under FSDP is refused (bitsandbytes cannot shard)"
    return None


def launch_args(dist: str, weights: str) -> list[str]:
    """TRL's rows run under DDP, cpu_multiprocess.yaml, as the toolkit's ddp rows."""
    config = {"ddp": "cpu_multiprocess.yaml", "trl": "cpu_multiprocess.yaml",
              "fsdp": "fsdp_lora.yaml" if weights != "full" else "fsdp.yaml"}  # fmt: skip
    return ["--config_file", str(ROOT / "accelerate_configs" / config[dist]), "--num_processes", "2",
            "--gpu_ids", "all", "--mixed_precision", "no"]  # fmt: skip


def run_args(
    args, model: Path, train: Path, out: Path, max_length: int, weights: str, loss: str
) -> list[str]:
    return [
        "--task_type", "causal_lm", "--model_name_or_path", str(model),
        "--train_file", str(train), "--output_dir", str(out),
        "--max_length", str(max_length), "--per_device_train_batch_size", str(args.batch_size),
        "--max_train_steps", str(args.max_steps), "--learning_rate", str(LEARNING_RATE),
        "--eval_strategy", "no", "--mixed_precision", "no", "--report_to", "none", "--save_plots", "false",
        "--logging_steps", str(args.max_steps), "--chunked_loss", "true" if loss == "chunked" else "false",
        *(["--use_peft", "true"] if weights != "full" else []),
        *(["--load_in_4bit", "true"] if weights == "qlora" else []),
    ]  # fmt: skip


def offer_to_oom_killer() -> None:
    """This rank first in the kernel's OOM choice (raising one's own score needs no privilege), so a run
    out of memory loses a rank, which its launcher reports, not the driver that records the row."""
    with contextlib.suppress(OSError):
        Path("/proc/self/oom_score_adj").write_text("1000")


def worker(argv: list[str]) -> None:
    """One rank of a launched toolkit run: the run, then this rank's peak RSS (and rank 0's steps/s)."""
    offer_to_oom_killer()
    from finetune.cli import main

    results = main(argv)
    rank = int(os.environ.get("RANK", "0"))
    figures = {"rank": rank, "peak_rss_mib": peak_rss_mib()}
    if results and rank == 0:
        figures["steps_per_second"] = results["global_step"] / results["train_runtime_s"]
        figures["distributed_type"] = results["distributed_type"]  # FSDP really engaged (or MULTI_CPU)
        figures["world_size"] = results["world_size"]
    emit(figures)


def trl_worker(name: str, settings: dict) -> None:
    """One rank of a launched TRL run (under TRL's virtualenv): SFTTrainer with `settings`, the rest TRL's
    defaults; this rank's peak RSS, and from rank 0 steps/s and what the run got."""
    offer_to_oom_killer()
    import torch
    import trl
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer
    from trl.trainer import utils as trl_utils

    _, weights, variant = parse(name)
    model_init = {"dtype": torch.float32}  # fp32 as the toolkit's rows, whatever the folder's dtype
    if weights == "qlora":
        from transformers import BitsAndBytesConfig

        model_init["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
        )  # the toolkit's --load_in_4bit defaults
    steps = settings["max_steps"]
    config = SFTConfig(
        output_dir=settings["output_dir"], per_device_train_batch_size=settings["batch_size"],
        learning_rate=LEARNING_RATE, max_steps=steps, max_length=settings["max_length"], bf16=False,
        fp16=False, logging_steps=steps, report_to="none", save_strategy="no", use_cpu=True,
        model_init_kwargs=model_init, **({"gradient_checkpointing": False} if variant == "no_gc" else {}),
    )  # fmt: skip
    trainer = SFTTrainer(
        model=settings["model"],
        args=config,
        train_dataset=load_dataset("json", data_files=settings["train_file"], split="train"),
        peft_config=lora_config() if weights != "full" else None,
    )
    trained = trainer.train()
    rank = trainer.accelerator.process_index
    figures = {"rank": rank, "peak_rss_mib": peak_rss_mib()}
    if rank == 0:
        figures["steps_per_second"] = trained.global_step / trained.metrics["train_runtime"]
        figures["distributed_type"] = trainer.accelerator.distributed_type.value
        figures["world_size"] = trainer.accelerator.num_processes
        figures["trl"] = trl.__version__
        figures["gradient_checkpointing"] = bool(config.gradient_checkpointing)
        figures["loaded_in_4bit"] = bool(getattr(trainer.model, "is_loaded_in_4bit", False))  # peft forwards
        fused = hasattr(trl_utils, "add_fused_lm_head")  # this version's SFTTrainer patches it on
        figures["loss"] = "fused LM head (chunked log-probs)" if fused else "whole logits"
    emit(figures)


def killed(stderr: str, returncode: int) -> bool:
    """torchrun's agent says `Signal 9 (SIGKILL)` for a rank the kernel killed; a killed launcher is -9."""
    return returncode in (-9, 137) or "SIGKILL" in stderr or "Signal 9" in stderr


def first_error(stderr: str) -> str:
    """The rank's own exception line, not the launcher's ChildFailedError report that follows it."""
    lines = stderr.strip().splitlines() or ["(no output)"]
    errors = [x for x in lines if ("Error" in x or "error:" in x) and "ChildFailedError" not in x]
    return (errors or lines)[-1].strip()[-300:]


def measure(args, model: Path, data: Path, name: str, max_length: int) -> dict:
    dist, weights, loss = parse(name)
    row = {"config": name, "max_length": max_length}
    why = refused(dist, weights, loss)
    if why:
        return {**row, "refused": why}
    out = Path(tempfile.mkdtemp(prefix=f"bench-memory-{name}-"))
    train = data / f"train_{max_length}.jsonl"
    if dist == "trl":
        settings = {"model": str(model), "train_file": str(train), "output_dir": str(out),
                    "max_length": max_length, "batch_size": args.batch_size,
                    "max_steps": args.max_steps}  # fmt: skip
        python, tail = args.trl_python, ["--trl_worker", name, json.dumps(settings)]
    else:
        flags = run_args(args, model, train, out, max_length, weights, loss)
        python, tail = sys.executable, ["--worker", *flags]
    command = [python, "-m", "accelerate.commands.launch", *launch_args(dist, weights),
               "-m", "benchmarks.bench_memory", *tail]  # fmt: skip
    done = run_process(command)
    shutil.rmtree(out, ignore_errors=True)  # the exported model: ~0.5 GB, 4 GB at --model 1b
    row["returncode"] = done.returncode
    if done.returncode != 0 or len(done.figures) != 2:
        row["stderr_tail"] = done.stderr[-3000:]
        if killed(done.stderr, done.returncode):  # out of memory: reported, not retried
            return {**row, "failed": "a rank was killed (SIGKILL: the kernel's OOM killer, most likely)"}
        return {**row, "failed": first_error(done.stderr)}
    ranks = sorted(done.figures, key=lambda r: r["rank"])
    row["peak_rss_mib"] = [round(r["peak_rss_mib"]) for r in ranks]
    row.update({k: v for k, v in ranks[0].items() if k not in ("rank", "peak_rss_mib")})
    return row


def table(measured: list[dict]) -> None:
    """Every row; its larger rank's peak RSS against ddp-full-whole's at the same --max_length."""
    base = {
        r["max_length"]: max(r["peak_rss_mib"])
        for r in measured
        if r["config"] == BASELINE and "peak_rss_mib" in r
    }
    print(f"\n{'config':20}{'length':>7}{'rank 0 MiB':>11}{'rank 1 MiB':>11}{'x ' + BASELINE:>18}"
          f"{'steps/s':>9}  notes")  # fmt: skip
    for r in measured:
        if "peak_rss_mib" not in r:
            print(f"{r['config']:20}{r['max_length']:7}{'':>49}  {r.get('refused') or r.get('failed')}")
            continue
        ratio = f"{max(r['peak_rss_mib']) / base[r['max_length']]:.2f}" if r["max_length"] in base else "-"
        notes = ", ".join(f"{k} {r[k]}" for k in NOTES if k in r)
        steps = f"{r['steps_per_second']:.3f}" if r.get("steps_per_second") else "-"
        print(f"{r['config']:20}{r['max_length']:7}{r['peak_rss_mib'][0]:11}{r['peak_rss_mib'][1]:11}{ratio:>18}"
              f"{steps:>9}  {notes}")  # fmt: skip


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        return worker(sys.argv[2:])
    if sys.argv[1:2] == ["--trl_worker"]:
        return trl_worker(sys.argv[2], json.loads(sys.argv[3]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["smollm2", "1b"], default="smollm2")
    parser.add_argument(
        "--configs",
        help=f"default: {','.join(CONFIGS)}; also {','.join(MORE)} (--model 1b: {','.join(CONFIGS_1B)})",
    )
    parser.add_argument("--max_lengths", default="1024", help="comma-separated, e.g. 1024,2048")
    parser.add_argument("--max_steps", type=int, default=3, help="the first allocates AdamW's moments")
    parser.add_argument("--batch_size", type=int, default=1)
    parser.add_argument("--trl_python", default=".venv-trl/bin/python", help="TRL's virtualenv's python")
    parser.add_argument("--output", default="bench_memory.json")
    args = parser.parse_args()
    configs = args.configs.split(",") if args.configs else list(CONFIGS_1B if args.model == "1b" else CONFIGS)
    for name in configs:
        parse(name)  # every name checked before the first run
    if any(name.startswith("trl-") for name in configs):
        args.trl_python = trl_python(args.trl_python, "bench-memory")
    lengths = [int(x) for x in args.max_lengths.split(",")]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "finetune-bench"
    model = plain_model(cache / "smollm2-135m")
    if args.model == "1b":
        from benchmarks.random_decoder import decoder_1b

        model = decoder_1b(cache / "llama-1b-random", model)
    data = Path(tempfile.mkdtemp(prefix="bench-memory-data-"))
    for length in lengths:  # enough rows for every rank's every step
        rows = text_rows(2 * args.batch_size * args.max_steps, length, seed=length)
        (data / f"train_{length}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    measured = []
    for length in lengths:
        for name in configs:
            measured.append(measure(args, model, data, name, length))
            print(json.dumps(measured[-1]), flush=True)
            # rewritten after every run: a driver that dies later keeps the rows so far
            Path(args.output).write_text(json.dumps({"model": args.model, "runs": measured}, indent=2))
    table(measured)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()

"""`--chunked_loss true` against `false`: one SFT micro-batch's forward and backward (the family's own
`forward_backward`, on a model Accelerate prepared), its seconds and peak memory, side by side.

The model is a random decoder of SmolLM2-135M's shape (hidden 576, 49,152-token vocabulary, tied head),
built from its config in each process (no download); --layers 30 is the real depth, fewer isolate the
output layer's share. Every token of every row is a target (--rows x --tokens of them), as in text
pre-training or a long completion: the [targets, vocabulary] logits the chunks never hold whole.

Each measurement is its own process, so its peak is its own: peak RSS (getrusage maxrss) on CPU, torch's
max_memory_allocated on CUDA, both past the same model, optimizer-free, after --warmup steps. The two
alternate (every other round in reverse order, so a drift of the machine favours neither); printed: the
median seconds per step and peak MiB of each, the chunked/whole ratios, and that both gave the same loss.

    python -m benchmarks.bench_chunked_loss [--rows 4] [--tokens 2048] [--layers 30] [--repeats 3]
        [--steps 5] [--mixed_precision bf16] [--chunk_tokens N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

SIDES = ("whole", "chunked")


def smollm2_shape(layers: int):
    import transformers

    return transformers.LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, tie_word_embeddings=True,
        rms_norm_eps=1e-5, rope_theta=100000.0, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )  # fmt: skip


def worker(args) -> None:
    """One side in this process: its seconds per step, peak memory and loss, as one JSON line."""
    import torch
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM

    from finetune.families.causal_lm.batches import CausalLmCollator
    from finetune.families.causal_lm.chunked_loss import chunk_tokens_for
    from finetune.families.causal_lm.family import CausalLM

    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    torch.manual_seed(0)
    model = accelerator.prepare(AutoModelForCausalLM.from_config(smollm2_shape(args.layers)))
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 49152, (args.rows, args.tokens + 1), generator=generator).tolist()
    batch = CausalLmCollator(pad_token_id=2)([{"input_ids": row, "labels": row} for row in ids])
    batch = {key: value.to(accelerator.device) for key, value in batch.items()}
    family = CausalLM()
    family.head_at_targets = True
    family.chunk_tokens = chunk_tokens_for(49152, args.chunk_tokens) if args.worker == "chunked" else None
    cuda = accelerator.device.type == "cuda"

    def step() -> float:
        model.zero_grad(set_to_none=True)
        summed, targets, _rows = family.forward_backward(model, accelerator, None, dict(batch), 1)
        return float(summed) / float(targets)

    for _ in range(args.warmup):
        loss = step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    seconds = []
    for _ in range(args.steps):
        tic = time.perf_counter()
        loss = step()  # float(): waits for the device
        seconds.append(time.perf_counter() - tic)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    figures = {
        "seconds_per_step": statistics.median(seconds),
        "peak_mib": peak if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "memory": "max_memory_allocated" if cuda else "peak RSS",
        "loss": loss,
        "chunk_tokens": family.chunk_tokens,
        "device": str(accelerator.device),
    }
    print("BENCH " + json.dumps(figures), flush=True)


def run_side(side: str, argv: list[str]) -> dict:
    command = [sys.executable, "-m", "benchmarks.bench_chunked_loss", "--worker", side, *argv]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    line = next((x for x in done.stdout.splitlines() if x.startswith("BENCH ")), None)
    if done.returncode != 0 or line is None:
        sys.exit(f"{side} failed:\n{done.stderr[-3000:]}")
    return json.loads(line[6:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per row, every one a target")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--mixed_precision", default="bf16", choices=["no", "bf16", "fp16"])
    parser.add_argument("--chunk_tokens", type=int, default=None, help="default: --chunked_loss_tokens'")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default="bench_chunked_loss.json")
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    kept = {k: v for k, v in vars(args).items() if k not in ("output", "worker") and v is not None}
    argv = [part for key, value in kept.items() for part in (f"--{key}", str(value))]
    measured = {side: [] for side in SIDES}
    for round_number in range(args.repeats):
        for side in SIDES if round_number % 2 == 0 else reversed(SIDES):
            measured[side].append(run_side(side, argv))
    table = {}
    for side, runs in measured.items():
        table[side] = {
            "seconds_per_step": statistics.median(r["seconds_per_step"] for r in runs),
            "peak_mib": statistics.median(r["peak_mib"] for r in runs),
            "loss": runs[0]["loss"],
        }
    whole, chunked = table["whole"], table["chunked"]
    ratios = {key: chunked[key] / whole[key] for key in ("seconds_per_step", "peak_mib")}
    first = measured["chunked"][0]
    print(
        f"{args.rows} rows x {args.tokens} targets, {args.layers} layers, {args.mixed_precision}, "
        f"{first['device']}, chunks of {first['chunk_tokens']} tokens; peak: {first['memory']}"
    )
    for side in SIDES:
        row = table[side]
        seconds, peak = row["seconds_per_step"], row["peak_mib"]
        print(f"  {side:8s} {seconds:.3f} s/step  {peak:.0f} MiB  loss {row['loss']:.6f}")
    differs = abs(chunked["loss"] - whole["loss"]) / whole["loss"]
    print(
        f"  chunked/whole: time {ratios['seconds_per_step']:.3f}x, peak memory {ratios['peak_mib']:.3f}x, "
        f"loss differs by {differs:.1e} (relative)"
    )
    with open(args.output, "w") as file:
        json.dump({"args": vars(args), "table": table, "ratios": ratios, "runs": measured}, file, indent=2)


if __name__ == "__main__":
    main()

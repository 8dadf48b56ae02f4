"""`make bench-steps`: what one CPU kernel choice is worth per training step, A/B in one process.

On a shared VM whole runs drift from one to the next by more than a kernel change is worth
(docs/benchmarks.md). Here two MiniLM models (same weights, the toolkit's precision) train on the same
length-grouped batches, stepping in turn, the first of the pair alternating every step, so the
drift hits both alike:

  padding_free   the toolkit's default (packed dropout, padding-free layers) against --padding_free false
  dropout        the toolkit's default against --dropout_kernel torch
  malloc         the toolkit's default against glibc's own malloc settings (freed memory handed back)
  rows_multiple  the toolkit's default against padding-free layers on the bare count of real tokens
                 (not rounded up to a multiple of 16)
  trainer_tuned  the toolkit's default against Trainer tuned's step: torch dropout, padded layers,
                 its own group_by_length batches (same rows, same count), glibc's malloc settings
  lora_dropout   LoRA (r 16, alpha 32, dropout 0.05, all-linear) with the adapters' dropout packed
                 (the toolkit's default) against peft's own torch dropout
  lora_full      that LoRA step against full fine-tuning (both the toolkit's defaults)
  loop           the toolkit's whole training loop (`finetune.training.loop.train`) against the bare
                 Accelerate loop of `make bench`, on one model, optimizer and loader: each side runs
                 --batches steps in turn, --repeats rounds, both on the same epoch's batches in a round

    python -m benchmarks.bench_steps [--compare padding_free] [--batches 62] [--repeats 2]

glibc's malloc settings are process-wide, so each side sets its own before every step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding
from transformers.trainer_pt_utils import LengthGroupedSampler as TrainerLengthGroupedSampler

from benchmarks.bench import SHARED_MNLI, _packaged_minilm, _tokenized, bare_step
from finetune.data.batching import LengthGroupedSampler
from finetune.distributed.accelerator import resolve_mixed_precision
from finetune.speed.malloc import _M_MMAP_MAX, _M_TRIM_THRESHOLD, _glibc_mallopt, keep_freed_memory
from finetune.speed.packed_dropout import pack_dropout_modules, use_packed_dropout
from finetune.speed.padding_free import ROWS_MULTIPLE, use_padding_free


class Setup(NamedTuple):
    packed_dropout: bool = True
    padding_free: bool = True
    keep_freed: bool = True
    trainer_batches: bool = False
    rows_multiple: int = ROWS_MULTIPLE
    lora: bool = False
    lora_packed_dropout: bool = True


# name -> the toolkit's default and the other side
COMPARISONS = {
    "padding_free": (Setup(), Setup(padding_free=False)),
    "dropout": (Setup(), Setup(packed_dropout=False)),
    "malloc": (Setup(), Setup(keep_freed=False)),
    "trainer_tuned": (
        Setup(),
        Setup(packed_dropout=False, padding_free=False, keep_freed=False, trainer_batches=True),
    ),
    "rows_multiple": (Setup(), Setup(rows_multiple=1)),
    "lora_dropout": (Setup(lora=True), Setup(lora=True, lora_packed_dropout=False)),
    "lora_full": (Setup(lora=True), Setup()),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", choices=[*COMPARISONS, "loop"], default="padding_free")
    parser.add_argument("--data_dir", default=str(SHARED_MNLI))
    parser.add_argument(
        "--batches", type=int, default=62, help="training batches, each stepped --repeats times"
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    if args.compare == "loop":
        compare_loop(args)
        return
    args.train_samples, args.eval_samples = args.batches * args.batch_size, 1
    tokenizer = AutoTokenizer.from_pretrained(_packaged_minilm())
    train = _tokenized(args, tokenizer)["train"].rename_column("label", "labels")
    lengths = [len(ids) for ids in train["input_ids"]]
    collate = DataCollatorWithPadding(tokenizer)

    def batches_of(trainer_order: bool) -> list[dict]:
        if trainer_order:
            generator = torch.Generator().manual_seed(args.seed)
            order = list(TrainerLengthGroupedSampler(args.batch_size, lengths=lengths, generator=generator))
        else:
            order = list(LengthGroupedSampler(lengths, args.batch_size, seed=args.seed))
        return [
            collate([train[i] for i in order[s : s + args.batch_size]])
            for s in range(0, len(order), args.batch_size)
        ]

    bf16 = resolve_mixed_precision("auto") == "bf16"
    sides = [_Side(setup, args.seed, bf16) for setup in COMPARISONS[args.compare]]
    orders = [setup.trainer_batches for setup in COMPARISONS[args.compare]]
    built = {order: batches_of(order) for order in set(orders)}  # one list when both sides share it
    batches = [built[order] for order in orders]
    # Untimed: the first step allocates what later steps reuse.
    for side, own in zip(sides, batches, strict=True):
        side.step(own[0])
    seconds = [0.0, 0.0]
    for repeat in range(args.repeats):
        for index in range(len(batches[0])):
            for side in (0, 1) if (repeat * len(batches[0]) + index) % 2 == 0 else (1, 0):
                seconds[side] += sides[side].step(batches[side][index])
    steps = args.repeats * len(batches[0])
    padded = [
        sum(b["input_ids"].numel() for b in own) / sum(int(b["attention_mask"].sum()) for b in own)
        for own in batches
    ]
    default, other = (1000 * s / steps for s in seconds)
    print(
        f"{args.compare}: {steps} steps each, batch {args.batch_size}, padded/real tokens {padded[0]:.2f} "
        f"and {padded[1]:.2f}, {'bf16' if bf16 else 'fp32'}: default {default:.0f} ms/step, other "
        f"{other:.0f} ms/step, speed-up {other / default:.3f}x"
    )


def compare_loop(args) -> None:
    """finetune's loop against the bare one: what the toolkit's machinery (accumulate, the meter,
    the NaN guard, the stop check, the progress bar) costs per step, with no process-to-process drift."""
    import dataclasses
    import tempfile

    from finetune.config.parser import parse_config
    from finetune.distributed.signals import StopSignals
    from finetune.run import close, setup
    from finetune.training.checkpoint import TrainState
    from finetune.training.loop import train

    with tempfile.TemporaryDirectory() as out:
        data = Path(args.data_dir)
        run = setup(parse_config([
            "--model_name_or_path", _packaged_minilm(), "--train_file", str(data / "train.jsonl"),
            "--validation_file", str(data / "validation_matched.jsonl"), "--output_dir", out,
            "--report_to", "none", "--max_eval_samples", "64", "--seed", str(args.seed),
            "--per_device_train_batch_size", str(args.batch_size), "--max_train_steps", str(args.batches),
            "--logging_steps", "1000",
        ]))  # fmt: skip

        def toolkit(epoch: int) -> float:
            # A fresh run state at `epoch`: train() steps that epoch's first --batches batches,
            # then evaluates 64 rows, which it leaves out of the seconds it returns.
            run.state = TrainState(epoch=epoch)
            run.plan = dataclasses.replace(run.plan, num_epochs=epoch + 1)
            stop = StopSignals()
            try:
                return train(run, stop)[0]  # training seconds (evaluation excluded)
            finally:
                stop.restore()

        def bare(epoch: int) -> float:
            run.train_loader.set_epoch(epoch)
            run.model.train()
            started = time.perf_counter()
            for _, batch in zip(range(args.batches), run.train_loader, strict=False):
                bare_step(run.accelerator, run.model, run.optimizer, run.scheduler, batch)
            return time.perf_counter() - started

        bare(0)  # untimed: the first steps allocate what later steps reuse
        seconds = {"finetune": [], "bare": []}
        sides = {"finetune": toolkit, "bare": bare}
        for epoch in range(1, args.repeats + 1):
            for name in list(sides) if epoch % 2 else list(sides)[::-1]:
                seconds[name].append(sides[name](epoch))
        close(run)
    overhead = [t / b - 1 for t, b in zip(seconds["finetune"], seconds["bare"], strict=True)]
    toolkit_ms, bare_ms = (1000 * sum(s) / (args.batches * args.repeats) for s in seconds.values())
    print(
        f"loop: {args.repeats} rounds of {args.batches} steps each, batch {args.batch_size}: "
        f"finetune {toolkit_ms:.0f} ms/step, bare loop {bare_ms:.0f} ms/step, overhead "
        f"{toolkit_ms / bare_ms - 1:+.1%} (rounds: median {statistics.median(overhead):+.1%}, "
        f"{min(overhead):+.1%} to {max(overhead):+.1%})"
    )


def _glibc_static_defaults() -> None:
    """glibc's starting thresholds, for an A/B inside one process. Not quite the default: setting them
    switches off glibc's adaptive mmap threshold, so this side is a lower bound of what keeping costs."""
    mallopt = _glibc_mallopt()
    if mallopt is not None:
        mallopt(_M_MMAP_MAX, 65536)
        mallopt(_M_TRIM_THRESHOLD, 128 * 1024)


class _Side:
    def __init__(self, setup: Setup, seed: int, bf16: bool):
        torch.manual_seed(seed)
        self.model = AutoModelForSequenceClassification.from_pretrained(_packaged_minilm(), num_labels=3)
        if setup.packed_dropout:
            use_packed_dropout(self.model)
        if setup.padding_free:
            use_padding_free(self.model, setup.rows_multiple)
        if setup.lora:  # as build_model wraps it: after the base model's kernels
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(
                task_type="SEQ_CLS", r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear"
            )
            self.model = get_peft_model(self.model, lora)
            if setup.packed_dropout and setup.lora_packed_dropout:
                pack_dropout_modules(self.model)
        self.model.train()
        trained = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trained, lr=1e-4, fused=True)
        self.bf16, self.keep_freed = bf16, setup.keep_freed

    def step(self, batch: dict) -> float:
        if self.keep_freed:
            keep_freed_memory()
        else:
            _glibc_static_defaults()
        started = time.perf_counter()
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            logits = self.model(**inputs).logits
        F.cross_entropy(logits.float(), batch["labels"]).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - started


if __name__ == "__main__":
    main()

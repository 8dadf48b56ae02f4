"""--precompute_ref_log_probs: the reference's log-probs of every training and validation pair, computed
once before training (each rank a share of the rows, gathered), kept beside the run in
`reference_logps.pt` keyed by what decides them (the reference, the rows, the tokenizer, --max_length),
so a resumed run reads them back instead of computing them again. Evaluation reads them too: the
reference is never the policy (trl#1107)."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import torch
from accelerate.utils import DistributedType, gather_object
from torch.utils.data import DataLoader

from finetune.config.identity import run_identity

FILE = "reference_logps.pt"
DECIDES = ("model", "model_files", "training_data", "validation_data", "tokenizer", "max_length",
           "ref_model_name_or_path", "use_peft", "gguf_file", "model_revision", "torch_dtype")  # fmt: skip
"""The identity's entries that decide the reference's log-probs (summed, with their target counts: the
loss type, which may average them, does not)."""


def reference_key(config) -> str:
    identity = run_identity(config, 1)
    decided = {name: identity.get(name) for name in DECIDES}
    decided["mixed_precision"] = config.mixed_precision  # the training split is scored under its autocast
    decided["evaluated_splits"] = "without autocast"  # as the exported policy is scored (a file before: with)
    return hashlib.sha256(json.dumps(decided, sort_keys=True, default=str).encode()).hexdigest()[:16]


def precomputed_logps(accelerator, config, splits: dict, collator, compute) -> dict[str, torch.Tensor]:
    """Collective: {split: [rows, 2] float32 (chosen, rejected summed reference log-probs), [rows, 2]
    counts} for each split, read from the run's file when its key matches, else computed (`compute(batch,
    split)` -> (summed logps of the batch's 2R sequences, their counts)), gathered, and written by rank 0."""
    path, key = Path(config.output_dir) / FILE, reference_key(config)
    kept = torch.load(path, weights_only=True) if path.is_file() else None
    if kept is not None and kept.get("key") == key and set(splits) <= set(kept["splits"]):
        return {name: kept["splits"][name] for name in splits}
    found = {}
    for name, split in splits.items():
        rank, world = accelerator.process_index, accelerator.num_processes
        share = split.select(
            range(rank, len(split), world)
        )  # every rank its rows, the same count or one less
        rows, last = [], None
        loader = DataLoader(share, batch_size=config.per_device_eval_batch_size, collate_fn=collator)
        for batch in loader:
            numbers = batch.pop("row").tolist()
            batch = last = {k: v.to(accelerator.device) for k, v in batch.items()}
            logps, counts = compute(dict(batch), name)
            pairs = len(numbers)
            for i, number in enumerate(numbers):
                sides = (float(logps[i]), float(logps[pairs + i]), int(counts[i]), int(counts[pairs + i]))
                rows.append((number, *sides))
        _even_forwards(
            accelerator, config, split, collator, functools.partial(compute, split=name), len(loader), last
        )
        everything = sorted(gather_object(rows))
        size = max(number for number, *_ in everything) + 1 if everything else 0  # by the rows' `row`
        table = torch.zeros(size, 2)
        targets = torch.zeros(size, 2, dtype=torch.int64)
        for number, chosen, rejected, chosen_n, rejected_n in everything:
            table[number] = torch.tensor([chosen, rejected])
            targets[number] = torch.tensor([chosen_n, rejected_n])
        found[name] = {"logps": table, "counts": targets}
    if accelerator.is_main_process:
        torch.save({"key": key, "splits": found}, path)
    accelerator.wait_for_everyone()
    return found


def _even_forwards(accelerator, config, split, collator, compute, done: int, last) -> None:
    """Collective under FSDP: a sharded model's forward all-gathers, so every rank runs as many as the
    rank with the most rows (a share is one row short on some ranks); the extra ones score a batch again
    and are dropped. Nothing without FSDP."""
    if accelerator.distributed_type != DistributedType.FSDP:
        return
    most = -(-len(split) // accelerator.num_processes)  # rows of the largest share
    for _ in range(-(-most // config.per_device_eval_batch_size) - done):
        if last is None:  # this rank had no row at all
            last = {k: v.to(accelerator.device) for k, v in collator([split[0]]).items() if k != "row"}
        compute(dict(last))

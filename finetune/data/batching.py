"""Batches: the length-grouped sampler, its cut into each process's micro-batches, the padding and
padding-free (varlen) collators, --pad_to_multiple_of, the dataloaders."""

from __future__ import annotations

import numpy as np
import torch
from datasets import Dataset
from torch.utils.data import DataLoader, Sampler
from torch.utils.data import Dataset as TorchDataset

from finetune.config.resolved import eval_batch_size
from finetune.config.train_config import TrainConfig

MODEL_INPUTS = (
    "input_ids", "token_type_ids", "attention_mask", "labels", "row", "doc", "weight", "document_lengths",
    "word_index",
)  # fmt: skip
PLACEHOLDER = "placeholder"
"""The key (a Python bool, True) of a micro-batch whose rows weigh nothing (`RankBatches`)."""


class LengthGroupedSampler(Sampler[int]):
    """A fresh seeded shuffle every epoch; with grouping, batches of similar length in random order.

    Each chunk of `mega_batches` shuffled global batches is sorted by length and cut into batches,
    so little of a batch is padding, and those batches are shuffled again: left sorted (HF Trainer's
    group_by_length) the steps run from long pairs to short ones in a sawtooth, which cost MiniLM
    MNLI accuracy in 1-epoch runs (docs/design.md has the table). The order is a
    pure function of (seed, epoch): `RankBatches` cuts each global batch of it into the ranks'
    micro-batches (`global_batch_size` is the per-device batch times the processes, so one step's ranks
    get similar lengths), and a resumed run that sets the same epoch and skips the finished batches sees
    exactly the same data.
    """

    def __init__(
        self,
        lengths: list[int],
        global_batch_size: int,
        seed: int,
        group_by_length: bool = True,
        mega_batches: int = 16,
    ):
        self.lengths = lengths
        self.global_batch_size = global_batch_size
        self.mega_batches = mega_batches
        self.seed = seed
        self.group_by_length = group_by_length
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        if not self.group_by_length:
            return iter(order)
        size = self.global_batch_size
        by_length = []
        for start in range(0, len(order), size * self.mega_batches):
            chunk = order[start : start + size * self.mega_batches]
            by_length.extend(sorted(chunk, key=self.lengths.__getitem__, reverse=True))
        batches = [by_length[i : i + size] for i in range(0, len(by_length), size)]
        # Only whole batches move: a short last batch stays last, or every later batch would shift.
        whole = len(order) // size
        shuffled = [batches[i] for i in torch.randperm(whole, generator=generator).tolist()]
        return iter([i for batch in shuffled + batches[whole:] for i in batch])


class RankBatches(Sampler[list[int]]):
    """The training loader's batches: each global batch of `sampler`'s order (per-device batch x
    processes rows) cut into one micro-batch per process, in rank order, which Accelerate hands out
    round-robin (rank r gets the r-th of every `world_size`; no `batch_size` attribute: it pads nothing).

    Each row is trained once an epoch on any number of processes (Accelerate's own sharding repeats
    rows from the start to fill the last batches), and every process gets ceil(rows / global batch)
    micro-batches (training/steps.py), so every rank meets each gradient all-reduce. A full global
    batch gives rank r the same rows as Accelerate's sharding (the r-th `batch_size`); the epoch's
    short last one is cut as evenly as its rows allow, and a rank it leaves without a row gets a
    placeholder: `~i` for row i (the shortest: the cheapest to run), which `TrainRows` reads as that row
    weighing nothing (the loop runs it with a loss of zero: its gradients are zeros, all-reduced).
    """

    def __init__(self, sampler: LengthGroupedSampler, batch_size: int, world_size: int):
        self.sampler = sampler
        """Set_epoch reaches it here (Accelerate's DataLoaderShard looks for `batch_sampler.sampler`)."""
        self.per_device = batch_size
        self.world_size = world_size
        lengths = sampler.lengths
        self.shortest = min(range(len(lengths)), key=lengths.__getitem__) if lengths else 0

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        global_batch = self.per_device * self.world_size
        return -(-len(self.sampler) // global_batch) * self.world_size

    def __iter__(self):
        order, size = list(self.sampler), self.per_device * self.world_size
        for start in range(0, len(order), size):
            rows = order[start : start + size]
            # A full global batch: `per_device` rows each; a short one: the first `more` ranks one more.
            each, more = divmod(len(rows), self.world_size)
            end = 0
            for r in range(self.world_size):
                share, end = rows[end : end + each + (r < more)], end + each + (r < more)
                yield share or [~self.shortest]


class TrainRows(TorchDataset):
    """The training rows as their loader reads them: row i at i, and at ~i (negative: a `RankBatches`
    placeholder) row i marked as weighing nothing, which `MarkPlaceholders` puts on its batch."""

    def __init__(self, rows: Dataset):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key):  # a column by name too, as the Dataset's
        return self.rows[key]

    def __getitems__(self, keys: list[int]) -> list[dict]:
        if keys[0] >= 0:
            return self.rows.__getitems__(keys)
        return [{**row, PLACEHOLDER: True} for row in self.rows.__getitems__([~key for key in keys])]


class MarkPlaceholders:
    """A family's collator; a placeholder's batch (`TrainRows`) gets `PLACEHOLDER: True`, a Python bool:
    the loop reads it without waiting for the device, and a real batch has no such key."""

    def __init__(self, collator):
        self.collator = collator

    def __call__(self, features: list[dict]) -> dict:
        if not features[0].get(PLACEHOLDER):
            return self.collator(features)
        rows = [{k: v for k, v in feature.items() if k != PLACEHOLDER} for feature in features]
        return {**self.collator(rows), PLACEHOLDER: True}


class PadCollator:
    """The batches of transformers' DataCollatorWithPadding (pad ids from the tokenizer, its padding
    side, the longest pair rounded up to `pad_to_multiple_of`), filled in numpy.

    Much faster than the tokenizer's `pad` (docs/design.md has the figures), which matters: it runs
    in the training process between steps: on a GPU, whose small steps are bound by the CPU launching
    kernels, the GPU waits for it.
    """

    def __init__(self, tokenizer, pad_to_multiple_of: int | None = None, max_length: int | None = None):
        self.pad_ids = {
            "input_ids": tokenizer.pad_token_id,
            "token_type_ids": tokenizer.pad_token_type_id,
            "attention_mask": 0,
        }
        self.left = tokenizer.padding_side == "left"
        self.multiple = pad_to_multiple_of or 1
        self.max_length = max_length
        """Widths are capped here (the truncation length): with 32 at 128 the buckets are 32, 64, 96, 128."""

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        longest = max(len(f["input_ids"]) for f in features)
        width = bucket(longest, self.multiple, self.max_length)
        batch = {}
        for key in features[0]:
            if key not in self.pad_ids:  # labels, row: one value per pair
                batch[key] = torch.tensor([f[key] for f in features])
                continue
            padded = np.full((len(features), width), self.pad_ids[key], dtype=np.int64)
            for row, feature in zip(padded, features, strict=True):
                values = feature[key]
                if self.left:
                    row[width - len(values) :] = values
                else:
                    row[: len(values)] = values
            batch[key] = torch.from_numpy(padded)
        return batch


def bucket(tokens: int, multiple: int, cap: int | None) -> int:
    """`tokens` rounded up to a multiple of `multiple`, but never past `cap` (unless `tokens` is)."""
    rounded = -(-tokens // multiple) * multiple
    return rounded if cap is None else min(rounded, max(cap, tokens))


class VarlenCollator:
    """Batches for `--padding_free varlen`: the real tokens of every pair in one row, built on the CPU.

    input_ids, token_type_ids, attention_mask (1: a real token) and position_ids (restarting at
    `position_offset` in every segment) are [1, tokens]; `cu_seq_lens_q`/`_k` (int32, [2 x pairs + 1])
    bound the pairs, then as many padding segments of at most `pad_to_multiple_of` tokens (some
    empty), which round the token count up to a multiple of `pad_to_multiple_of` x pairs: as few
    shapes as padded batches have lengths. `max_length_q`/`_k`, the longest segment allowed, is the
    same in every batch, so compiled code is not specialized on it. The device never has to find the
    pairs (no nonzero()), and padding costs attention at most pairs x pad_to_multiple_of².
    """

    def __init__(self, tokenizer, pad_to_multiple_of: int | None, max_length: int, position_offset: int = 0):
        self.pad_ids = {"input_ids": tokenizer.pad_token_id, "token_type_ids": tokenizer.pad_token_type_id}
        self.multiple = pad_to_multiple_of or 1
        self.longest = max(max_length, self.multiple)
        self.position_offset = position_offset

    def __call__(self, features: list[dict]) -> dict:
        rows = len(features)
        lengths = np.array([len(f["input_ids"]) for f in features], dtype=np.int64)
        real = int(lengths.sum())
        total = bucket(real, self.multiple * rows if self.multiple > 1 else 1, None)  # 1: no padding
        padding = np.full(rows, -(-(total - real) // rows), dtype=np.int64)  # each < multiple
        padding = np.clip(total - real - np.arange(rows) * padding[0], 0, padding)
        segments = np.concatenate([lengths, padding])
        starts = np.concatenate([[0], np.cumsum(segments)])
        batch = {}
        for key in ("input_ids", "token_type_ids"):
            if key not in features[0]:
                continue
            row = np.full(total, self.pad_ids[key], dtype=np.int64)
            row[:real] = np.concatenate([f[key] for f in features])
            batch[key] = torch.from_numpy(row).unsqueeze(0)
        mask = np.zeros(total, dtype=np.int64)
        mask[:real] = 1
        positions = np.arange(total, dtype=np.int64) - np.repeat(starts[:-1], segments)
        batch["attention_mask"] = torch.from_numpy(mask).unsqueeze(0)
        batch["position_ids"] = torch.from_numpy(positions + self.position_offset).unsqueeze(0)
        bounds = torch.from_numpy(starts.astype(np.int32))
        batch["cu_seq_lens_q"], batch["cu_seq_lens_k"] = bounds, bounds.clone()
        batch["max_length_q"] = batch["max_length_k"] = self.longest
        for key in features[0]:
            if key not in ("input_ids", "token_type_ids", "attention_mask"):  # labels, row: one per pair
                batch[key] = torch.tensor([f[key] for f in features])
        return batch


def resolve_pad_to_multiple_of(requested: str, on_gpu: bool) -> str:
    """--pad_to_multiple_of as a number. auto: 8 on CUDA, whose tensor cores want lengths in multiples
    of 8; 1 (exact lengths) on CPU, where padding is only extra work."""
    if requested != "auto":
        return requested
    return "8" if on_gpu else "1"


def build_dataloaders(
    tokenized: dict[str, Dataset],
    tokenizer,
    config: TrainConfig,
    world_size: int,
    on_gpu: bool,
    position_offset: int = 0,
    collator=None,
    columns: tuple[str, ...] = MODEL_INPUTS,
) -> dict[str, DataLoader]:
    """One loader per split: train in seeded length-grouped order, the others sorted by length.
    `position_offset`: where positions start in a `--padding_free varlen` batch (RoBERTa's start after
    its padding id). `collator`: another family's batches (default: classification's); `columns`: the
    ones it reads (a pair's chosen_* and rejected_*)."""
    multiple = int(resolve_pad_to_multiple_of(config.pad_to_multiple_of, on_gpu))
    if collator is not None:
        pass
    elif config.padding_free == "varlen":
        collator = VarlenCollator(tokenizer, multiple, config.max_length, position_offset)
    else:
        collator = PadCollator(tokenizer, multiple, config.max_length)
    workers = config.dataloader_num_workers
    common = {
        "collate_fn": collator,
        "num_workers": workers,
        "pin_memory": on_gpu,
        "persistent_workers": workers > 0,
    }
    loaders = {}
    for name, split in tokenized.items():
        inputs = split.select_columns([c for c in columns if c in split.column_names])
        # A list: datasets' lazy Column reads Arrow on every index, which makes a sort by it slow.
        lengths = split.select_columns(["length"]).to_dict()["length"]
        if name == "train":
            sampler = LengthGroupedSampler(
                lengths,
                global_batch_size=config.per_device_train_batch_size * world_size,
                seed=config.seed,
                group_by_length=config.group_by_length,
            )
            loaders[name] = DataLoader(
                TrainRows(inputs),
                batch_sampler=RankBatches(sampler, config.per_device_train_batch_size, world_size),
                # Its own generator: starting an epoch draws nothing from the global RNG dropout uses.
                generator=torch.Generator().manual_seed(config.seed),
                **{**common, "collate_fn": MarkPlaceholders(collator)},
            )
            continue
        # Length-sorted evaluation pads almost nothing; metrics do not depend on the order, and
        # predictions carry their row number back to the input order.
        loaders[name] = DataLoader(
            inputs,
            batch_size=eval_batch_size(config, "cuda" if on_gpu else "cpu"),  # resolved or not
            sampler=sorted(range(len(lengths)), key=lengths.__getitem__),
            # Starting an iteration draws a seed: from its own generator, not the global RNG that
            # dropout uses, so an evaluation (or one abandoned at a stop signal) leaves training as is.
            generator=torch.Generator().manual_seed(config.seed),
            **common,
        )
    return loaders

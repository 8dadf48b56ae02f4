"""Cached tokenization of the splits."""

from __future__ import annotations

from collections import Counter

from datasets import Dataset

from finetune.data.tasks import Task
from finetune.data.windows import encode_windows


def tokenize_splits(
    task: Task,
    splits: dict[str, Dataset],
    tokenizer,
    max_length: int,
    accelerator,
    doc_stride: int | None = None,
    weigh_documents: bool = False,
) -> dict[str, Dataset]:
    """Collective (rank 0 tokenizes first): token ids plus a `length` column (test: the `row` number
    instead of labels); cached by `datasets`, so a second run skips the work.

    `doc_stride` (--long_documents sliding_window): long texts become overlapping windows, each with its
    row's label; evaluation and test windows also carry their row's number as `doc`. `weigh_documents`
    (--window_loss_weighting document): training windows carry `weight`, 1 / their document's windows."""

    def encode(batch, rows, name):
        texts = [[str(t) if t is not None else "" for t in batch[c]] for c in task.text_columns]
        if doc_stride is None:
            encoded = tokenizer(*texts, truncation=True, max_length=max_length)
            source = list(range(len(rows)))
        else:
            encoded = encode_windows(tokenizer, texts, max_length, doc_stride)
            source = encoded.pop("doc")
            if name != "train":  # training takes each window as one example; the others score documents
                encoded["doc"] = [rows[i] for i in source]
            elif weigh_documents:  # a batch of rows holds all the windows of each of them
                windows = Counter(source)
                encoded["weight"] = [1.0 / windows[i] for i in source]
        if "label" in batch:
            encoded["labels"] = [batch["label"][i] for i in source]
        else:
            encoded["row"] = [rows[i] for i in source]
        encoded["length"] = [len(ids) for ids in encoded["input_ids"]]
        return encoded

    # Rank 0 tokenizes and writes the cache first; the other ranks then read it instead of redoing it.
    with accelerator.main_process_first():
        return {
            name: split.map(
                encode,
                batched=True,
                with_indices=True,
                fn_kwargs={"name": name},
                remove_columns=split.column_names,
                desc=f"tokenize {name}",
            )
            for name, split in splits.items()
        }

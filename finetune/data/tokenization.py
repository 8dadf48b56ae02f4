"""Cached tokenization of the splits."""

from __future__ import annotations

from datasets import Dataset

from finetune.data.tasks import Task


def tokenize_splits(
    task: Task, splits: dict[str, Dataset], tokenizer, max_length: int, accelerator
) -> dict[str, Dataset]:
    """Collective (rank 0 tokenizes first): token ids plus a `length` column (test: the `row` number
    instead of labels); cached by `datasets`, so a second run skips the work."""

    def encode(batch, rows):
        texts = [[str(t) if t is not None else "" for t in batch[c]] for c in task.text_columns]
        encoded = tokenizer(*texts, truncation=True, max_length=max_length)
        if "label" in batch:
            encoded["labels"] = batch["label"]
        else:
            encoded["row"] = rows
        encoded["length"] = [len(ids) for ids in encoded["input_ids"]]
        return encoded

    # Rank 0 tokenizes and writes the cache first; the other ranks then read it instead of redoing it.
    with accelerator.main_process_first():
        return {
            name: split.map(
                encode,
                batched=True,
                with_indices=True,
                remove_columns=split.column_names,
                desc=f"tokenize {name}",
            )
            for name, split in splits.items()
        }

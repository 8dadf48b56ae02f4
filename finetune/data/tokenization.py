"""Cached tokenization of the splits."""

from __future__ import annotations

import functools
import hashlib
from collections import Counter
from pathlib import Path

from datasets import Dataset

from finetune.data.tasks import Task
from finetune.data.windows import encode_windows

PYTHON_SIDE = ("truncation_side", "model_input_names", "split_special_tokens", "add_bos_token",
               "add_eos_token")  # fmt: skip
"""The tokenizer's attributes besides its Rust serialization that decide the tokens (transformers copies
split_special_tokens onto the backend per call; to_str() leaves it out)."""


def tokenize_splits(
    task: Task,
    splits: dict[str, Dataset],
    tokenizer,
    max_length: int,
    accelerator,
    doc_stride: int | None = None,
    weigh_documents: bool = False,
    default_stride: bool = False,
) -> dict[str, Dataset]:
    """Collective (rank 0 tokenizes first): token ids plus a `length` column (test: the `row` number
    instead of labels); cached by `datasets`, so a second run skips the work.

    `doc_stride` (--long_documents sliding_window): long texts become overlapping windows, each with its
    row's label; evaluation and test windows also carry their row's number as `doc`. `weigh_documents`
    (--window_loss_weighting document): training windows carry `weight`, 1 / their document's windows.
    `default_stride`: --doc_stride was not given (a quarter of `max_length`), for the refusals' fixes."""

    def encode(batch, rows, name):
        texts = [[str(t) if t is not None else "" for t in batch[c]] for c in task.text_columns]
        if doc_stride is None:
            encoded = tokenizer(*texts, truncation=True, max_length=max_length)
            source = list(range(len(rows)))
        else:
            encoded = encode_windows(tokenizer, texts, max_length, doc_stride, default_stride)
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

    # What decides the tokens besides each split's rows: datasets' cache key (`new_fingerprint`) is
    # made of them, rather than of a pickled tokenizer (tokenizer_state).
    decides = (task.text_columns, max_length, doc_stride, weigh_documents, tokenizer_state(tokenizer))
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
                new_fingerprint=decides[-1] and _key(split, name, decides),
            )
            for name, split in splits.items()
        }


def tokenizer_state(tokenizer) -> str | None:
    """Everything of a fast tokenizer that decides its tokens: the Rust tokenizer's full serialization
    (vocabulary, normalizer, pre-tokenizer, special tokens' template) and the Python side's settings,
    with the versions. Without it datasets hashes the tokenization function by pickling the tokenizer
    it closes over, ~0.3 s per split even for BERT's vocabulary, on every rank of every run (docs/log.md).
    None, so datasets hashes as before, for a tokenizer without a fast (Rust) backend."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    import tokenizers
    import transformers

    # transformers sets truncation and padding on the backend per call: cleared, the state does not
    # depend on the previous call (the next call sets them again).
    backend.no_truncation()
    backend.no_padding()
    settings = {name: getattr(tokenizer, name, None) for name in PYTHON_SIDE}
    return repr((type(tokenizer).__name__, settings, backend.to_str(), transformers.__version__,
                 tokenizers.__version__))  # fmt: skip


def _key(split: Dataset, name: str, decides: tuple) -> str:
    """datasets' cache key for one split's tokens: its rows' fingerprint, what decides the tokens, and
    the code that encodes them."""
    parts = (split._fingerprint, name, "label" in split.column_names, decides, _code_digest())
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


@functools.cache
def _code_digest() -> str:
    """This module's and the windows' source: a changed encoding never reads a cache from before it."""
    here = Path(__file__)
    return hashlib.sha256(here.read_bytes() + here.with_name("windows.py").read_bytes()).hexdigest()

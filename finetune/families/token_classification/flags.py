"""Token classification's flags (`--task_type token_classification`): tag ids and sub-tokens. Read by
`finetune.config` through the seam (finetune/families/__init__.py FLAG_GROUPS)."""

from __future__ import annotations

from dataclasses import dataclass

from finetune.config.families import Owned

NAME = "token_classification"
OWNED = {
    "label_names": Owned((NAME,), "names a tagger's tag ids", before=None),
    "label_all_tokens": Owned((NAME,), "tags every sub-token of a word", before=False),
}
"""The flags only this family reads (it shares its others with the classifier's: text and label columns,
class weights, label smoothing, --doc_stride)."""


@dataclass(frozen=True)
class TaggingArgs:
    """Token classification (--task_type token_classification): tag ids and sub-tokens."""

    label_names: str | None = None
    """token_classification: comma-separated tag names, in id order, for files whose tags are ids (HF's
    conll2003 ner_tags: O,B-PER,I-PER,B-ORG,I-ORG,B-LOC,I-LOC,B-MISC,I-MISC); the model's labels keep
    that order. A ClassLabel column's ids are read by its own names (--label_names then orders them)."""
    label_all_tokens: bool = False
    """token_classification: train every sub-token of a word on its tag (a B-X's later sub-tokens on I-X,
    run_ner's name and rule), not its first sub-token only. Metrics and predictions stay per word, read from
    each word's first sub-token."""

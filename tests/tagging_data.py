"""Tagging data the tests generate: template sentences whose slots are filled from small gazetteers of
people, places and organisations (IOB2 tags), written as JSONL, CoNLL or CoNLL-U; and a tiny BERT token
classifier to train on them."""

from __future__ import annotations

import json
import random
from pathlib import Path

GAZETTEERS = {
    "PER": ["John", "Mary", "Paul", "Anna", "Peter", "Laura", "David", "Sarah", "John Smith", "Kowalski"],
    "LOC": ["Paris", "London", "Berlin", "Tokyo", "Madrid", "Rome", "New York", "Zanzibar", "Reykjavik"],
    "ORG": ["Google", "Microsoft", "Amazon", "Intel", "Toyota", "Volkswagen", "Reuters"],
}
"""Some names are two words, some one word of several WordPiece sub-tokens (Kowalski, Zanzibar)."""
SINGLE = {kind: [n for n in names if n.lower() in ("john", "mary", "paul", "anna", "peter", "laura",
                                                  "david", "sarah", "paris", "london", "berlin", "tokyo",
                                                  "madrid", "rome", "google", "microsoft", "amazon",
                                                  "intel", "toyota", "reuters")]
          for kind, names in GAZETTEERS.items()}  # fmt: skip
"""Names of one word and one sub-token each (in MiniLM's vocabulary)."""
TEMPLATES = [
    "{PER} lives in {LOC} .",
    "{PER} works for {ORG} .",
    "yesterday {PER} met {PER} in {LOC} .",
    "{ORG} opened an office in {LOC} last week .",
    "the weather in {LOC} was cold .",
    "nothing happened today .",
    "{PER} said that {ORG} will buy a house in {LOC} .",
]


def sentence(rng: random.Random, single: bool = False) -> dict:
    """{"tokens": words, "ner_tags": IOB2 tags} from a random template; `single`: one-sub-token names."""
    pools = SINGLE if single else GAZETTEERS
    words, tags = [], []
    for piece in rng.choice(TEMPLATES).split():
        if piece.startswith("{"):
            kind = piece[1:-1]
            name = rng.choice(pools[kind]).split()
            words += name
            tags += [f"B-{kind}"] + [f"I-{kind}"] * (len(name) - 1)
        else:
            words.append(piece)
            tags.append("O")
    return {"tokens": words, "ner_tags": tags}


def sentences(count: int, seed: int, single: bool = False) -> list[dict]:
    rng = random.Random(seed)
    return [sentence(rng, single) for _ in range(count)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_conll(path: Path, rows: list[dict], docstart: bool = True) -> Path:
    """CoNLL-2003's layout: word, POS, chunk, NER tag per line (POS and chunk placeholders)."""
    lines = ["-DOCSTART- -X- -X- O", ""] if docstart else []
    for row in rows:
        lines += [f"{w} NN I-NP {t}" for w, t in zip(row["tokens"], row["ner_tags"], strict=True)] + [""]
    path.write_text("\n".join(lines) + "\n")
    return path


POS = {"in": "ADP", "for": "ADP", "that": "SCONJ", "the": "DET", "an": "DET", "a": "DET", ".": "PUNCT",
       "will": "AUX", "was": "AUX", "lives": "VERB", "works": "VERB", "met": "VERB", "opened": "VERB",
       "happened": "VERB", "said": "VERB", "buy": "VERB", "cold": "ADJ", "last": "ADJ", "yesterday": "ADV",
       "today": "ADV", "nothing": "PRON"}  # fmt: skip
"""UPOS of the templates' words; names are PROPN, any other word NOUN."""


def write_conllu(path: Path, rows: list[dict]) -> Path:
    """The sentences as CoNLL-U with their UPOS, every third one with a multiword token's range line
    before its first word and an empty node after it (both untagged, as UD has them)."""
    lines = []
    for number, row in enumerate(rows):
        lines += [f"# sent_id = {number}", f"# text = {' '.join(row['tokens'])}"]
        for i, (word, tag) in enumerate(zip(row["tokens"], row["ner_tags"], strict=True), 1):
            if number % 3 == 0 and i == 1:
                lines.append(f"1-2\t{word}{row['tokens'][1]}\t_\t_\t_\t_\t_\t_\t_\t_")
            upos = "PROPN" if tag != "O" else POS.get(word.lower(), "NOUN")
            lines.append(f"{i}\t{word}\t{word.lower()}\t{upos}\t_\t_\t0\tdep\t_\t_")
            if number % 3 == 0 and i == 1:
                lines.append("1.1\tgone\tgo\tVERB\t_\t_\t_\t_\t0:root\t_")
        lines.append("")
    path.write_text("\n".join(lines) + "\n")
    return path


def tiny_tagger(folder: Path, labels: tuple[str, ...] | None = None) -> Path:
    """The tiny random BERT of tests/backbones.py (MiniLM's WordPiece tokenizer) as a token classifier:
    its encoder saved with a token-classification head, without dropout (so that an update does not
    depend on how its micro-batches draw their masks). `labels`: its head's, in id order (a run whose
    training tags are these keeps the head)."""
    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification

    from tests.backbones import build_tiny

    build_tiny("bert", folder)
    head = (
        {}
        if labels is None
        else {"id2label": dict(enumerate(labels)), "label2id": {n: i for i, n in enumerate(labels)}}
    )
    config = AutoConfig.from_pretrained(
        folder, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **head
    )
    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_pretrained(
        folder, config=config, ignore_mismatched_sizes=True
    )
    model.save_pretrained(folder)
    return folder

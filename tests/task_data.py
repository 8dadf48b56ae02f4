"""Small learnable files in the shape of each kind of GLUE task, with GLUE's own column names.

single: a sentence whose label is the sentiment word in it (SST-2, CoLA shape).
pair: two reviews, label 1 when both are good (MRPC, QQP shape).
regression: two reviews scored 0-5, the sum of their stars (STS-B shape).
Both need the two sentences: from one alone the best is 75% accuracy (F1 0.67), Pearson 0.71.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SUBJECTS = [
    "the film",
    "the meal",
    "the hotel",
    "the concert",
    "the book",
    "the game",
    "the trip",
    "the show",
]
GOOD = ["wonderful", "great", "delightful", "excellent", "lovely"]
BAD = ["terrible", "awful", "boring", "dreadful", "poor"]
FILLER = ["really", "quite", "truly", "", "", "honestly", "overall"]
WORDS = [
    "dog",
    "river",
    "city",
    "music",
    "garden",
    "train",
    "winter",
    "bread",
    "doctor",
    "ocean",
    "paper",
    "horse",
]


def single_sentence(rng: random.Random) -> dict:
    good = rng.random() < 0.5
    words = [rng.choice(SUBJECTS), "was", rng.choice(FILLER), rng.choice(GOOD if good else BAD)]
    return {"sentence": " ".join(w for w in words if w) + ".", "label": int(good)}


def _review(rng: random.Random, stars: int) -> str:
    """A sentence with 0, 1 or 2 stars' worth of sentiment: bad, so-so (no word) or good."""
    word = {0: rng.choice(BAD), 1: "", 2: rng.choice(GOOD)}[stars]
    return " ".join(w for w in (rng.choice(SUBJECTS), "was", rng.choice(FILLER), word or "there") if w) + "."


def pair(rng: random.Random) -> dict:
    first, second = rng.choice((0, 2)), rng.choice((0, 2))
    return {
        "sentence1": _review(rng, first),
        "sentence2": _review(rng, second),
        "label": int(first == second == 2),
    }


def regression(rng: random.Random) -> dict:
    first, second = rng.randrange(3), rng.randrange(3)
    return {
        "sentence1": _review(rng, first),
        "sentence2": _review(rng, second),
        "label": 1.25 * (first + second),
    }


SHAPES = {"single": single_sentence, "pair": pair, "regression": regression}


def write_task_files(
    folder: Path, shape: str, n_train: int, n_validation: int, columns: tuple[str, ...] | None = None
) -> dict:
    """JSONL files; `columns` renames the text columns (a task's own names, e.g. question1, question2)."""
    rng = random.Random(0)
    make = SHAPES[shape]
    files = {}
    for split, n in (("train", n_train), ("validation", n_validation)):
        rows = [make(rng) for _ in range(n)]
        if columns:
            rows = [dict(zip((*columns, "label"), r.values(), strict=True)) for r in rows]
        files[split] = folder / f"{shape}_{split}.jsonl"
        files[split].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return files


def unbalanced_topics(rng, n):
    """A sentence naming one of three topics; 'sports' is 4 times as common as the others."""
    words = {"sports": ["football", "tennis"], "politics": ["election", "vote"], "weather": ["rain", "snow"]}
    rows = []
    for _ in range(n):
        label = rng.choice(["sports"] * 4 + ["politics", "weather"])
        rows.append({"text": f"news about {rng.choice(words[label])} today", "topic": label})
    return rows


REPEATS = 12


def long_document(rng: random.Random, label: str) -> dict:
    """400-800 filler words with one verdict sentence at a random place, which alone decides the label:
    beyond the first 128 tokens in most documents (each filler word is one WordPiece token)."""
    words = [rng.choice(WORDS) for _ in range(rng.randrange(400, 800))]
    at = rng.randrange(len(words))
    words[at:at] = ["the", "verdict", "is", *[label] * REPEATS, "."]  # repeated: the tiny BERT learns it fast
    return {"text": " ".join(words), "label": label}


def write_long_documents(folder: Path, n_train: int, n_validation: int, seed: int = 0) -> dict:
    """JSONL files of `long_document` rows (text, label), the labels alternating (balanced)."""
    rng = random.Random(seed)
    files = {}
    for split, n in (("train", n_train), ("validation", n_validation)):
        files[split] = folder / f"long_{split}.jsonl"
        rows = [long_document(rng, ("positive", "negative")[i % 2]) for i in range(n)]
        files[split].write_text("".join(json.dumps(row) + "\n" for row in rows))
    return files


def write_mixed_length_documents(folder: Path, n_train: int, n_validation: int, skew: float = 0.8) -> dict:
    """Half short documents (30-90 filler words: one window at --max_length 128) and half long ones
    (210-760 words: 3-8 windows at 128 with a stride of 32), each with a verdict sentence at a random place
    that decides its label; the labels differ by length: `skew` of the short ones are positive, `skew` of
    the long ones negative. JSONL files (text, label), seeded."""
    rng = random.Random(1)
    files = {}
    for split, n in (("train", n_train), ("validation", n_validation)):
        rows = []
        for i in range(n):
            short = i % 2 == 0
            label = ("positive", "negative")[(rng.random() < skew) != short]
            words = [rng.choice(WORDS) for _ in range(rng.randrange(*((30, 90) if short else (210, 760))))]
            at = rng.randrange(len(words))
            words[at:at] = ["the", "verdict", "is", *[label] * REPEATS, "."]
            rows.append({"text": " ".join(words), "label": label})
        files[split] = folder / f"mixed_{split}.jsonl"
        files[split].write_text("".join(json.dumps(row) + "\n" for row in rows))
    return files

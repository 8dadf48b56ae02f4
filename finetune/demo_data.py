"""A small synthetic NLI dataset for the offline demo and the tests.

Premises describe a scene ("A tired chef is slicing vegetables in a kitchen."). Hypotheses are
built from it with one of several rules per label: a generalisation or a restatement entails it;
a clashing action, place, person or a negation contradicts it; an unverifiable added detail or
motive leaves it neutral. The words vary enough that a model must read both sentences.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

# (specific person, generalisation, a person it cannot also be)
PEOPLE = [
    ("man", "person", "woman"),
    ("woman", "person", "man"),
    ("boy", "child", "old man"),
    ("girl", "child", "old woman"),
    ("chef", "cook", "firefighter"),
    ("doctor", "professional", "toddler"),
    ("teacher", "adult", "baby"),
    ("musician", "performer", "infant"),
    ("soldier", "adult", "kindergartner"),
    ("student", "young person", "retiree"),
    ("police officer", "adult", "newborn"),
    ("grandmother", "woman", "teenage boy"),
]
ADJECTIVES = ["tall", "young", "tired", "smiling", "bearded", "cheerful", "serious", "short", "quiet", "busy"]
# (specific action, generalisation, action it cannot be doing at the same time)
ACTIONS = [
    ("playing a guitar", "playing an instrument", "sleeping in bed"),
    ("riding a bicycle", "riding something", "swimming in a pool"),
    ("eating a sandwich", "eating food", "brushing their teeth"),
    ("reading a newspaper", "reading", "running a marathon"),
    ("painting a fence", "painting", "taking a nap"),
    ("slicing vegetables", "preparing food", "driving a truck"),
    ("throwing a ball", "playing with a ball", "sitting perfectly still"),
    ("singing a song", "making sound", "sleeping silently"),
    ("climbing a ladder", "climbing", "lying on a couch"),
    ("washing a car", "cleaning a vehicle", "flying a plane"),
    ("walking a dog", "walking with an animal", "sitting at a desk"),
    ("writing a letter", "writing", "dancing at a party"),
]
# (place, generalisation, a place it cannot also be)
PLACES = [
    ("in a park", "outdoors", "inside an office"),
    ("on a beach", "outside", "in a basement"),
    ("in a kitchen", "indoors", "on a mountain top"),
    ("on a busy street", "in a city", "in the middle of the ocean"),
    ("in a garden", "outside", "in a library"),
    ("at a train station", "in a public place", "in a bathtub"),
    ("in a classroom", "inside a building", "in a forest"),
    ("next to a lake", "near water", "in a desert"),
]
MOTIVES = [
    "because it is their birthday",
    "for the first time",
    "to impress a friend",
    "while waiting for a bus",
    "before going to work",
    "for a competition",
    "after a long day",
    "with their best friend",
]


def _entailment(rng, person, adj, action, place) -> str:
    rule = rng.randrange(4)
    if rule == 0:
        return f"A {person[1]} is {action[1]}."
    if rule == 1:
        return f"A {person[0]} is {action[0]} {place[1]}."
    if rule == 2:
        return f"Someone is {action[0]}."
    return f"There is a {adj} {person[0]} {place[0]}."


def _contradiction(rng, person, adj, action, place) -> str:
    rule = rng.randrange(4)
    if rule == 0:
        return f"A {person[0]} is {action[2]} {place[0]}."
    if rule == 1:
        return f"The {person[0]} is {action[0]} {place[2]}."
    if rule == 2:
        return f"Nobody is {action[0]}."
    return f"A {person[2]} is the only one {place[0]}, and nobody is {action[0]}."


def _neutral(rng, person, adj, action, place) -> str:
    rule = rng.randrange(3)
    if rule == 0:
        return f"A {person[0]} is {action[0]} {rng.choice(MOTIVES)}."
    if rule == 1:
        other = rng.choice([a for a in ADJECTIVES if a != adj])
        return f"The {person[0]} is {other} and is {action[1]}."
    return f"The {person[0]} {place[0]} is famous."


# Background sentences that change neither label: 0-3 of them make a pair's length say nothing
# about its label, which matters because training batches are grouped by length.
BACKGROUND = [
    "The weather is warm.",
    "Some people are walking by.",
    "It is early in the morning.",
    "A radio is playing somewhere nearby.",
    "The sky is cloudy.",
    "A few birds are flying overhead.",
    "Traffic can be heard in the distance.",
    "It has rained a little earlier.",
]

RULES = (_entailment, _neutral, _contradiction)  # GLUE order: 0 entailment, 1 neutral, 2 contradiction


def make_examples(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        person, adj = rng.choice(PEOPLE), rng.choice(ADJECTIVES)
        action, place = rng.choice(ACTIONS), rng.choice(PLACES)
        label = i % 3
        background = rng.sample(BACKGROUND, rng.randrange(4))
        premise = " ".join([f"A {adj} {person[0]} is {action[0]} {place[0]}.", *background])
        examples.append(
            {"premise": premise, "hypothesis": RULES[label](rng, person, adj, action, place), "label": label}
        )
    rng.shuffle(examples)
    return examples


def write_demo_dataset(
    folder: str | Path, n_train: int = 3000, n_validation: int = 600, seed: int = 0
) -> dict:
    """Writes train.jsonl and validation.jsonl (disjoint seeds) and returns their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n, split_seed in (("train", n_train, seed), ("validation", n_validation, seed + 1)):
        path = folder / f"{split}.jsonl"
        path.write_text("".join(json.dumps(e) + "\n" for e in make_examples(n, split_seed)))
        paths[split] = path
    return paths


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--n_train", type=int, default=3000)
    parser.add_argument("--n_validation", type=int, default=600)
    args = parser.parse_args()
    for split, path in write_demo_dataset(args.folder, args.n_train, args.n_validation).items():
        print(f"{split}: {path}")

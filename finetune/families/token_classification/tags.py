"""Tag sets: their scheme (IOB1, IOB2, BIOES, or none), the label order, the entities of a tag sequence
as seqeval's default mode reads them, and the per-word scores: entity-level precision, recall and F1
(micro, and per type) equal to seqeval's `classification_report`; word accuracy and macro F1 for tag sets
without a scheme (POS). No seqeval import at run time: the rules are small, and tests hold them equal."""

from __future__ import annotations

import re
from collections import Counter, defaultdict

from finetune.errors import ConfigError

PREFIXED = re.compile(r"^([BIES])-(.+)$")
SCHEME_WORDS = {
    "IOB2": "IOB2 (BIO)",
    "IOB1": "IOB1",
    # seqeval's default mode, as run_ner reports it: an entity is a type and a span read IOB2's way, so an
    # entity whose E- came out as I- still matches (seqeval's strict IOBES mode would not count it).
    "BIOES": "BIOES (entities scored as seqeval's default mode: a missing E- still matches)",
    "none": "none (tags without B-/I- prefixes, scored per word)",
}
CONFUSION_LIMIT = 50
"""The most tags a confusion matrix is drawn for (results.json, the card and the PNG)."""


def check_tags(sentences: list[list[str]], source: str) -> None:
    """Tags no scheme reads as meant, refused naming the row: an empty tag, one with spaces around it, and
    one without a prefix among prefixed tags (a typo that would turn entity scoring into per-tag)."""
    prefixed = any(PREFIXED.match(tag) for tags in sentences for tag in tags)
    for row, tags in enumerate(sentences):
        for tag in tags:
            if tag != tag.strip() or not tag:
                what = "an empty tag" if not tag.strip() else f"the tag {tag!r}, with spaces around it"
                fix = "give every word its tag" if not tag.strip() else "write it without them"
                raise ConfigError(f"{source}: row {row} has {what}; {fix}", fix=fix)
            if prefixed and tag != "O" and not PREFIXED.match(tag):
                fix = f"give it its prefix (e.g. B-{tag}), or write every tag without one"
                what = f"the tag {tag}, without a B-/I- prefix, among prefixed tags"
                raise ConfigError(f"{source}: row {row} has {what}; {fix}", fix=fix)


def detect_scheme(sentences: list[list[str]]) -> str:
    """IOB2 when every named tag is B-X or I-X and every entity starts with B-; IOB1 when some entity
    starts with I- (B- only splits two adjacent entities of a type); BIOES when E- or S- tags occur; none
    when any tag other than O lacks a prefix (POS, chunk-free tag sets) or there is none but O."""
    named = {tag for sentence in sentences for tag in sentence} - {"O"}
    matches = [PREFIXED.match(tag) for tag in named]
    if not named or any(m is None for m in matches):
        return "none"
    if {m.group(1) for m in matches} & {"E", "S"}:
        return "BIOES"
    for sentence in sentences:
        previous = "O"
        for tag in sentence:
            if tag.startswith("I-") and (previous == "O" or previous[2:] != tag[2:]):
                return "IOB1"
            previous = tag
    return "IOB2"


def scheme_of_names(label_names) -> str:
    """The scheme when only the tag names are known (a model's labels, nothing labelled read): IOB1 and
    IOB2 differ only in sequences, so B- tags say IOB2."""
    prefixes = {m.group(1) if (m := PREFIXED.match(tag)) else None for tag in set(label_names) - {"O"}}
    if not prefixes or None in prefixes:
        return "none"
    return "BIOES" if prefixes & {"E", "S"} else "IOB2" if "B" in prefixes else "IOB1"


def label_order(tags) -> tuple[str, ...]:
    """The labels' ids: sorted, O first where present."""
    return tuple(sorted(set(tags), key=lambda tag: (tag != "O", tag)))


def entity_types(label_names) -> tuple[str, ...]:
    return tuple(sorted({m.group(2) for tag in label_names if (m := PREFIXED.match(tag))}))


def inside_of(label_names: tuple[str, ...]) -> list[int]:
    """Per label id, the id a word's later sub-tokens learn with --label_all_tokens: B-X's I-X (where the
    tag set has one), any other label itself (run_ner's rule)."""
    ids = {name: i for i, name in enumerate(label_names)}
    return [ids.get("I-" + name[2:], i) if name.startswith("B-") else i for i, name in enumerate(label_names)]


def entities(tags: list[str]) -> list[tuple[str, int, int]]:
    """(type, first word, last word) of each entity, as seqeval's `get_entities` (default mode, prefixes)
    reads the tags: an I- after O or another type starts an entity; E- and S- end one."""
    found = []
    previous_tag, previous_type, begin = "O", "", 0
    for i, chunk in enumerate([*tags, "O"]):
        tag = chunk[0]
        type_ = chunk[1:].split("-", maxsplit=1)[-1] or "_"
        if _ends(previous_tag, tag, previous_type, type_):
            found.append((previous_type, begin, i - 1))
        if _starts(previous_tag, tag, previous_type, type_):
            begin = i
        previous_tag, previous_type = tag, type_
    return found


def _ends(previous_tag: str, tag: str, previous_type: str, type_: str) -> bool:
    return (
        previous_tag in ("E", "S")
        or (previous_tag in ("B", "I") and tag in ("B", "S", "O"))
        or (previous_tag not in ("O", ".") and previous_type != type_)
    )


def _starts(previous_tag: str, tag: str, previous_type: str, type_: str) -> bool:
    return (
        tag in ("B", "S")
        or (previous_tag in ("E", "S", "O") and tag in ("E", "I"))
        or (tag not in ("O", ".") and previous_type != type_)
    )


def _prf(hits: int, predicted: int, true: int) -> tuple[float, float, float]:
    """Precision, recall and F1, 0 where a denominator is 0 (seqeval's and sklearn's zero_division)."""
    precision = hits / predicted if predicted else 0.0
    recall = hits / true if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def entity_scores(gold: list[list[str]], predicted: list[list[str]]) -> dict:
    """Entity-level precision, recall and F1 (micro: every entity of every sentence alike) and per type
    (precision_X, recall_X, f1_X, support_X: X's gold entities), and word accuracy; an entity counts as
    found when its type, first and last word all match."""
    true, found = defaultdict(set), defaultdict(set)
    for number, (gold_tags, tags) in enumerate(zip(gold, predicted, strict=True)):
        for kind, first, last in entities(gold_tags):
            true[kind].add((number, first, last))
        for kind, first, last in entities(tags):
            found[kind].add((number, first, last))
    scores, totals = {}, [0, 0, 0]
    for kind in sorted(set(true) | set(found)):
        counts = (len(true[kind] & found[kind]), len(found[kind]), len(true[kind]))
        totals = [a + b for a, b in zip(totals, counts, strict=True)]
        precision, recall, f1 = _prf(*counts)
        scores.update({f"precision_{kind}": precision, f"recall_{kind}": recall, f"f1_{kind}": f1})
        scores[f"support_{kind}"] = counts[2]
    precision, recall, f1 = _prf(*totals)
    return {"precision": precision, "recall": recall, "f1": f1, "accuracy": accuracy(gold, predicted),
            **scores}  # fmt: skip


def word_scores(gold: list[list[str]], predicted: list[list[str]]) -> dict:
    """Tag sets without a scheme: word accuracy, macro F1 (the mean of each tag's F1, over the tags gold
    or predicted, as sklearn's average='macro'), and each tag's precision, recall, F1 and support."""
    pairs = [
        (g, p)
        for gold_tags, tags in zip(gold, predicted, strict=True)
        for g, p in zip(gold_tags, tags, strict=True)
    ]
    hits = Counter(g for g, p in pairs if g == p)
    true, found = Counter(g for g, _ in pairs), Counter(p for _, p in pairs)
    scores, f1s = {"accuracy": accuracy(gold, predicted)}, []
    for tag in sorted(set(true) | set(found)):
        precision, recall, f1 = _prf(hits[tag], found[tag], true[tag])
        scores.update({f"precision_{tag}": precision, f"recall_{tag}": recall, f"f1_{tag}": f1})
        scores[f"support_{tag}"] = true[tag]
        f1s.append(f1)
    scores["macro_f1"] = sum(f1s) / len(f1s) if f1s else 0.0
    return scores


def accuracy(gold: list[list[str]], predicted: list[list[str]]) -> float:
    pairs = [
        (g, p)
        for gold_tags, tags in zip(gold, predicted, strict=True)
        for g, p in zip(gold_tags, tags, strict=True)
    ]
    return sum(g == p for g, p in pairs) / len(pairs) if pairs else 0.0


def confusion(gold: list[list[str]], predicted: list[list[str]], label_names: tuple[str, ...]) -> dict | None:
    """Words counted by (gold tag, predicted tag), rows gold, columns predicted, over the labels and any
    gold tag the model has none for (seen only in evaluation); None past CONFUSION_LIMIT tags."""
    extra = sorted({tag for tags in gold for tag in tags} - set(label_names))
    names = [*label_names, *extra]
    if len(names) > CONFUSION_LIMIT:
        return None
    index = {name: i for i, name in enumerate(names)}
    matrix = [[0] * len(names) for _ in names]
    for gold_tags, tags in zip(gold, predicted, strict=True):
        for g, p in zip(gold_tags, tags, strict=True):
            matrix[index[g]][index[p]] += 1
    return {"labels": names, "matrix": matrix}

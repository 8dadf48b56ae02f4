"""Tag sets: the scheme detected, the label order, entities read as seqeval reads them, and the scores
equal to seqeval's classification_report on the same words (seqeval is a test dependency only)."""

from __future__ import annotations

import random

import pytest
from seqeval.metrics import classification_report
from seqeval.metrics.sequence_labeling import get_entities

from finetune.families.token_classification.tags import (
    confusion,
    detect_scheme,
    entities,
    entity_scores,
    inside_of,
    label_order,
    scheme_of_names,
    word_scores,
)

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "E-PER", "S-LOC", "E-LOC", "S-ORG"]


def noisy(rng: random.Random, tags: list[str], length: int) -> list[str]:
    """A random tag sequence: well-formed or not (I- after O, E- without B-, types switching)."""
    return [rng.choice(tags) for _ in range(length)]


def test_the_scheme_is_detected_from_the_training_tags():
    assert detect_scheme([["B-PER", "I-PER", "O", "B-LOC"]]) == "IOB2"
    assert detect_scheme([["I-PER", "I-PER", "O", "I-LOC", "B-LOC"]]) == "IOB1"
    assert detect_scheme([["B-PER", "E-PER", "O", "S-LOC"]]) == "BIOES"
    assert detect_scheme([["NOUN", "VERB", "DET"]]) == "none"
    assert detect_scheme([["O", "O"]]) == "none"
    assert detect_scheme([["B-PER", "NOUN"]]) == "none"  # a mix has no scheme
    # Names alone (a finished model's labels): B- tags say IOB2.
    assert scheme_of_names(("O", "B-LOC", "B-PER", "I-LOC", "I-PER")) == "IOB2"
    assert scheme_of_names(("O", "I-LOC")) == "IOB1" and scheme_of_names(("NOUN", "O")) == "none"


def test_labels_are_sorted_with_O_first_and_B_maps_to_its_I():
    names = label_order(["I-PER", "B-PER", "O", "B-LOC"])
    assert names == ("O", "B-LOC", "B-PER", "I-PER")
    assert inside_of(names) == [0, 1, 3, 3]  # B-LOC has no I-LOC: itself


@pytest.mark.parametrize("seed", range(5))
def test_entities_are_seqevals(seed):
    rng = random.Random(seed)
    for _ in range(200):
        tags = noisy(rng, TAGS, rng.randint(1, 12))
        assert entities(tags) == get_entities(tags)


@pytest.mark.parametrize("tagset", [TAGS[:7], TAGS], ids=["iob", "mixed"])
def test_entity_scores_equal_seqevals_classification_report(tagset):
    """Precision, recall, F1 micro and per type, and support, on noisy gold and predicted tags."""
    rng = random.Random(0)
    gold = [noisy(rng, tagset, rng.randint(1, 15)) for _ in range(300)]
    predicted = [[t if rng.random() < 0.7 else rng.choice(tagset) for t in s] for s in gold]
    ours = entity_scores(gold, predicted)
    report = classification_report(gold, predicted, output_dict=True, zero_division=0)
    micro = report.pop("micro avg")
    assert (ours["precision"], ours["recall"], ours["f1"]) == pytest.approx(
        (micro["precision"], micro["recall"], micro["f1-score"]), abs=1e-12
    )
    types = [k for k in report if not k.endswith(" avg")]
    assert types and set(types) == {k.removeprefix("support_") for k in ours if k.startswith("support_")}
    for kind in types:
        scores = report[kind]
        assert ours[f"precision_{kind}"] == pytest.approx(scores["precision"], abs=1e-12)
        assert ours[f"recall_{kind}"] == pytest.approx(scores["recall"], abs=1e-12)
        assert ours[f"f1_{kind}"] == pytest.approx(scores["f1-score"], abs=1e-12)
        assert ours[f"support_{kind}"] == scores["support"]


def test_word_scores_for_tags_without_a_scheme():
    gold = [["NOUN", "VERB", "DET"], ["NOUN"]]
    predicted = [["NOUN", "NOUN", "DET"], ["VERB"]]
    scores = word_scores(gold, predicted)
    assert scores["accuracy"] == 0.5
    # NOUN: p 1/2 r 1/2; VERB: p 0 r 0; DET: 1: macro over the three tags
    assert scores["macro_f1"] == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert scores["support_NOUN"] == 2


def test_the_confusion_matrix_counts_words_with_tags_the_labels_lack():
    found = confusion([["O", "B-X"]], [["O", "O"]], ("O", "B-PER"))
    assert found == {"labels": ["O", "B-PER", "B-X"], "matrix": [[1, 0, 0], [0, 0, 0], [1, 0, 0]]}
    assert confusion([["O"]], [["O"]], tuple(f"T{i}" for i in range(51))) is None


@pytest.mark.parametrize(
    ("scheme", "aggregation"), [("IOB2", 'aggregation_strategy="first"'), ("BIOES", None)]
)
def test_the_cards_pipeline_groups_words_only_for_b_and_i_tags(scheme, aggregation):
    """transformers' pipeline groups entities by B-/I- prefixes alone: a BIOES model's card shows the
    per-sub-token tags (grouped, S-PER S-PER would read as one entity)."""
    from finetune.config.train_config import TrainConfig
    from finetune.families.token_classification.family import TokenClassification
    from finetune.families.token_classification.task import TagTask

    names = ("O", "B-PER", "I-PER") if scheme == "IOB2" else ("O", "B-PER", "E-PER", "S-PER")
    task = TagTask(label_names=names, scheme=scheme, format="rows")
    config = TrainConfig(
        task_type="token_classification", output_dir="out", train_file="t.jsonl", eval_strategy="no"
    )
    use = TokenClassification().card_parts(config, task, {}).use
    pipe = next(line for line in use if "pipeline(" in line)
    assert (aggregation in pipe) if aggregation else ("aggregation_strategy" not in pipe), pipe

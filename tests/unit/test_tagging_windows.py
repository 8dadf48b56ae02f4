"""Encoding sentences for tagging: windows over words that score every word exactly once, where it has
the most context; the tag on a word's first sub-token (every sub-token with --label_all_tokens, B-X's
later ones as I-X); raw text split as the tokenizer's pre-tokenizer splits it, with character spans."""

from __future__ import annotations

import random

import pytest
from datasets import Dataset
from transformers import AutoTokenizer

from finetune.config.train_config import TrainConfig
from finetune.families.token_classification.encoding import (
    IGNORE,
    encode_splits,
    scoring_windows,
    split_text,
    word_windows,
)
from finetune.families.token_classification.task import TagTask
from tests.helpers import minilm_dir


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(minilm_dir())


@pytest.mark.parametrize("seed", range(4))
def test_windows_fit_the_room_and_score_every_word_once_where_it_has_most_context(seed):
    rng = random.Random(seed)
    lengths = [rng.choice([1, 1, 1, 2, 3, 9]) for _ in range(rng.randint(1, 120))]
    room, stride = 8, rng.randint(1, 4)
    spans = word_windows(lengths, room, stride)
    assert spans[0][0] == 0 and spans[-1][1] == len(lengths)
    assert all(sum(min(n, room) for n in lengths[s:e]) <= room and e > s for s, e in spans)
    scorer = scoring_windows(spans, len(lengths))
    for word, number in enumerate(scorer):
        start, end = spans[number]
        assert start <= word < end
        context = min(word - start, end - 1 - word)
        assert all(min(word - s, e - 1 - word) <= context for s, e in spans if s <= word < e)


def encoded(tokenizer, words, tags, **flags):
    task = TagTask(label_names=("O", "B-LOC", "I-LOC"), scheme="IOB2", format="rows")
    task.counts["train"] = {"sentences": 1, "words": len(words)}
    config = TrainConfig(task_type="token_classification", train_file="t.jsonl", eval_strategy="no", **flags)
    split = Dataset.from_dict({"words": [words], "tags": [tags]})
    return task, encode_splits(task, {"train": split}, tokenizer, config)["train"]


def test_the_first_sub_token_carries_the_tag_and_label_all_tokens_turns_B_into_I(tokenizer):
    words, tags = ["Zanzibar", "is", "far"], ["B-LOC", "O", "O"]
    assert len(tokenizer.tokenize("Zanzibar")) > 1
    _, first_only = encoded(tokenizer, words, tags)
    _, every = encoded(tokenizer, words, tags, label_all_tokens=True)
    pieces = len(tokenizer.tokenize("Zanzibar"))
    # [CLS] zan ##zi ##bar is far [SEP]
    assert first_only[0]["labels"] == [IGNORE, 1, *[IGNORE] * (pieces - 1), 0, 0, IGNORE]
    assert every[0]["labels"] == [IGNORE, 1, *[2] * (pieces - 1), 0, 0, IGNORE]
    assert every[0]["word_index"] == [-1, 0, *[-1] * (pieces - 1), 1, 2, -1]


def test_a_sentence_five_times_max_length_scores_each_word_once(tokenizer):
    rng = random.Random(0)
    words = [rng.choice(["Zanzibar", "river", "Paris", "the", "Reykjavik"]) for _ in range(5 * 32)]
    tags = ["B-LOC" if w[0].isupper() else "O" for w in words]
    task, windows = encoded(tokenizer, words, tags, max_length=32, doc_stride=4)
    assert len(windows) > 5 and max(windows["length"]) <= 32
    scored = sorted(w for row in windows["word_index"] for w in row if w >= 0)
    assert scored == list(range(len(words)))  # each word once
    labelled = [label for row in windows["labels"] for label in row if label != IGNORE]
    assert labelled == [1 if tag == "B-LOC" else 0 for tag in tags]  # each word's tag, once, in order
    assert task.counts["train"]["windowed"] == 1 and task.counts["train"]["windows"] == len(windows)


def test_raw_text_is_split_as_the_pre_tokenizer_splits_it_with_spans(tokenizer):
    text = "John  lives in New-York, today."
    words, spans, tokens = split_text(tokenizer, text)
    assert words == ["John", "lives", "in", "New", "-", "York", ",", "today", "."]
    assert [text[s:e] for s, e in spans] == words
    assert [token for word in tokens for token in word] == tokenizer(text, add_special_tokens=False)[
        "input_ids"
    ]


TEXTS = (
    "Yesterday John met Mary in New York, and they walked to the river.",
    "John Smith\tworks for\nReuters.",
    "Kowalski  lives in   Paris",
    "Laura's friend doesn't.",
)


@pytest.mark.parametrize("kind", ["wordpiece", "byte-level BPE", "byte-level BPE with add_prefix_space"])
def test_raw_text_gets_the_tokens_the_tokenizer_gives_the_whole_text(tokenizer, kind):
    """A text's words are read with the very tokens of the whole text, as `pipeline` feeds it: with
    WordPiece; a byte-level BPE without add_prefix_space (GPT-2's, Llama 3's: a tab, a newline or a second
    space a token of its own, a comma glued to its word); RoBERTa's, which the run loads with
    add_prefix_space (a comma after a word gets no space of its own). The words are the text's, in order."""
    from tokenizers import pre_tokenizers

    from tests.backbones import decoder_tokenizer

    if kind != "wordpiece":
        tokenizer = decoder_tokenizer()
        prefix = kind.endswith("add_prefix_space")
        tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix)
    task = TagTask(label_names=("O",), scheme="none", format="rows")
    task.counts["test"] = {"sentences": len(TEXTS), "words": 0}
    config = TrainConfig(
        task_type="token_classification", test_file="t.jsonl", do_train=False, do_predict=True
    )
    windows = encode_splits(task, {"test": Dataset.from_dict({"text": list(TEXTS)})}, tokenizer, config)[
        "test"
    ]
    assert windows["input_ids"] == [tokenizer(text)["input_ids"] for text in TEXTS]
    read = task.references["test"]
    assert read[0]["words"][-2:] == ["river", "."] and read[1]["words"][:2] == ["John", "Smith"]
    for row in read:
        assert [row["text"][start:end] for start, end in row["spans"]] == row["words"]
    assert "".join(read[2]["words"]) == "Kowalskilivesin" + "Paris"

"""Sentences as model inputs: each word's sub-tokens from a fast tokenizer (`word_ids()`), the tag on a
word's first sub-token (every sub-token with --label_all_tokens, B-X's later ones as I-X), and sentences
longer than --max_length cut into windows over words overlapping by --doc_stride words. Every word is
scored (labelled, evaluated, predicted) in exactly one window: the one where it has the most context on
both sides; the others carry it as context only."""

from __future__ import annotations

import json

from datasets import Dataset

from finetune.errors import ConfigError
from finetune.families.token_classification.tags import inside_of

IGNORE = -100
"""A label no loss reads (PyTorch's ignore_index)."""
CHUNK = 1000
"""Sentences tokenized per call."""


def stride_of(config) -> int:
    """--doc_stride in words, or --max_length / 8 (16 at 128)."""
    return config.doc_stride if config.doc_stride is not None else max(1, config.max_length // 8)


def special_tokens(tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a sentence's words ([CLS] and [SEP], a BOS, nothing)."""
    encoded = tokenizer([["a"]], is_split_into_words=True)
    ids, word_ids = encoded["input_ids"][0], encoded.word_ids(0)
    first = word_ids.index(0)
    last = len(word_ids) - 1 - word_ids[::-1].index(0)
    return ids[:first], ids[last + 1 :]


def word_windows(lengths: list[int], room: int, stride: int) -> list[tuple[int, int]]:
    """[start, end) word spans of at most `room` sub-tokens (a word longer than the room counts as the
    room: truncated to it), each starting `stride` words before the previous one's end (at most half the
    previous window's words, so windows move on by at least half a window); one span when the sentence
    fits."""
    spans, start = [], 0
    while True:
        end, used = start, 0
        while end < len(lengths) and used + min(lengths[end], room) <= room:
            used += min(lengths[end], room)
            end += 1
        spans.append((start, end))
        if end >= len(lengths):
            return spans
        start = max(start + 1, end - min(stride, (end - start) // 2))


def scoring_windows(spans: list[tuple[int, int]], words: int) -> list[int]:
    """Per word, the window that scores it: the most words of context on its poorer side (the first such
    window on a tie), as BERT's SQuAD "max context" picks a token's span."""
    best = [(-1, 0)] * words
    for number, (start, end) in enumerate(spans):
        for word in range(start, end):
            context = min(word - start, end - 1 - word)
            if context > best[word][0]:
                best[word] = (context, number)
    return [number for _, number in best]


def spaces_words(tokenizer) -> bool:
    """Whether pre-split words must carry the space before them: a byte-level BPE that adds none itself
    (GPT-2's, Llama 3's, Qwen's: add_prefix_space false) reads each word as a text's start, with other
    tokens than the same word gets in running text, unless the word brings its space along; so does a
    SentencePiece whose normalizer writes the spaces' ▁ (Gemma's), found by a probe: words that tokenize
    as the running text only with their spaces."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    pre = (json.loads(backend.to_str()).get("pre_tokenizer") or {}) if backend is not None else {}
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if any(p.get("type") == "ByteLevel" for p in parts):
        return any(p.get("type") == "ByteLevel" and not p.get("add_prefix_space", False) for p in parts)
    probe = ["Paris", "is", "large"]

    def ids(words):
        return tokenizer(words, is_split_into_words=True, add_special_tokens=False)["input_ids"]

    try:
        running = tokenizer(" ".join(probe), add_special_tokens=False)["input_ids"]
        return ids(probe) != running and ids([probe[0], *(" " + w for w in probe[1:])]) == running
    except Exception:  # noqa: BLE001  (a tokenizer that takes no pre-split words: it adds no spaces either)
        return False


def split_text(tokenizer, text: str) -> tuple[list[str], list[tuple[int, int]], list[list[int]]]:
    """Raw text as the tokenizer itself splits it (its normalizer then its pre-tokenizer: BERT's splits at
    spaces, punctuation and each CJK character): the words, their character spans in the text, and each
    word's sub-tokens, the very ones the whole text gets (so the model reads what `pipeline` feeds it).
    A pre-token of whitespace alone (byte-level BPE's tab, newline or second space; SentencePiece's lone
    ▁) is no word: its tokens follow the word before as context (before the first word: left out).
    Whitespace a word's own pieces carry is left out of the word and its span."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    groups: dict[int, list[tuple[int, int, int]]] = {}
    for token, word, offsets in zip(
        encoded["input_ids"], encoded.word_ids(), encoded["offset_mapping"], strict=True
    ):
        groups.setdefault(-1 if word is None else word, []).append((token, *offsets))
    words, spans, tokens = [], [], []
    for group in (part for _, whole in sorted(groups.items()) for part in _at_whitespace(whole, text)):
        starts = [start for _, start, end in group if end > start]
        piece = text[min(starts) : max(end for _, _, end in group)] if starts else ""
        if not piece.strip():
            if tokens:
                tokens[-1] += [token for token, _, _ in group]
            continue
        start = min(starts) + len(piece) - len(piece.lstrip())
        words.append(piece.strip())
        spans.append((start, start + len(piece.strip())))
        tokens.append([token for token, _, _ in group])
    return words, spans, tokens


def _at_whitespace(group: list[tuple[int, int, int]], text: str) -> list[list[tuple[int, int, int]]]:
    """A pre-token's (token, start, end)s, split where a token starts after whitespace: a tokenizer with no
    pre-tokenizer (Llama 2's SentencePiece, which only replaces spaces with ▁) gives the whole text one
    word id; one that splits at whitespace gives none to split."""
    parts: list[list[tuple[int, int, int]]] = [[]]
    reached = None  # where the part's last token with characters ends
    for token, start, end in group:
        after_space = end > start and (
            text[start].isspace() or (reached is not None and text[reached:start].isspace())
        )
        if parts[-1] and after_space and reached is not None:
            parts.append([])
        parts[-1].append((token, start, end))
        reached = end if end > start else reached
    return parts


def joined(words: list[str]) -> tuple[str, list[tuple[int, int]]]:
    """Pre-split words as one text, joined by spaces, with each word's span in it."""
    spans, start = [], 0
    for word in words:
        spans.append((start, start + len(word)))
        start += len(word) + 1
    return " ".join(words), spans


def encode_splits(task, splits: dict, tokenizer, config) -> dict[str, Dataset]:
    """Each split as windows: `input_ids`, `labels` (evaluation and training splits), `word_index` (the
    word a position scores, -1 elsewhere), `row` (the sentence), `length`. Every rank encodes alike (the
    splits are in memory: nothing to share). Sets `task.references` (gold tags; a test split's words,
    spans and text) and each split's window counts."""
    prefix, suffix = special_tokens(tokenizer)
    room = config.max_length - len(prefix) - len(suffix)
    if room < 1:
        raise ConfigError(
            f"--max_length {config.max_length} leaves no room for a word beside this tokenizer's "
            f"{len(prefix) + len(suffix)} special tokens; raise it"
        )
    label_ids = {name: i for i, name in enumerate(task.label_names)}
    inside = inside_of(task.label_names) if config.label_all_tokens else None
    unk = tokenizer.unk_token_id if tokenizer.unk_token_id is not None else tokenizer.pad_token_id
    shape = (prefix, suffix, room, stride_of(config), inside)
    spaced = spaces_words(tokenizer)
    encoded = {}
    for name, split in splits.items():
        columns = split.to_dict()
        words, tags = columns.get("words"), None
        if name == "test":
            inputs = _test_inputs(columns, tokenizer)
            task.references[name] = inputs
            task.counts[name]["words"] = sum(len(i["words"]) for i in inputs)
        else:
            task.references[name] = columns["tags"]
            tags = [[label_ids.get(tag, IGNORE) for tag in row] for row in columns["tags"]]
        if "text" in columns:  # raw text: each word's tokens as the whole text has them
            tokens = [i.pop("tokens") for i in task.references[name]]
        else:  # pre-split words, separated by spaces as in running text (for a BPE that adds none)
            spaced_words = [[" " * (n > 0 and spaced) + w for n, w in enumerate(row)] for row in words]
            tokens = _word_tokens(spaced_words, tokenizer, unk)
        encoded[name], windowed, windows = _encode(tokens, tags, shape)
        if windowed:
            task.counts[name].update(windowed=windowed, windows=windows)
    return encoded


def _test_inputs(columns: dict, tokenizer) -> list[dict]:
    """Each test row's words, their spans and the text the spans index: raw text split by the
    tokenizer's pre-tokenizer, or pre-split words joined by spaces."""
    inputs = []
    if "text" in columns:
        for text in columns["text"]:
            words, spans, tokens = split_text(tokenizer, text)
            inputs.append({"words": words, "spans": spans, "text": text, "tokens": tokens})
    else:
        for words in columns["words"]:
            text, spans = joined(words)
            inputs.append({"words": words, "spans": spans, "text": text})
    return inputs


def _word_tokens(words: list[list[str]], tokenizer, unk: int) -> list[list[list[int]]]:
    """Each sentence's words as their sub-tokens (a word no sub-token stands for: the unknown token)."""
    out = []
    for begin in range(0, len(words), CHUNK):
        chunk = words[begin : begin + CHUNK]
        nonempty = [i for i, sentence in enumerate(chunk) if sentence]
        batch = tokenizer([chunk[i] for i in nonempty], is_split_into_words=True, add_special_tokens=False)
        tokens_of = {i: (batch["input_ids"][k], batch.word_ids(k)) for k, i in enumerate(nonempty)}
        for i, sentence in enumerate(chunk):
            per_word = [[] for _ in sentence]
            ids, word_ids = tokens_of.get(i, ([], []))
            for token, word in zip(ids, word_ids, strict=True):
                if word is not None:
                    per_word[word].append(token)
            out.append([tokens or [unk] for tokens in per_word])
    return out


def _encode(tokens: list[list[list[int]]], tags: list[list[int]] | None, shape) -> tuple[Dataset, int, int]:
    """The windows of every sentence (given as each word's sub-tokens) as a Dataset; the sentences
    windowed and their windows."""
    prefix, suffix, room, stride, inside = shape
    out = {"input_ids": [], "word_index": [], "row": [], "length": []}
    if tags is not None:
        out["labels"] = []
    windowed = windows = 0
    for row, per_word in enumerate(tokens):
        spans = word_windows([len(t) for t in per_word], room, stride) if per_word else [(0, 0)]
        scorer = scoring_windows(spans, len(per_word))
        if len(spans) > 1:
            windowed, windows = windowed + 1, windows + len(spans)
        for number, span in enumerate(spans):
            scored = [scorer[w] == number for w in range(*span)]
            row_tags = None if tags is None else tags[row]
            ids, labels, index = _window(per_word, row_tags, span, scored, prefix, suffix, room, inside)
            out["input_ids"].append(ids)
            out["word_index"].append(index)
            out["row"].append(row)
            out["length"].append(len(ids))
            if tags is not None:
                out["labels"].append(labels)
    return Dataset.from_dict(out), windowed, windows


def _window(per_word, tags, span, scored, prefix, suffix, room, inside):
    """One window's ids, labels and word index: the words of `span` between the special tokens; the
    words it scores labelled on their first sub-token (every sub-token with `inside`, --label_all_tokens)."""
    ids, labels, index = list(prefix), [IGNORE] * len(prefix), [-1] * len(prefix)
    for word, mine in zip(range(*span), scored, strict=True):
        tokens = per_word[word][:room]
        label = tags[word] if tags is not None and mine else IGNORE
        later = inside[label] if inside is not None and label != IGNORE else IGNORE
        ids += tokens
        labels += [label] + [later] * (len(tokens) - 1)
        index += [word if mine else -1] + [-1] * (len(tokens) - 1)
    ids += suffix
    labels += [IGNORE] * len(suffix)
    index += [-1] * len(suffix)
    return ids, labels, index

"""The sentences of a tagging run, read into `datasets.Dataset`s of `words` and `tags` (tag names):
JSONL/parquet rows (or --dataset_name's) with a list of words and a list of tags, CoNLL files (a word
and its tag per line) and CoNLL-U files (UD's ten columns). Every row that cannot be trained on is
refused in one line naming the file, the row or line, and the fix, before anything is tokenized."""

from __future__ import annotations

from pathlib import Path

from datasets import ClassLabel, Dataset, List

from finetune.data.sources import load_data_file, load_dataset_splits
from finetune.errors import ConfigError

CONLL = (".conll", ".iob")
CONLLU = ".conllu"
UD_COLUMNS = ("id", "form", "lemma", "upos", "xpos", "feats", "head", "deprel", "deps", "misc")
UD_TAGS = ("upos", "xpos", "deprel")
WORD_COLUMNS = ("tokens",)
TAG_COLUMNS = ("tags", "ner_tags")


def read_split(config, name: str, source: str, dataset: Dataset | None = None):
    """One split as `words` and `tags` columns (a test split: `words`, or the raw `text` to split), the
    format words of the task line, and the tag column's ClassLabel names (None without one). `dataset`:
    --dataset_name's split (None: read the file `source`)."""
    labelled = name != "test"
    suffix = Path(source).suffix.lower() if dataset is None else ""
    if suffix in CONLL:
        if config.label_column != "label":
            raise ConfigError(
                f"--label_column {config.label_column}: a CoNLL file ({source}) has no column names, its tag "
                "is the last column; drop --label_column (it picks a CoNLL-U column or a JSONL key)",
                flag="--label_column",
                fix="drop --label_column",
            )
        return read_conll(source, labelled), "CoNLL files", None
    if suffix == CONLLU:
        column = "upos" if config.label_column == "label" else config.label_column
        return read_conllu(source, column, labelled), f"CoNLL-U ({column})", None
    if suffix in (".csv", ".tsv"):
        raise ConfigError(
            f"{source}: a {suffix} file holds no lists of words and tags; give .jsonl, .json or .parquet "
            "rows (tokens and tags), a CoNLL file (.conll, .iob) or CoNLL-U (.conllu)",
            fix="give .jsonl, .json or .parquet rows, a CoNLL file or CoNLL-U",
        )
    kind = "rows" if dataset is not None else f"{suffix.lstrip('.')} rows"
    if dataset is None:
        dataset = load_data_file(source, ())
    split, columns, declared = read_rows(dataset, config, source, labelled)
    return split, f"{kind} {columns}", declared


def read_conll(path: str, labelled: bool) -> Dataset:
    """A word and its tag per line (the first column the word, the last its tag, any between ignored:
    CoNLL-2003's POS and chunk columns), columns split by tabs (where a line has one) or spaces; blank
    lines (whitespace alone) between sentences; `-DOCSTART-` lines and `# ` comment lines (MultiCoNER's,
    WNUT's ids) skipped, though not the word `#` (`_comments`). Every token line has as many columns as the
    first, and no empty word or tag. Test files may hold words alone."""
    words, tags, sentence, columns = [], [], [], None
    lines = list(_lines(path))
    comments = _comments(lines)
    for number, line in lines:
        if number in comments:
            continue
        fields = _fields(line)
        if not fields or fields[0] == "-DOCSTART-":
            if sentence:
                words.append([w for w, _ in sentence])
                tags.append([t for _, t in sentence])
                sentence = []
            continue
        columns = columns or len(fields)
        if len(fields) != columns:
            raise ConfigError(
                f"data file {path} line {number}: {len(fields)} columns where its first token line has "
                f"{columns}; give every token line the same columns (the word first, its tag last)",
                fix="give every token line the same columns (the word first, its tag last)",
            )
        if labelled and columns < 2:
            raise ConfigError(
                f"data file {path} line {number}: a word without a tag; give each word its tag as the last "
                "column (space- or tab-separated)",
                fix="give each word its tag as the last column",
            )
        if not all(fields):
            raise ConfigError(
                f"data file {path} line {number}: an empty column (two tabs in a row?); give each token line "
                "its word and tag",
                fix="give each token line its word and tag",
            )
        sentence.append((fields[0], fields[-1]))
    if sentence:
        words.append([w for w, _ in sentence])
        tags.append([t for _, t in sentence])
    if not words:
        raise ConfigError(f"data file {path}: holds no sentence; give a word and its tag per line")
    return Dataset.from_dict({"words": words, "tags": tags} if labelled else {"words": words})


def _fields(line: str) -> list[str]:
    """A CoNLL line's columns: split by tabs where it has one, else by spaces."""
    return [f.strip() for f in line.split("\t")] if line.strip() and "\t" in line else line.split()


def _comments(lines: list[tuple[int, str]]) -> set[int]:
    """The numbers of the comment lines: those starting `# `, except a token line of the word `#` (a
    currency sign in CoNLL-2003 and OntoNotes text), which has the token lines' columns and ends in a tag
    that another token line carries. A comment's last field is an id or `domain=en`, not a tag."""
    tokens = [_fields(line) for _, line in lines if line.strip() and not line.startswith("# ")]
    tokens = [fields for fields in tokens if fields[0] != "-DOCSTART-"]
    columns, tags = (len(tokens[0]), {fields[-1] for fields in tokens}) if tokens else (0, set())
    return {
        number
        for number, line in lines
        if line.startswith("# ") and not (len(_fields(line)) == columns > 1 and _fields(line)[-1] in tags)
    }


def read_conllu(path: str, column: str, labelled: bool) -> Dataset:
    """UD's CoNLL-U: ten tab-separated fields per word, `#` comments, blank lines between sentences. The
    words are UD's syntactic words: a multiword token's range line (`1-2`, its surface form, untagged) and
    empty nodes (`1.1`, outside the basic tree) are skipped. `column`: upos, xpos or deprel."""
    if column not in UD_TAGS:
        raise ConfigError(
            f"--label_column {column}: not a CoNLL-U tag column; use upos, xpos or deprel (for {path})",
            flag="--label_column",
            fix="use --label_column upos, xpos or deprel",
        )
    at = UD_COLUMNS.index(column)
    words, tags, sentence = [], [], []
    for number, line in _lines(path):
        if line.startswith("#"):
            continue
        if not line.strip():
            if sentence:
                words.append([w for w, _ in sentence])
                tags.append([t for _, t in sentence])
                sentence = []
            continue
        fields = line.split("\t")
        if len(fields) != len(UD_COLUMNS):
            raise ConfigError(
                f"data file {path} line {number}: {len(fields)} tab-separated fields; a CoNLL-U word line "
                "has 10 (ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC); fix the line",
                fix="give the line UD's 10 tab-separated fields",
            )
        if "-" in fields[0] or "." in fields[0]:  # a multiword token's range, or an empty node
            continue
        if not fields[1].strip():
            raise ConfigError(
                f"data file {path} line {number}: a blank word (FORM {fields[1]!r}); write the word, or drop "
                "the line",
                fix="write the word, or drop the line",
            )
        sentence.append((fields[1], fields[at]))
    if sentence:
        words.append([w for w, _ in sentence])
        tags.append([t for _, t in sentence])
    if not words:
        raise ConfigError(f"data file {path}: holds no sentence; give CoNLL-U word lines")
    if labelled and all(tag == "_" for row in tags for tag in row):
        raise ConfigError(
            f"--label_column {column}: data file {path} holds no {column} tags (every one is _); use "
            f"--label_column {'xpos' if column == 'upos' else 'upos'}, or a file annotated with {column}",
            flag="--label_column",
        )
    return Dataset.from_dict({"words": words, "tags": tags} if labelled else {"words": words})


def _lines(path: str):
    """(line number from 1, the line without its end) of a UTF-8 text file, refused when not one."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"data file {path} does not exist; check the path")
    try:
        with file.open(encoding="utf-8-sig") as lines:  # a byte-order mark is no part of the first word
            for number, line in enumerate(lines, 1):
                yield number, line.rstrip("\r\n")
    except UnicodeDecodeError:
        raise ConfigError(f"data file {path}: not UTF-8 text; save it as UTF-8") from None


def read_rows(dataset: Dataset, config, source: str, labelled: bool):
    """Rows with a list of words (`tokens`, or --text_columns) and a list of tags (`tags` or `ner_tags`, or
    --label_column): names, or ids read through --label_names or the column's ClassLabel names. A test
    split takes `tokens` or a raw `text` column. Returns the split, the columns read (for the task line),
    and the tag column's ClassLabel names (None without one)."""
    columns = dataset.column_names
    word_column = config.text_column_names[0] if config.text_column_names else "tokens"
    if not labelled and word_column not in columns and "text" in columns:
        texts = _column(dataset, "text")
        _check_texts(texts, source)
        return Dataset.from_dict({"text": texts}), "(raw text)", None
    tag_column = None
    if labelled:
        named = config.label_column if config.label_column != "label" else None
        tag_column = named or next((c for c in TAG_COLUMNS if c in columns), None)
    missing = [c for c in (word_column, tag_column) if c is not None and c not in columns]
    if missing or (labelled and tag_column is None):
        wanted = f"`{word_column}` and " + (f"`{tag_column}`" if tag_column else "`tags` or `ner_tags`")
        raise ConfigError(
            f"{source} lacks column(s) {', '.join(missing) or 'tags'} (its columns: {', '.join(columns)}); "
            f"give each row {wanted if labelled else f'`{word_column}` or `text`'}, or name yours with "
            "--text_columns and --label_column"
        )
    words = _column(dataset, word_column)
    _check_words(words, source, word_column)
    if not labelled:
        return Dataset.from_dict({"words": words}), f"({word_column})", None
    tags, declared = _tag_names(dataset, tag_column, config, source)
    for row, (row_words, row_tags) in enumerate(zip(words, tags, strict=True)):
        if len(row_words) != len(row_tags):
            raise ConfigError(
                f"{source}: row {row} has {len(row_words)} words and {len(row_tags)} tags; give every word "
                "one tag",
                fix="give every word one tag",
            )
    return Dataset.from_dict({"words": words, "tags": tags}), f"({word_column}, {tag_column})", declared


def _column(dataset: Dataset, name: str) -> list:
    """A column as a Python list (datasets' lazy Column reads Arrow on every index)."""
    return dataset.select_columns([name]).to_dict()[name]


def _check_words(words: list, source: str, column: str) -> None:
    for row, row_words in enumerate(words):
        if not isinstance(row_words, list) or not all(isinstance(w, str) for w in row_words):
            raise ConfigError(
                f"{source}: row {row}'s {column} is not a list of words; give a JSON list of strings",
                fix="give a JSON list of strings",
            )
        if not row_words:
            raise ConfigError(
                f"{source}: row {row} is an empty sentence (no words); drop the row", fix="drop the row"
            )
        _check_blank(row_words, f"{source}: row {row}")


def _check_blank(words: list[str], where: str) -> None:
    """A blank word (empty, or whitespace alone) is no word: the tokenizer gives it no token, so its tag
    would train on nothing and its prediction would be a guess; refused naming its position."""
    blank = next((i for i, word in enumerate(words) if not word.strip()), None)
    if blank is not None:
        raise ConfigError(
            f"{where} has a blank word (word {blank}: {words[blank]!r}); drop it (and its tag), or write it",
            fix="drop the blank word (and its tag), or write it",
        )


def _check_texts(texts: list, source: str) -> None:
    for row, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"{source}: row {row} has no text; drop the row", fix="drop the row")


def _tag_names(dataset: Dataset, column: str, config, source: str) -> tuple[list[list[str]], list | None]:
    """Each row's tags as names: strings as they are; ids through the column's ClassLabel (whatever
    --label_names says: it orders the model's labels, it does not rename the data's), else through
    --label_names (an id outside them refused, naming the row)."""
    feature = dataset.features[column]
    inner = feature.feature if isinstance(feature, List) else None
    declared = list(inner.names) if isinstance(inner, ClassLabel) else None
    listed = [n.strip() for n in config.label_names.split(",")] if config.label_names else None
    names = declared if declared is not None else listed
    rows = _column(dataset, column)
    result = []
    for row, tags in enumerate(rows):
        if not isinstance(tags, list):
            raise ConfigError(
                f"{source}: row {row}'s {column} is not a list of tags; give a JSON list, one tag per word",
                fix="give a JSON list, one tag per word",
            )
        if all(isinstance(t, str) for t in tags):
            result.append(tags)
            continue
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in tags):
            raise ConfigError(
                f"{source}: row {row}'s {column} mixes names, ids or nulls; give every tag as a name or "
                "every tag as an id",
                fix="give every tag as a name or every tag as an id",
            )
        if names is None:
            raise ConfigError(
                f"{source}: row {row}'s tags are ids; give their names in id order with --label_names "
                "(e.g. O,B-PER,I-PER)",
                flag="--label_names",
                fix="give --label_names",
            )
        outside = next((t for t in tags if not 0 <= t < len(names)), None)
        if outside is not None:
            raise ConfigError(
                f"{source}: row {row} has tag id {outside}, outside --label_names' {len(names)} names "
                f"(ids 0 to {len(names) - 1}); give every tag's name in --label_names",
                flag="--label_names",
                fix="give every tag's name in --label_names",
            )
        result.append([names[t] for t in tags])
    return result, declared


def load_tag_sources(config, wanted: dict[str, bool]) -> dict[str, tuple[str, Dataset | None]]:
    """Per split the run needs: (where it comes from, --dataset_name's split or None for a file)."""
    if config.uses_local_files:
        files = {"train": config.train_file, "validation": config.validation_file, "test": config.test_file}
        return {name: (path, None) for name, path in files.items() if path and wanted[name]}
    splits, sources = load_dataset_splits(config, None, wanted, (), labelled=False)
    return {name: (sources[name], split) for name, split in splits.items()}

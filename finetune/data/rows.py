"""Rows a run can't learn from or predict, refused in one line that names the row: a row without text,
and one float label among integer labels (which would silently make the task a regression)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset

from finetune.errors import ConfigError

WHOLE = re.compile(r"\s*-?\d+\s*$")


def refuse_rows_without_text(split: Dataset, source: str, columns: tuple[str, ...]) -> None:
    """A text cell that is missing or null, or a row whose every text column is empty, has nothing to
    classify: training would learn a constant, prediction would label it with confidence. (One empty
    side of a pair stays: GLUE's QQP has such rows.) Reads the columns as Arrow arrays, not rows."""
    blank_everywhere = None  # stays None when a column holds numbers: never empty
    numbers = False
    for column in columns:
        values = split.data.column(column)  # the rows as read: no selection or reordering yet
        if values.null_count:
            row = pc.index(pc.is_null(values), True).as_py()
            raise ConfigError(
                f"{source}: row {row} has no text in {column!r} (missing or null); give every row its text, "
                "or drop such rows"
            )
        if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
            numbers = True  # never empty, so no row is empty everywhere; nulls are still checked
            continue
        blank = pc.equal(pc.utf8_trim_whitespace(values), "")
        blank_everywhere = blank if blank_everywhere is None else pc.and_(blank_everywhere, blank)
    if not numbers and blank_everywhere is not None and pc.any(blank_everywhere).as_py():
        row = pc.index(blank_everywhere, True).as_py()
        shown = " and ".join(repr(c) for c in columns)
        raise ConfigError(
            f"{source}: row {row} has empty text in {shown}; give every row its text, or drop such rows"
        )


def refuse_a_float_among_integers(path: str | None, label_column: str) -> None:
    """Labels written as integers but one (2.0): the file's reader makes every label a float, and the
    task a regression. Refused, naming that row: classes are integers or names; a regression, all floats.
    Reads the training file once more, only when its labels are whole-number floats."""
    if path is None or Path(path).suffix.lower() == ".parquet":  # parquet keeps one type per column
        return
    suffix = Path(path).suffix.lower()
    first = {}  # "int" / "float" -> (row, the label as written)
    with open(path, newline="", encoding="utf-8") as f:
        if suffix in (".jsonl", ".json"):
            labels = (json.loads(line).get(label_column) for line in f if line.strip())
        else:
            delimiter, quoting = ("\t", csv.QUOTE_NONE) if suffix == ".tsv" else (",", csv.QUOTE_MINIMAL)
            labels = (r.get(label_column) for r in csv.DictReader(f, delimiter=delimiter, quoting=quoting))
        for row, value in enumerate(labels):
            if isinstance(value, bool) or value in (None, ""):
                continue
            written = value if isinstance(value, str) else json.dumps(value)
            first.setdefault("int" if WHOLE.match(written) else "float", (row, written))
            if len(first) == 2:
                row, written = first["float"]
                raise ConfigError(
                    f"{path}: row {row} has the label {written} among integer labels, which makes every "
                    "label a float and the task a regression; write it as an integer for classes, or every "
                    "label as a float for a regression"
                )

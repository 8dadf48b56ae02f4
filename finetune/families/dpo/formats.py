"""A preference file's rows, read before any tokenizing: which of TRL's four preference formats it has,
every row checked (the first bad one refused in one line naming the file, the row and the fix), and the
prompt of a row that gives none (TRL's implicit prompt: what chosen and rejected share at their start).

standard: `prompt`, `chosen` and `rejected` strings. conversational: the three as lists of messages (the
prompt's turns, then each completion's). implicit and implicit_conversational: `chosen` and `rejected`
alone, each the whole text or conversation, their shared start being the prompt."""

from __future__ import annotations

import functools
import os

from finetune.errors import ConfigError
from finetune.families.causal_lm.conversations import assistant_turns
from finetune.families.causal_lm.rows import check_messages, check_string, refusal, without_nulls

FORMATS = ("standard", "conversational", "implicit", "implicit_conversational")
PAIR = ("chosen", "rejected")
SHAPES = "`prompt`, `chosen` and `rejected` columns, or `chosen` and `rejected` alone (sharing their prompt)"
TURN = "\n\nAssistant:"
"""Anthropic HH-RLHF's turn marker: an implicit string prompt ends after the last one both texts share."""
SAME_SHAPE = "write every row's prompt, chosen and rejected the same way: strings, or lists of messages"


def detect_format(column_names: list[str], source: str, first_row: dict | None) -> str:
    """The file's format from its columns, and from its first row whether its cells are messages. A file
    whose rows mix formats has the union of their columns (as `datasets` reads JSON lines): there the
    first row decides, and `check_pairs` names the first row not in that format."""
    missing = [column for column in PAIR if column not in column_names]
    if missing:
        found = ", ".join(column_names) or "none"
        raise ConfigError(
            f"{source} has no preference pairs (no {' or '.join(missing)} column; its columns: {found}); "
            f"give it {SHAPES}",
            fix=f"give it {SHAPES}",
        )
    explicit = "prompt" in column_names and (first_row is None or first_row.get("prompt") is not None)
    messages = first_row is not None and isinstance(first_row.get("chosen"), list)
    if explicit:
        return "conversational" if messages else "standard"
    return "implicit_conversational" if messages else "implicit"


def check_pairs(rows, fmt: str, source: str) -> None:
    """Every row checked as a row of `fmt`; the first bad one refused (`ConfigError`), named by its number
    in the file (from 0): a missing or empty cell, a message list that is not one, strings among messages
    (or the reverse), a prompt where the file's first row has none (or none where it has one), and a
    conversation whose completion has no assistant turn to train on."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown preference format {fmt!r}; expected one of {FORMATS}")
    explicit, conversational = not fmt.startswith("implicit"), fmt.endswith("conversational")
    for number, row in enumerate(rows):
        refuse = functools.partial(refusal, source, number)
        prompt = row.get("prompt")
        if explicit and prompt is None:
            raise refuse(
                "has no prompt (null), among rows that have one",
                "give every row its prompt, or none (then chosen and rejected share their prompt)",
            )
        if not explicit and prompt is not None:
            raise refuse(
                "has a prompt, among rows that have none (their chosen and rejected share their prompt)",
                "give every row its prompt, or none",
            )
        columns = ("prompt", *PAIR) if explicit else PAIR
        _check_kinds(row, columns, conversational, refuse)
        check = check_messages if conversational else check_string
        for column in columns:
            check(row[column], column, number, source)
        if conversational:
            prompt, chosen, rejected = explicit_pair(row, fmt)
            for column, completion in zip(PAIR, (chosen, rejected), strict=True):
                if completion:  # an implicit pair's empty completion is dropped and counted (data.py)
                    _check_assistant_turn(prompt, completion, column, refuse)


def _check_kinds(row: dict, columns: tuple[str, ...], conversational: bool, refuse) -> None:
    """Strings in a file of strings, message lists in one of messages (by its first row); a cell of
    another type is check_string's or check_messages' to refuse."""
    stray, what, others = (str, "a string", "messages") if conversational else (list, "messages", "strings")
    for column in columns:
        if isinstance(row[column], stray):
            raise refuse(f"has its {column} as {what}, among rows that have {others}", SAME_SHAPE)


def _check_assistant_turn(prompt: list[dict], completion: list[dict], column: str, refuse) -> None:
    """A conversational completion trains on its assistant turns (conversations.py): one without any is
    refused, as SFT refuses one, naming the column."""

    def refuse_column(what: str, fix: str):
        return refuse(what.replace("in its completion", f"in its {column}"), fix)

    if not prompt:
        raise refuse(
            "has chosen and rejected that differ from their first message, so they share no prompt",
            "begin both with the same prompt turns, or give a prompt column",
        )
    assistant_turns(prompt + completion, len(prompt), refuse_column)


def explicit_pair(row: dict, fmt: str) -> tuple:
    """(prompt, chosen, rejected) of a checked row: as given, or an implicit row's shared start as its
    prompt and the rest of each as its completions (`implicit_prompt`)."""
    if not fmt.startswith("implicit"):
        return row["prompt"], row["chosen"], row["rejected"]
    chosen, rejected = row["chosen"], row["rejected"]
    cut = implicit_prompt(chosen, rejected)
    return chosen[:cut], chosen[cut:], rejected[cut:]


def implicit_prompt(chosen, rejected) -> int:
    """How much of `chosen` (and `rejected`) is their prompt, as TRL's `extract_prompt`: their longest
    common start, cut at a boundary. Messages: the shared messages (the first that differs begins the
    completions). Strings: through the last "\\n\\nAssistant:" (HH-RLHF's turn marker) both share, or,
    without one, up to the last whitespace of the shared start, the whitespace beginning the completions
    (as a tokenizer's words begin with their space); none of the text without either."""
    if isinstance(chosen, list):
        # Null fields aside: Arrow pads each column's messages with the fields any of its messages has
        # (a `weight` on a chosen reply), so the same prompt turn reads otherwise in chosen and rejected.
        shared, longest = 0, min(len(chosen), len(rejected))
        while shared < longest and without_nulls(chosen[shared]) == without_nulls(rejected[shared]):
            shared += 1
        return shared
    common = os.path.commonprefix([chosen, rejected])
    marker = common.rfind(TURN)
    if marker >= 0:
        return marker + len(TURN)
    spaces = [i for i, character in enumerate(common) if character.isspace()]
    return spaces[-1] if spaces else 0

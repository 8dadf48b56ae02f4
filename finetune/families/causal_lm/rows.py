"""The rows of a supervised fine-tuning file, read before any tokenizing: which of TRL's three shapes
the file has (a conversation, a prompt and its completion, plain text), and every row that could not be
trained on as that shape refused in one line naming the row and the fix, so that a bad row stops the
run before its first step instead of training on nothing, or on a null rendered as "None"."""

from __future__ import annotations

from collections.abc import Iterable

from datasets.features import Json

from finetune.errors import ConfigError

FORMATS = ("messages", "prompt_completion", "text")
"""TRL's dataset formats, named by their columns; detected in this order of preference."""

ROLES = ("system", "developer", "user", "assistant", "tool")
"""The roles a message may have: those chat templates know (OpenAI's, which TRL's datasets use)."""

COLUMNS = {"messages": ("messages",), "prompt_completion": ("prompt", "completion"), "text": ("text",)}
"""Each format's columns: a row is in a format when all of them are filled."""

SHAPES = "a `messages` column, `prompt` and `completion` columns, or a `text` column"


def refusal(source: str, row: int, what: str, fix: str) -> ConfigError:
    """The one-line error for a row: "<source>: row N <what is wrong>; <fix>", with `fix` as its field."""
    return ConfigError(f"{source}: row {row} {what}; {fix}", fix=fix)


def detect_format(column_names: list[str], source: str, first_row: dict | None = None) -> str:
    """The file's format from its columns: `messages` before `prompt`+`completion` before `text`. A file
    whose rows mix formats has the union of their columns (as `datasets` reads JSON lines): there the
    first row's filled columns decide, and `check_rows` names the first row not in that format."""
    present = [fmt for fmt in FORMATS if all(column in column_names for column in COLUMNS[fmt])]
    filled = [fmt for fmt in present if first_row and all(first_row.get(c) is not None for c in COLUMNS[fmt])]
    if filled or present:
        return (filled or present)[0]
    found = ", ".join(column_names) or "none"
    raise ConfigError(f"{source} has no column to train on (its columns: {found}); give it {SHAPES}")


def check_rows(rows: Iterable[dict], fmt: str, source: str) -> None:
    """Every row checked as a row of `fmt`; the first bad one refused (`ConfigError`), named by its number
    in the file (from 0). A conversational prompt-completion file (prompts and completions both lists of
    messages) takes no row of strings, nor the reverse: the file's first row decides which it is."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown SFT format {fmt!r}; expected one of {FORMATS}")
    conversational = None  # prompt_completion: whether the file's prompts are messages, by its first row
    for number, row in enumerate(rows):
        _refuse_another_format(row, fmt, number, source)
        if fmt == "messages":
            check_messages(row["messages"], "messages", number, source)
        elif fmt == "text":
            check_string(row["text"], "text", number, source)
        else:
            kind = _check_prompt_completion(row["prompt"], row["completion"], number, source)
            if conversational is None:
                conversational = kind
            elif kind != conversational:
                what, others = ("lists of messages", "strings") if kind else ("strings", "lists of messages")
                raise refusal(
                    source,
                    number,
                    f"has its prompt and completion as {what}, among rows that have them as {others}",
                    "write every row's prompt and completion the same way: strings, or lists of messages",
                )


def _refuse_another_format(row: dict, fmt: str, number: int, source: str) -> None:
    """A row whose own format's cells are all null while another format's are filled: the file mixes
    formats, which one run does not train on (its rows would need different losses and renderings)."""
    if any(row.get(column) is not None for column in COLUMNS[fmt]):
        return
    for other in FORMATS:
        if other != fmt and all(row.get(column) is not None for column in COLUMNS[other]):
            raise refusal(
                source,
                number,
                f"is in the {other} format, in a file of the {fmt} format (by its columns)",
                f"write every row in one format (TRL's: {SHAPES}), or split the file by format",
            )


def check_string(value, column: str, number: int, source: str) -> None:
    """A `text`, `prompt` or `completion` cell: a string, non-empty except a prompt's (an empty prompt
    still has a completion to learn)."""
    if value is None:
        raise refusal(
            source, number, f"has no {column} (null)", f"give every row its {column}, or drop the row"
        )
    if not isinstance(value, str):
        raise refusal(
            source,
            number,
            f"has a {column} that is not a string ({type(value).__name__})",
            f"write its {column} as a string",
        )
    if column != "prompt" and not value.strip():
        raise refusal(source, number, f"has an empty {column}", f"give it its {column}, or drop the row")


def _check_prompt_completion(prompt, completion, number: int, source: str) -> bool:
    """Both strings, or both lists of messages (TRL's conversational prompt-completion, whose conversation
    is the prompt's messages then the completion's). Returns whether they are messages."""
    kinds = [isinstance(cell, list) for cell in (prompt, completion)]
    if kinds[0] != kinds[1] and None not in (prompt, completion):
        raise refusal(
            source,
            number,
            f"has a prompt of type {type(prompt).__name__} and a completion of type "
            f"{type(completion).__name__}",
            "give both as strings, or both as lists of messages",
        )
    if kinds[0] or kinds[1]:
        check_messages(prompt, "prompt", number, source)
        check_messages(completion, "completion", number, source)
        return True
    check_string(prompt, "prompt", number, source)
    check_string(completion, "completion", number, source)
    return False


def check_messages(messages, column: str, number: int, source: str) -> None:
    """A list of {"role", "content"} objects: a known role, string content, a `weight` only of 0 or 1 on an
    assistant message, and no assistant turn that is blank (a target of whitespace would teach the model
    to answer with nothing) unless it calls tools (OpenAI's and transformers' `tool_calls`, with empty or
    null content: the template renders the calls)."""
    if messages is None:
        raise refusal(source, number, f"has no {column} (null)", f"give it its {column}, or drop the row")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise refusal(
            source,
            number,
            f"has a {column} cell that is not a list of messages",
            'write it as [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]',
        )
    if not messages:  # an empty prompt too: transformers renders no conversation of no messages
        raise refusal(source, number, f"has an empty {column} list", f"give it its {column}, or drop the row")
    for index, message in enumerate(messages):
        where = f"{column}[{index}]"
        calls = message.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and calls):
            raise refusal(
                source,
                number,
                f"has tool_calls that are not a list of calls ({where})",
                'write them as [{"type": "function", "function": {"name": ..., "arguments": ...}}]',
            )
        if calls and message.get("content") is None:  # OpenAI's tool-calling turn: the calls are the reply
            message = {**message, "content": ""}
        for key in ("role", "content"):
            if message.get(key) is None:
                raise refusal(
                    source,
                    number,
                    f"has a message without a {key} ({where})",
                    f"give every message its {key}",
                )
        role, content = message["role"], message["content"]
        if role not in ROLES:
            raise refusal(
                source,
                number,
                f"has a message with the role {role!r} ({where}), not one of {', '.join(ROLES)}",
                "give every message one of those roles",
            )
        if not isinstance(content, str):
            raise refusal(
                source,
                number,
                f"has a message whose content is not a string ({where}: {type(content).__name__})",
                "write every message's content as a string",
            )
        _check_weight(message.get("weight"), role, where, number, source)
        if role == "assistant" and not content.strip() and not calls:
            raise refusal(
                source,
                number,
                f"has an empty assistant turn ({where})",
                "write the assistant's reply, or drop the turn",
            )


def _check_weight(weight, role: str, where: str, number: int, source: str) -> None:
    """OpenAI's fine-tuning format: an assistant message's `weight` 0 makes it context, 1 (or none) a
    target. Any other value, or a weight on another role's message, says something no run can honour."""
    if weight is None:
        return
    fix = "give an assistant message weight 0 (context) or 1 (a target), and no other message a weight"
    if role != "assistant":
        raise refusal(source, number, f"has a weight on a {role} message ({where}), which never trains", fix)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or weight not in (0, 1):
        raise refusal(source, number, f"has an assistant message of weight {weight!r} ({where})", fix)


CONVERSATION_COLUMNS = ("messages", "prompt", "completion", "tools")


def struct_columns(features) -> frozenset[str]:
    """The conversation columns of a split that Arrow stores as structs (a Parquet file written by pyarrow
    or pandas): each of their objects has every field any other has, null where it had none, so those
    nulls are padding. A JSON column (datasets' `Json`: JSON lines, and what datasets writes) holds the
    rows' objects as written: a null there is the user's, such as an argument's value."""
    return frozenset(
        column for column in CONVERSATION_COLUMNS if column in features and not _holds_json(features[column])
    )


def _holds_json(feature) -> bool:
    if isinstance(feature, Json):
        return True
    if isinstance(feature, dict):
        return any(_holds_json(inner) for inner in feature.values())
    inner = getattr(feature, "feature", None)  # List, LargeList
    return inner is not None and _holds_json(inner)


def unpadded(row: dict, structs: frozenset[str]) -> dict:
    """`row` less the padding nulls of its struct columns (`struct_columns`), at every depth."""
    return {column: without_nulls(value) if column in structs else value for column, value in row.items()}


def without_nulls(value):
    """`value` less its null fields, at every depth (a template asking `is defined` would render them)."""
    if isinstance(value, dict):
        return {key: without_nulls(v) for key, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value

"""One checked row (see rows.py) as token ids and its loss mask, as TRL's SFTTrainer builds them.

Text trains on every token; a prompt and its completion on the completion and the EOS after it; a
conversation, rendered by the tokenizer's chat template, on its assistant turns, each through its
end-of-turn token. The assistant turns are found by rendering the conversation's prefixes, not by the
`{% generation %}` markers that few templates have: the characters an assistant turn adds to the
conversation before it (with the generation prompt) are its targets, and each token that starts in them
is one. A template or tokenizer that would make this wrong is refused, naming the row: nothing trains
silently on the wrong tokens, or on none."""

from __future__ import annotations

import json
from dataclasses import dataclass

from finetune.errors import shorten
from finetune.families.causal_lm.rows import refusal

IGNORE = -100
"""The label of a token that is no target: what the loss (PyTorch's cross_entropy) skips."""

EVERY_TOKEN = "--assistant_only_loss false"
TEMPLATE_FIX = "give --chat_template FILE.jinja"
TOOLS_FIX = "write tools as a JSON list of function schemas"


@dataclass(frozen=True)
class Encoded:
    """A row's tokens and their labels, aligned and not shifted: labels[i] is input_ids[i] where token i
    is a target, else -100 (the loss shifts them to predict each token from those before it)."""

    input_ids: list[int]
    labels: list[int]
    truncated: bool
    """Whether the row had more than max_length tokens (the first max_length kept)."""

    @property
    def targets(self) -> int:
        """How many tokens the loss trains on: 0 when truncation cut them all (the caller drops the row)."""
        return sum(label != IGNORE for label in self.labels)


def encode_examples(
    row: dict,
    fmt: str,
    tokenizer,
    *,
    max_length: int,
    completion_only_loss: bool = True,
    assistant_only_loss: bool = True,
    row_number: int,
    source: str,
    appended: list[int] | None = None,
) -> list[Encoded]:
    """`row`, checked by check_rows as a row of `fmt`, as token ids and labels, cut to `max_length` tokens:
    one example, or for a conversation whose template renders earlier turns differently once answered
    (Qwen3's drops their reasoning), one per assistant turn, each on the conversation up to it.

    completion_only_loss: a prompt-completion row trains on its completion only (else on every token).
    assistant_only_loss: a conversation trains on its assistant turns only (else on every token); one
    without an assistant turn (in its completion, for a conversational prompt-completion) is refused.
    appended: `appended_tokens(tokenizer)`, where the caller encodes many rows (found here when None)."""

    def refuse(what: str, fix: str):
        return refusal(source, row_number, what, fix)

    if fmt == "text":
        ids = _ending_with_eos(tokenizer(row["text"])["input_ids"], tokenizer, refuse)
        examples = [(ids, list(ids))]
    elif fmt == "prompt_completion" and isinstance(row["prompt"], str):
        appended = appended_tokens(tokenizer) if appended is None else appended
        pair = (row["prompt"], row["completion"])
        examples = [_prompt_completion(*pair, tokenizer, completion_only_loss, refuse, appended)]
    else:
        if fmt == "messages":
            messages, prompt_turns = row["messages"], None
        else:  # conversational prompt-completion: the prompt's turns are context, never targets
            messages = row["prompt"] + row["completion"]
            prompt_turns = len(row["prompt"]) if completion_only_loss else None
        tools = row_tools(row, refuse)
        examples = _conversation(messages, prompt_turns, tokenizer, assistant_only_loss, refuse, tools)
    return [Encoded(ids[:max_length], labels[:max_length], len(ids) > max_length) for ids, labels in examples]


def encode_row(row: dict, fmt: str, tokenizer, **options) -> Encoded:
    """`encode_examples` for a row that trains as one sequence (any but a turn-by-turn conversation)."""
    (example,) = encode_examples(row, fmt, tokenizer, **options)
    return example


def _messages_without_nulls(messages: list[dict]) -> list[dict]:
    # A message's own null fields (OpenAI's `"content": null` beside tool_calls) would render as "None";
    # what they hold (a call's arguments) is left as written. A weight is the loss's, not the model's.
    return [{key: v for key, v in m.items() if v is not None and key != "weight"} for m in messages]


def row_tools(row: dict, refuse) -> list | None:
    """A conversation's `tools` column (TRL's: the function schemas the chat template writes into the
    prompt), as JSON objects or a JSON string; None without one."""
    tools = row.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError:
            raise refuse("has a tools cell that is not JSON", TOOLS_FIX) from None
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise refuse("has a tools cell that is not a list of schemas", TOOLS_FIX)
    return tools


def _ending_with_eos(ids: list[int], tokenizer, refuse) -> list[int]:
    """`ids` with the tokenizer's EOS after them, unless they end with it: what teaches the model to stop."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise refuse(
            "has no EOS token to end it with: the tokenizer has none",
            "give a tokenizer with an eos_token (in its tokenizer_config.json)",
        )
    return ids if ids and ids[-1] == eos else [*ids, eos]


def _prompt_completion(
    prompt: str, completion: str, tokenizer, completion_only_loss: bool, refuse, appended: list[int]
):
    """The prompt, the completion and EOS, tokenized as TRL does: the prompt alone (for its length) and
    with the completion appended (for the ids), with the tokenizer's own special tokens (a BOS). The
    prompt's tokens must begin the whole's, or its last ones would be cut or trained on."""
    prompt_ids = tokenizer(prompt)["input_ids"]
    prompt_ids = prompt_ids[: len(prompt_ids) - len(appended)]  # an EOS the tokenizer adds ends no prompt
    ids = tokenizer(prompt + completion)["input_ids"]
    if ids[: len(prompt_ids)] != prompt_ids:
        raise refuse(
            "has a prompt whose tokens change when its completion is appended (its last token merges "
            f"with the completion's start: it ends with {prompt[-12:]!r})",
            "end the prompt at a token boundary, e.g. move its trailing space into the completion",
        )
    ids = _ending_with_eos(ids, tokenizer, refuse)
    if not completion_only_loss:
        return ids, list(ids)
    return ids, [IGNORE] * len(prompt_ids) + ids[len(prompt_ids) :]


def appended_tokens(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts after any text (an EOS where add_eos_token is set, as its
    post-processor says; none for most decoders)."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    added = tokenizer("a")["input_ids"]
    for start in range(len(added) - len(plain) + 1):
        if added[start : start + len(plain)] == plain:
            return added[start + len(plain) :]
    return []


def end_of_turn(tokenizer) -> list[int]:
    """The token the chat template closes an assistant turn with, where it is a special token (ChatML's
    <|im_end|>, Llama 3's <|eot_id|>, Gemma's <end_of_turn>); none without a template, or where a turn
    ends in plain text."""
    probe = "finetune-probe"
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": probe}], tokenize=False
        )
    except Exception:  # no template, or one that asks for more (jinja, or the template's own Python)
        return []
    after = text.rsplit(probe, 1)[1] if probe in text else ""
    for token in tokenizer(after, add_special_tokens=False)["input_ids"] if after.strip() else []:
        if tokenizer.decode([token]).strip():  # the first that is not whitespace
            added = tokenizer.added_tokens_decoder.get(token)
            special = token in tokenizer.all_special_ids or getattr(added, "special", False)
            return [token] if special else []
    return []


def render_chat(tokenizer, messages: list[dict], tools, add_generation_prompt: bool, refuse, fix=None) -> str:
    """`messages` (each message's null fields dropped) and the row's `tools` as the chat template renders
    them; a row it cannot render (jinja's TemplateError, or a Python error of the template's own, such as
    str + int) is refused in one line, with `fix` (default: fix the row, or another template)."""
    try:
        return tokenizer.apply_chat_template(
            _messages_without_nulls(messages),
            tools=tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )
    except Exception as error:
        reason = shorten(" ".join(str(error).split()) or type(error).__name__, 120)
        raise refuse(
            f"cannot be rendered by the chat template ({reason})",
            fix or f"fix the row, or {TEMPLATE_FIX} that renders it",
        ) from None


def refuse_unwritten_tools(tokenizer, messages, tools, rendered: str, add_generation_prompt: bool, refuse):
    """A row's tools that the chat template leaves out of `rendered` (its render of `messages`) are refused:
    the model would learn, or be asked, to call functions it is never shown."""
    if tools and rendered == render_chat(tokenizer, messages, None, add_generation_prompt, refuse):
        raise refuse(
            "gives tools, which the chat template does not write into the conversation",
            f"{TEMPLATE_FIX} that renders tools (as its model's own template does), or drop the tools column",
        )


def _conversation(
    messages: list[dict], prompt_turns: int | None, tokenizer, assistant_only_loss: bool, refuse, tools=None
):
    """The conversation rendered by the chat template and tokenized once, with no special tokens added
    (the template writes its own). Targets: the assistant turns, those of the completion only where
    `prompt_turns` (the prompt's length) is given; not assistant_only_loss, every token of the completion
    after the generation prompt, or of the conversation where no prompt is given. One example, or one per
    assistant turn where the conversation through a turn does not begin the whole."""
    if not getattr(tokenizer, "chat_template", None):
        raise refuse("is a conversation, but the tokenizer has no chat template", TEMPLATE_FIX)

    def render(turns: list[dict], add_generation_prompt: bool = False) -> str:
        return render_chat(tokenizer, turns, tools, add_generation_prompt, refuse)

    full = render(messages)
    refuse_unwritten_tools(tokenizer, messages, tools, full, False, refuse)
    if not assistant_only_loss:
        unweighed = next((i for i, m in enumerate(messages) if m.get("weight") == 0), None)
        if unweighed is not None and unweighed >= (prompt_turns or 0):
            raise refuse(
                f"has an assistant message of weight 0 (message {unweighed}), context that "
                f"{EVERY_TOKEN} would train on",
                "drop --assistant_only_loss false, or the message's weight",
            )
    if not assistant_only_loss and prompt_turns is None:
        ids = tokenizer(full, add_special_tokens=False)["input_ids"]
        return [(ids, list(ids))]
    # Here, not at the top: headers.py renders through this module's render_chat.
    from finetune.families.causal_lm.headers import refuse_trained_header

    if not assistant_only_loss:  # the completion of a conversational prompt-completion, whole
        if messages[prompt_turns]["role"] == "assistant":
            refuse_trained_header(tokenizer, messages, prompt_turns, tools, refuse)
        span = _completion_span(messages, prompt_turns, full, render, refuse)
        return [_tokenized(full, [span], tokenizer, refuse)]
    trained = assistant_turns(messages, prompt_turns, refuse)
    refuse_trained_header(tokenizer, messages, trained[0], tools, refuse)  # as every turn's, by the first
    turns = [(render(messages[: i + 1]), i) for i in trained]
    spans = [_turn_span(messages, i, through, render, refuse) for through, i in turns]
    if all(full.startswith(through) for through, _ in turns):
        return [_tokenized(full, spans, tokenizer, refuse)]
    # The template renders a turn otherwise once later turns follow (Qwen3's drops answered turns'
    # reasoning): each assistant turn on the conversation up to it, as the model meets it.
    return [
        _tokenized(through, [span], tokenizer, refuse)
        for (through, _), span in zip(turns, spans, strict=True)
    ]


def _tokenized(text: str, spans, tokenizer, refuse):
    try:
        encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError:  # a Python ("slow") tokenizer has no character offsets
        raise refuse(
            "needs the tokens' character offsets to find its assistant turns, and the tokenizer gives none",
            f"give a fast tokenizer (tokenizer.json), or {EVERY_TOKEN}",
        ) from None
    ids = encoding["input_ids"]
    return ids, _labels_in_spans(ids, encoding["offset_mapping"], spans, text, refuse)


def _completion_span(messages, prompt_turns: int, full: str, render, refuse) -> tuple[int, int, int]:
    """With --assistant_only_loss false, a conversational prompt-completion's targets: all of `full`
    after its prompt with the generation prompt, less trailing whitespace."""
    before = render(messages[:prompt_turns], add_generation_prompt=True)
    if not full.startswith(before):
        raise refuse(
            "is rendered by the chat template so that its prompt with the generation prompt does not "
            "begin the whole conversation",
            f"{TEMPLATE_FIX} that renders each turn the same wherever it stands, or "
            "--completion_only_loss false",
        )
    return len(before), len(full.rstrip()), prompt_turns


def assistant_turns(messages, prompt_turns: int | None, refuse) -> list[int]:
    """The assistant turns to train on: the completion's only where `prompt_turns` is given. Asked of
    every row before the model loads too (data.py `check_assistant_turns`)."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i >= (prompt_turns or 0)]
    targets = [i for i in turns if messages[i].get("weight") != 0]  # weight 0: context (OpenAI's format)
    if not targets:
        where = "" if prompt_turns is None else " in its completion"
        weighed = " (each has weight 0)" if turns else ""
        raise refuse(f"has no assistant turn{where} to train on{weighed}", f"add one, or {EVERY_TOKEN}")
    turns = targets
    if turns[0] == 0:
        raise refuse(
            "begins with an assistant turn, whose prompt cannot be rendered (no conversation before it)",
            f"begin it with a user or system turn, or {EVERY_TOKEN}",
        )
    return turns


def _turn_span(messages, i: int, through: str, render, refuse) -> tuple[int, int, int]:
    """Assistant turn i's targets in `through`, the conversation rendered up to it: what it adds after the
    generation prompt, less trailing whitespace (ChatML's newline after <|im_end|> is the next turn's
    start, never predicted at the end of a reply); refused where the template writes it as nothing,
    without its tool calls, or not after the generation prompt."""
    before = render(messages[:i], add_generation_prompt=True)
    if not through.startswith(before):
        raise refuse(
            f"is rendered by the chat template so that the generation prompt is not how its assistant turn "
            f"begins (message {i}; e.g. a generation prompt adding <think>), so the turn cannot be found",
            f"{TEMPLATE_FIX} whose generation prompt begins each assistant turn, or {EVERY_TOKEN}",
        )
    end = len(through.rstrip())
    if end <= len(before):
        raise refuse(
            f"has an assistant turn that the chat template renders as nothing (message {i})",
            f"{TEMPLATE_FIX} that writes every assistant turn, or {EVERY_TOKEN}",
        )
    unwritten = [name for name in _call_names(messages[i]) if name not in through[len(before) : end]]
    if unwritten:
        raise refuse(
            f"has an assistant turn whose tool_calls the chat template does not write (message {i}: "
            f"{unwritten[0]!r} is not in it), so the model would learn to answer with nothing",
            f"{TEMPLATE_FIX} that renders tool_calls (as its model's own template does)",
        )
    return len(before), end, i


def _call_names(message: dict) -> list[str]:
    """The function names of an assistant turn's tool_calls (OpenAI's {"function": {"name"}}, or {"name"})."""
    calls = [call for call in message.get("tool_calls") or [] if isinstance(call, dict)]
    functions = [call["function"] if isinstance(call.get("function"), dict) else call for call in calls]
    return [function["name"] for function in functions if isinstance(function.get("name"), str)]


def _labels_in_spans(ids: list[int], offsets, spans, text: str, refuse) -> list[int]:
    """Each token that starts inside a span is a target. Every character of a span but whitespace must
    be in a target token: a token across a span's start (a template whose turn starts inside a token) or
    a tokenizer whose offsets are empty would otherwise cut or lose targets without a word."""
    labels = [IGNORE] * len(ids)
    reach = [start for start, _, _ in spans]  # how far each span's target tokens cover it so far
    k = 0
    for t, (start, end) in enumerate(offsets):
        while k < len(spans) and spans[k][1] <= start:
            k += 1
        if k == len(spans):
            break
        if start < spans[k][0]:
            continue
        if text[reach[k] : start].strip():
            break  # a gap: reported below with its message
        labels[t] = ids[t]
        reach[k] = max(reach[k], end)
    for (_, end, message), covered in zip(spans, reach, strict=True):
        if text[covered:end].strip():
            raise refuse(
                f"has characters of message {message}'s targets in no token that starts in them (the chat "
                "template's turn boundary falls inside a token, or the tokenizer gives no offsets)",
                f"{TEMPLATE_FIX} whose turns start at token boundaries, or {EVERY_TOKEN}",
            )
    return labels

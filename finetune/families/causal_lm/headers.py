"""Whether a chat template's generation prompt is the whole header of an assistant turn.

An assistant turn's targets are what it adds after the generation prompt (conversations.py), so a
template whose generation prompt stops short of the turn's role header trains the rest of the header:
one that ignores `add_generation_prompt` (common in community templates) trains all of it, and a model
tuned on it answers "assistant\\nred" where its prompt (with no header) asks it to continue. The header is
found by rendering the row's messages with probes for the reply and the message before it: the header is
what the template writes between the conversation before the reply and the reply, and its role is where
it stops matching how the template begins the message before (ChatML's `<|im_start|>` then `assistant`).
The generation prompt must reach past that role's name and what is glued to it (Llama 3's
`<|end_header_id|>`); whatever the template writes after it (Qwen3's empty `<think></think>` block) is
the model's to write, and trains."""

from __future__ import annotations

import os
import re

from finetune.families.causal_lm.conversations import EVERY_TOKEN, TEMPLATE_FIX, render_chat

CONTEXT, REPLY = "finetune-context-probe", "finetune-reply-probe"
ROLE = re.compile(r"[^\w\s]*\w+\S*")
"""A header's role from where it differs from the message before's: its name and what is glued to it."""


class _Unrendered(Exception):
    """A probe the template does not render: the row's own render says what is wrong, if anything."""


def _no_refusal(what: str, fix: str) -> Exception:
    return _Unrendered(what)


def refuse_trained_header(
    tokenizer, messages: list[dict], i: int, tools, refuse, trains: bool = True
) -> None:
    """Refuses (in one line naming the row, by `refuse(what, fix)`) a template whose generation prompt is
    not all of assistant turn i's header, as the module docstring says. Turns that follow another
    assistant turn, and probes the template cannot render, are left to the row's own checks. trains:
    false for a prompt to generate from (messages[i] a placeholder), whose model would write the header."""
    if i == 0 or messages[i - 1]["role"] == "assistant":
        return
    turns = [
        *messages[: i - 1],
        {**messages[i - 1], "content": CONTEXT},
        {"role": "assistant", "content": REPLY},
    ]

    def render(upto: int, prompt: bool = False) -> str:
        return render_chat(tokenizer, turns[:upto], tools, prompt, _no_refusal) if upto else ""

    try:
        earlier, before, prompted, whole = render(i - 1), render(i), render(i, True), render(i + 1)
    except _Unrendered:
        return
    context, reply = before.find(CONTEXT, len(earlier)), whole.find(REPLY, len(before))
    if not (before.startswith(earlier) and whole.startswith(before) and prompted.startswith(before)):
        return
    if context < 0 or reply < 0:
        return
    header, prompt = whole[len(before) : reply], prompted[len(before) :]
    if not header.startswith(prompt):  # a prompt that adds what the turn lacks: _turn_span's refusal
        return
    opening = before[len(earlier) : context]  # how the message before begins (after a BOS, when first)
    bos = getattr(tokenizer, "bos_token", None)
    if not earlier and bos and opening.startswith(bos):
        opening = opening[len(bos) :]
    differs = len(os.path.commonprefix([opening, header]))
    role = ROLE.match(header, differs)
    reach = role.end() if role else 0
    if len(prompt) < reach or (not prompt.strip() and header.strip()):
        ignored = "; it ignores add_generation_prompt" if not prompt else ""
        harm = "be trained and the model would write it" if trains else "be left for the model to write"
        fix = f"{TEMPLATE_FIX} whose generation prompt is the assistant's whole header"
        raise refuse(
            f"is rendered by the chat template with a generation prompt ({prompt!r}{ignored}) that is not "
            f"all of an assistant turn's header ({header!r}, message {i}), so the rest of the header would "
            f"{harm} in its answers",
            f"{fix}, or {EVERY_TOKEN}" if trains else fix,
        )

"""One preference pair as two token sequences (the prompt, then the chosen or the rejected completion) with
their loss masks, encoded by the SFT family's own rules (finetune/families/causal_lm/conversations.py) so
that a completion's targets are those SFT trains on: a string completion and the EOS after it (appended
once: a completion that ends with it, or a tokenizer that appends it, gets no second one), a
conversational completion's assistant turns through their end-of-turn token; then both cut to
--max_length by `truncation`'s rule."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from finetune.families.causal_lm.conversations import IGNORE, encode_examples
from finetune.families.causal_lm.rows import refusal

NO_LIMIT = sys.maxsize
"""The SFT encoder's max_length here: a pair is cut by `truncation`, which keeps the prompt's end."""


@dataclass(frozen=True)
class Side:
    """One of a pair's sequences: the prompt's tokens then the completion's, and their labels (-100 but at
    the completion's targets, aligned with the ids, not shifted)."""

    input_ids: list[int]
    labels: list[int]

    @property
    def targets(self) -> int:
        """Predicted targets: the first token has nothing before it, so it never counts (as SFT's)."""
        return sum(label != IGNORE for label in self.labels[1:])


@dataclass(frozen=True)
class Pair:
    chosen: Side
    rejected: Side
    truncated: bool
    """Whether the prompt and the longer completion had more than max_length tokens."""


def encode_pair(prompt, chosen, rejected, tools, tokenizer, *, max_length: int, row_number: int, source: str,
                appended: list[int]) -> Pair:  # fmt: skip
    """The pair (strings, or lists of messages with the row's `tools`) as SFT encodes a prompt-completion
    row of it with --completion_only_loss and --assistant_only_loss, then cut by `truncation`. The prompt
    is the tokens both sequences share before either's first target (a conversation's generation prompt
    included), so cutting it keeps the two sequences' prompts the same."""
    sides = []
    for completion in (chosen, rejected):
        row = {"prompt": prompt, "completion": completion, "tools": tools}
        examples = encode_examples(
            row, "prompt_completion", tokenizer, max_length=NO_LIMIT, completion_only_loss=True,
            assistant_only_loss=True, row_number=row_number, source=source, appended=appended,
        )  # fmt: skip
        if len(examples) > 1:  # a template that renders answered turns otherwise (Qwen3's reasoning)
            raise refusal(
                source,
                row_number,
                "has a completion of several assistant turns that the chat template renders otherwise once "
                "later turns follow, so it has no one sequence to score",
                "give completions of one assistant turn",
            )
        sides.append(examples[0])
    first_targets = [_first_target(side.labels) for side in sides]
    shared = common_length(sides[0].input_ids, sides[1].input_ids)
    prompt_length = min(*first_targets, shared)
    completions = [len(side.input_ids) - prompt_length for side in sides]
    kept_prompt, kept_completion = truncation(prompt_length, max(completions), max_length)
    start, end = prompt_length - kept_prompt, prompt_length + kept_completion
    chosen, rejected = (Side(side.input_ids[start:end], side.labels[start:end]) for side in sides)
    return Pair(chosen, rejected, truncated=prompt_length + max(completions) > max_length)


def truncation(prompt: int, completion: int, max_length: int) -> tuple[int, int]:
    """A pair of more than --max_length tokens (its prompt and its longer completion) is cut so that both
    sequences keep the same prompt tokens and the same completion budget. Each completion keeps its first
    K tokens (a shorter one whole), K = min(the longer completion, max(max_length - prompt,
    max_length // 2)): all the room the prompt leaves, and at least half of max_length, the prompt being
    cut first. The prompt keeps its last max_length - K tokens: its first ones, a BOS among them, are
    dropped (TRL's "keep_end"). A pair within --max_length is kept whole.

    Returns (prompt tokens kept, K) for the prompt's and the longer completion's lengths in tokens."""
    if prompt + completion <= max_length:
        return prompt, completion
    kept_completion = min(completion, max(max_length - prompt, max_length // 2))
    return min(prompt, max_length - kept_completion), kept_completion


def _first_target(labels: list[int]) -> int:
    return next((i for i, label in enumerate(labels) if label != IGNORE), len(labels))


def common_length(first: list[int], second: list[int]) -> int:
    """How many first tokens two sequences share."""
    shared = 0
    while shared < min(len(first), len(second)) and first[shared] == second[shared]:
        shared += 1
    return shared

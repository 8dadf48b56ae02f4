"""A DPO run's rows: preference pairs read (local files or --dataset_name, as the SFT family reads them),
checked row by row (formats.py), and encoded as two sequences each, the prompt then the chosen or the
rejected completion, masked by the SFT family's rules and cut to --max_length (pairs.py). Pairs that
cannot teach a preference (chosen equals rejected, or no completion token left) are dropped and counted
on the task line; a split left with none is refused."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from datasets import Dataset, Features, List, Value

from finetune.data.tokenization import tokenizer_state
from finetune.errors import ConfigError
from finetune.families.causal_lm.conversations import appended_tokens, end_of_turn
from finetune.families.causal_lm.data import carved_and_limited, read_raw_splits
from finetune.families.causal_lm.generation import check_prompts
from finetune.families.causal_lm.rows import struct_columns, unpadded, without_nulls
from finetune.families.dpo.formats import check_pairs, detect_format, explicit_pair
from finetune.families.dpo.pairs import encode_pair

FORMAT_WORDS = {
    "standard": "strings, explicit prompt",
    "conversational": "conversational, explicit prompt",
    "implicit": "strings, implicit prompt",
    "implicit_conversational": "conversational, implicit prompt",
}
DROPS = {
    "identical": "chosen equals rejected",
    "identical_within_max_length": "chosen equals rejected within --max_length",
    "no_completion": "no completion token left",
}
"""Why a pair is dropped (its `counts` key), as the task line says it."""

SIDES = ("chosen", "rejected")
COLUMNS = Features(
    {
        **{f"{side}_{part}": List(Value("int64")) for side in SIDES for part in ("input_ids", "labels")},
        "chosen_targets": Value("int64"),
        "rejected_targets": Value("int64"),
        "row": Value("int64"),
        "length": Value("int64"),
        "truncated": Value("bool"),
        "dropped": Value("string"),
    }
)  # fmt: skip
"""What encoding writes per pair, typed: a batch of dropped pairs alone would leave Arrow no type to infer."""


@dataclass
class PreferenceTask:
    """What a DPO run learns from: the format its rows hold, and each split's pairs as encoded."""

    format: str
    """standard, conversational, implicit or implicit_conversational (detected from the columns)."""
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per split, filled by `encode_pairs`: rows read, pairs kept, truncated, and each of DROPS' reasons;
    the test split's by causal_lm.generation.encode_prompts (rows, truncated, dropped)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Where each split came from (a file, or --dataset_name:split), for messages."""
    notes: list[str] = field(default_factory=list)
    """What the user should know about the targets (the task line's end)."""
    name: str = "dpo"
    metrics: tuple[str, ...] = ("rewards/accuracies", "rewards/margins")
    validation_splits: tuple[str, ...] = ("validation",)

    def metric_keys(self, per_class: bool = True) -> list[str]:
        return [f"eval_{metric}" for metric in self.metrics]

    def summary(self) -> str:
        """The run's task line: each split's pairs as encoded, the format after the first, then why pairs
        were dropped and how many were truncated."""
        words = f"({FORMAT_WORDS[self.format]})"
        parts = []
        for name, counts in self.counts.items():
            source = self.sources.get(name, name)
            if name == "test":  # encode_prompts' counts
                truncated = f" ({counts['truncated']:,} truncated)" if counts["truncated"] else ""
                parts.append(f"test: {_counted(counts['rows'], 'prompt')} from {source}{truncated}")
                continue
            part = f"{_counted(counts['pairs'], 'pair')}{'' if parts else ' ' + words} from {source}"
            part += "".join(
                f"; {counts[key]:,} dropped: {why}" for key, why in DROPS.items() if counts.get(key)
            )
            part += f"; {counts['truncated']:,} truncated" if counts.get("truncated") else ""
            parts.append(part)
        notes = "".join(f"; {note}" for note in self.notes)
        return f"dpo: {'; '.join(parts) or words}{notes}"


def _counted(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


def load_preference_splits(config) -> tuple[PreferenceTask, dict[str, Dataset]]:
    """The task and its raw splits (train, validation, test as the run needs them), every row checked;
    --validation_split_percentage carves validation pairs from training ones, and the test split becomes
    its prompts (`test_prompts`)."""
    splits, sources = read_raw_splits(config)
    formats = {}
    for name, split in splits.items():
        if name == "test":
            splits[name] = test_prompts(split, sources[name])
            continue
        fmt = detect_format(split.column_names, sources[name], split[0] if len(split) else None)
        check_pairs(split, fmt, sources[name])
        formats[name] = fmt
    if config.carves_validation:
        formats["validation"] = formats["train"]
        percentage = config.validation_split_percentage
        sources["validation"] = f"{sources['train']} (--validation_split_percentage {percentage})"
    splits = carved_and_limited(splits, config, sources)
    if len(set(formats.values())) > 1:
        shown = ", ".join(f"{sources[n]}: {FORMAT_WORDS[f]}" for n, f in formats.items())
        raise ConfigError(f"the splits hold different formats ({shown}); give every split the same columns")
    if formats:
        fmt = next(iter(formats.values()))
    else:  # prompts only (--do_predict): the format the prompts have
        test = splits["test"]
        messages = "messages" in test.column_names or isinstance(test[0]["prompt"], list)
        fmt = "conversational" if messages else "standard"
    return PreferenceTask(fmt, sources=sources), splits


def test_prompts(split: Dataset, source: str) -> Dataset:
    """A --test_file's prompts as causal_lm.generation.encode_prompts takes them: a file with `prompt` (or
    `messages`) columns as it is, checked as SFT checks one; one of implicit pairs (`chosen` and
    `rejected` alone) as a `prompt` column of their shared starts (and their `tools`)."""
    columns = split.column_names
    if "prompt" in columns or "messages" in columns or not all(c in columns for c in ("chosen", "rejected")):
        check_prompts(split, source)  # refuses a file with no prompt, naming its columns
        return split
    fmt = detect_format(columns, source, split[0])
    check_pairs(split, fmt, source)
    prompts = {"prompt": [explicit_pair(row, fmt)[0] for row in split]}
    if "tools" in columns:
        prompts["tools"] = split["tools"]
    return Dataset.from_dict(prompts)


def encode_pairs(task: PreferenceTask, splits: dict, tokenizer, config, accelerator) -> dict[str, Dataset]:
    """Collective (the main process encodes first, the others read datasets' cache): per kept pair of the
    train and validation splits, `chosen_input_ids`, `chosen_labels`, `rejected_input_ids`,
    `rejected_labels` (the prompt then the completion; -100 but at the completion's targets), their
    `chosen_targets` and `rejected_targets` counts, `row` (the pair's number in its split) and `length`
    (the longer sequence's). Dropped pairs are counted in `task.counts`. The test split is passed through
    for causal_lm.generation.encode_prompts."""
    # The special ids too: completions end with the EOS id, which tokenizer_state (the Rust side) leaves out.
    specials = (
        tokenizer.eos_token_id,
        tokenizer.bos_token_id,
        tokenizer.pad_token_id,
        tokenizer.all_special_ids,
    )
    decides = (task.format, config.max_length, tokenizer_state(tokenizer), tokenizer.chat_template, specials)
    if task.format.endswith("conversational") and not end_of_turn(tokenizer):
        task.notes.append(
            "note: the chat template closes an assistant turn with no special token (an end-of-turn or "
            "EOS), so no target teaches the model to stop; give --chat_template FILE.jinja with one"
        )
    appended = appended_tokens(tokenizer)  # once, not per row

    def encode(batch, rows, source, structs):
        encoded = {column: [] for column in COLUMNS}
        for i, number in enumerate(rows):
            row = unpadded({column: values[i] for column, values in batch.items()}, structs)
            pair, dropped = _encoded(row, number, source, tokenizer, config.max_length, appended, task.format)
            for side in SIDES:
                encoded[f"{side}_input_ids"].append(getattr(pair, side).input_ids if pair else [])
                encoded[f"{side}_labels"].append(getattr(pair, side).labels if pair else [])
                encoded[f"{side}_targets"].append(getattr(pair, side).targets if pair else 0)
            ids = (pair.chosen.input_ids, pair.rejected.input_ids) if pair else ([], [])
            encoded["length"].append(max(map(len, ids)))
            encoded["row"].append(number)
            encoded["truncated"].append(bool(pair and pair.truncated))
            encoded["dropped"].append(dropped)
        return encoded

    encoded = {}
    with accelerator.main_process_first():
        for name, split in splits.items():
            if name == "test":
                encoded[name] = split
                continue
            encoded[name] = split.map(
                encode,
                batched=True,
                with_indices=True,
                fn_kwargs={"source": task.sources.get(name, name), "structs": struct_columns(split.features)},
                remove_columns=split.column_names,
                features=COLUMNS,
                desc=f"encode {name}",
                new_fingerprint=_key(split, name, decides),
            )
    # Out of main_process_first, as SFT's: a refusal there would leave the other ranks at its barrier.
    return {
        name: split if name == "test" else _kept(split, name, task, config) for name, split in encoded.items()
    }


def _encoded(row: dict, number: int, source: str, tokenizer, max_length: int, appended, fmt: str):
    """(the pair, "") or (None, why it is dropped: a DROPS key)."""
    if without_nulls(row["chosen"]) == without_nulls(row["rejected"]):  # Arrow's padding aside (formats.py)
        return None, "identical"
    prompt, chosen, rejected = explicit_pair(row, fmt)
    if not chosen or not rejected:  # an implicit pair one of whose texts is all of the other's start
        return None, "no_completion"
    pair = encode_pair(
        prompt, chosen, rejected, row.get("tools"), tokenizer, max_length=max_length, row_number=number,
        source=source, appended=appended,
    )  # fmt: skip
    if not (pair.chosen.targets and pair.rejected.targets):
        return None, "no_completion"
    if pair.chosen.input_ids == pair.rejected.input_ids:  # they differ only past max_length
        return None, "identical_within_max_length"
    return pair, ""


def _kept(split: Dataset, name: str, task: PreferenceTask, config) -> Dataset:
    """The split's kept pairs; what was dropped and truncated counted in `task.counts`."""
    source = task.sources.get(name, name)
    dropped = split["dropped"]
    kept = split.filter(lambda why: not why, input_columns="dropped", desc=f"pairs {name}")
    if len(kept) == 0:
        reasons = ", ".join(f"{dropped.count(key):,} {why}" for key, why in DROPS.items() if key in dropped)
        raise ConfigError(
            f"{source}: no pair is left to train on ({reasons}; --max_length {config.max_length}); "
            "give pairs whose chosen and rejected completions differ within --max_length",
            fix="give pairs whose chosen and rejected completions differ within --max_length",
        )
    counts = {"rows": len(split), "pairs": len(kept), "truncated": sum(kept["truncated"])}
    task.counts[name] = counts | {key: dropped.count(key) for key in DROPS}
    return kept.remove_columns(["truncated", "dropped"])


def _key(split: Dataset, name: str, decides: tuple) -> str:
    """datasets' cache key for one split's encoding: its rows, what decides the tokens, and the code."""
    parts = (split._fingerprint, name, decides, _code_digest())
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


@functools.cache
def _code_digest() -> str:
    here = Path(__file__).parent  # these modules, and the SFT family's that encode a completion
    modules = [here / name for name in ("data.py", "formats.py", "pairs.py")]
    modules += [here.parent / "causal_lm" / name for name in ("rows.py", "conversations.py", "headers.py")]
    return hashlib.sha256(b"".join(module.read_bytes() for module in modules)).hexdigest()

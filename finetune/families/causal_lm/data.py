"""A causal-LM run's rows: read (local files or --dataset_name), checked, and encoded as token ids with
their targets (finetune/families/causal_lm/conversations.py); rows truncated to --max_length are
counted, and rows left with no target token dropped and counted, on the task line."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from datasets import Dataset

from finetune.data.sources import load_data_file, load_dataset_splits
from finetune.data.tokenization import tokenizer_state
from finetune.errors import ConfigError
from finetune.families.causal_lm.conversations import (
    IGNORE,
    appended_tokens,
    assistant_turns,
    encode_examples,
    end_of_turn,
)
from finetune.families.causal_lm.generation import check_prompts
from finetune.families.causal_lm.rows import check_rows, detect_format, refusal, struct_columns, unpadded

FORMAT_WORDS = {
    "messages": "conversations (messages)",
    "prompt_completion": "prompt-completion pairs",
    "conversational_prompt_completion": "conversational prompt-completion pairs",
    "text": "plain text",
}


@dataclass(frozen=True)
class LmTask:
    """What a causal-LM run learns: the format its rows hold and what in them is trained."""

    format: str
    """messages, prompt_completion, conversational_prompt_completion or text (detected from the columns)."""
    trained_on: str
    """Which tokens are targets, as the task line says it."""
    name: str = "causal_lm"
    metrics: tuple[str, ...] = ("perplexity",)
    """Besides eval_loss (the mean cross-entropy per target token): exp(eval_loss), and with
    --predict_with_generate the generated answers' exact_match."""
    validation_splits: tuple[str, ...] = ("validation",)
    counts: dict = field(default_factory=dict)
    """Per split, filled by `encode_splits`: rows kept, truncated, dropped (no target token left); with
    --packing, the training split's packs, their capacity and fill."""
    notes: list[str] = field(default_factory=list)
    """What the user should know about the targets, filled by `encode_splits` (the task line's end)."""

    def metric_keys(self, per_class: bool = True) -> list[str]:
        return [f"eval_{metric}" for metric in self.metrics]

    def summary(self) -> str:
        """The run's task line: the format, what is trained, and each split's rows as encoded."""
        splits = "; ".join(f"{name} {c['rows']:,} rows{_notes(c)}" for name, c in self.counts.items())
        notes = "".join(f"; {note}" for note in self.notes)
        return f"task: causal_lm, {FORMAT_WORDS[self.format]}, loss on {self.trained_on}; {splits}{notes}"


def _notes(counts: dict) -> str:
    notes = [f"{counts['truncated']:,} truncated to --max_length"] if counts["truncated"] else []
    notes += [f"{counts['dropped']:,} left with no target dropped"] if counts["dropped"] else []
    packed = ""
    if "packs" in counts:  # --packing's training split
        packed = (
            f", packed into {counts['packs']:,} sequences of up to {counts['capacity']:,} tokens, "
            f"{counts['fill']:.0%} filled"
        )
    return (f" ({', '.join(notes)})" if notes else "") + packed


def read_raw_splits(config) -> tuple[dict[str, Dataset], dict[str, str]]:
    """The splits the run needs (train, validation, test), as read from the files or --dataset_name, and
    where each came from (for messages). Shared with the DPO family (dpo/data.py)."""
    wanted = {
        "train": config.do_train or config.carves_validation,
        "validation": not config.carves_validation and (config.evaluates_training or not config.do_train),
        "test": config.do_predict,
    }
    if config.uses_local_files:
        files = {"train": config.train_file, "validation": config.validation_file, "test": config.test_file}
        sources = {name: path for name, path in files.items() if path and wanted[name]}
        splits = {name: load_data_file(path, ()) for name, path in sources.items()}
    else:
        splits, sources = load_dataset_splits(config, None, wanted, (), labelled=False)
    return splits, sources


def carved_and_limited(splits: dict[str, Dataset], config, sources: dict[str, str]) -> dict[str, Dataset]:
    """The checked splits with --validation_split_percentage's validation rows carved from training, and
    --max_train_samples / --max_eval_samples applied (the first rows kept)."""
    if config.carves_validation:
        splits["train"], splits["validation"] = _carve_validation(splits["train"], config, sources["train"])
    for name, limit in (("train", config.max_train_samples), ("validation", config.max_eval_samples)):
        if name in splits and limit is not None and limit < len(splits[name]):
            splits[name] = splits[name].select(range(limit))
    return splits


def load_lm_splits(config) -> tuple[LmTask, dict[str, Dataset]]:
    """The task and its raw splits (train, validation, test as the run needs them), checked row by row."""
    splits, sources = read_raw_splits(config)
    formats = {}
    for name, split in splits.items():
        if name == "test":  # prompts to complete, with no completion to train on
            formats[name] = check_prompts(split, sources[name])
            continue
        fmt = detect_format(split.column_names, sources[name], split[0] if len(split) else None)
        check_rows(split, fmt, sources[name])
        formats[name] = _conversational(fmt, split)
        check_assistant_turns(split, formats[name], config, sources[name])
    if config.carves_validation:
        formats["validation"] = formats["train"]
    splits = carved_and_limited(splits, config, sources)
    trained = {n: f for n, f in formats.items() if n != "test"}
    if len(set(trained.values())) > 1:
        shown = ", ".join(f"{sources[n]}: {FORMAT_WORDS[f]}" for n, f in trained.items())
        raise ConfigError(f"the splits hold different formats ({shown}); give every split the same columns")
    fmt = next(iter(trained.values()), next(iter(formats.values())))
    metrics = ("perplexity", "exact_match") if config.predict_with_generate else ("perplexity",)
    return LmTask(fmt, _trained_on(fmt, config), metrics=metrics), splits


def check_assistant_turns(split: Dataset, fmt: str, config, source: str) -> None:
    """Every conversation's assistant turns to train on, as encoding will find them, looked for while the
    rows are read: a chat file without one is refused in a second, not after the model's loading."""
    if not config.assistant_only_loss or fmt not in ("messages", "conversational_prompt_completion"):
        return
    columns = ["messages"] if fmt == "messages" else ["prompt", "completion"]
    for number, row in enumerate(split.select_columns(columns)):
        messages, prompt_turns = row.get("messages"), None
        if fmt != "messages":  # the prompt's turns are context, never targets (conversations.py)
            messages = row["prompt"] + row["completion"]
            prompt_turns = len(row["prompt"]) if config.completion_only_loss else None
        assistant_turns(messages, prompt_turns, functools.partial(refusal, source, number))


def _carve_validation(train: Dataset, config, source: str) -> tuple[Dataset, Dataset]:
    """--validation_split_percentage of the training rows, drawn with --seed (every rank the same)."""
    held = round(len(train) * config.validation_split_percentage / 100)
    if not 0 < held < len(train):
        raise ConfigError(
            f"--validation_split_percentage {config.validation_split_percentage} of the {len(train)} rows of "
            f"{source} leaves no validation or no training rows; change it"
        )
    order = np.random.default_rng(config.seed).permutation(len(train))
    return train.select(sorted(order[held:].tolist())), train.select(sorted(order[:held].tolist()))


def _conversational(fmt: str, split: Dataset) -> str:
    """TRL's conversational prompt-completion: prompt and completion cells that are message lists."""
    if fmt == "prompt_completion" and len(split) and isinstance(split[0]["prompt"], list):
        return "conversational_prompt_completion"
    return fmt


def _trained_on(fmt: str, config) -> str:
    """The targets, as conversations.encode_examples picks them from both flags (task line, card)."""
    if fmt == "text":
        return "every token"
    if fmt == "prompt_completion":
        return "the completion and its EOS" if config.completion_only_loss else "every token"
    template = f"chat template {config.chat_template}" if config.chat_template else "the tokenizer's template"
    completion = fmt.startswith("conversational") and config.completion_only_loss
    if config.assistant_only_loss:
        where = "the completion's assistant turns" if completion else "assistant turns"
        return f"{where} through their end-of-turn token ({template})"
    if completion:
        return f"the completion, every token after the generation prompt ({template})"
    return f"every token ({template})"


def encode_splits(task: LmTask, splits: dict, tokenizer, config, accelerator) -> dict[str, Dataset]:
    """Collective (rank 0 encodes first, the others read datasets' cache): `input_ids`, `labels` (-100
    where a token is no target; not shifted), `length`; test rows carry their `row` number. Training and
    validation rows left with no target after truncation are dropped: counted in `task.counts`."""
    fmt = "prompt_completion" if task.format == "conversational_prompt_completion" else task.format
    options = {
        "max_length": config.max_length,
        "completion_only_loss": config.completion_only_loss,
        "assistant_only_loss": config.assistant_only_loss,
    }
    # The special ids too: rows end with the EOS id, which tokenizer_state (the Rust side) leaves out.
    specials = (
        tokenizer.eos_token_id,
        tokenizer.bos_token_id,
        tokenizer.pad_token_id,
        tokenizer.all_special_ids,
    )
    decides = (fmt, options, tokenizer_state(tokenizer), tokenizer.chat_template, specials)
    if task.format in ("messages", "conversational_prompt_completion") and not end_of_turn(tokenizer):
        task.notes.append(
            "note: the chat template closes an assistant turn with no special token (an end-of-turn or "
            "EOS), so no target teaches the model to stop; give --chat_template FILE.jinja with one"
        )

    appended = appended_tokens(tokenizer)  # once, not per row

    def encode(batch, rows, source, structs):
        columns = ("input_ids", "labels", "length", "truncated", "targets", "row", "turns")
        encoded = {column: [] for column in columns}
        for i, row_number in enumerate(rows):
            row = unpadded({column: values[i] for column, values in batch.items()}, structs)
            examples = encode_examples(
                row, fmt, tokenizer, **options, row_number=row_number, source=source, appended=appended
            )
            for done in examples:  # one, or a turn-by-turn conversation's turns
                encoded["input_ids"].append(done.input_ids)
                encoded["labels"].append(done.labels)
                encoded["length"].append(len(done.input_ids))
                encoded["truncated"].append(done.truncated)
                # Predicted targets: the first token has nothing before it, so it never counts.
                encoded["targets"].append(sum(label != IGNORE for label in done.labels[1:]))
                encoded["row"].append(row_number)
                encoded["turns"].append(len(examples))
        return encoded

    encoded = {}
    with accelerator.main_process_first():
        for name, split in splits.items():
            source = source_of(config, name)
            encoded[name] = split.map(
                encode,
                batched=True,
                with_indices=True,
                fn_kwargs={"source": source, "structs": struct_columns(split.features)},
                remove_columns=split.column_names,
                desc=f"encode {name}",
                new_fingerprint=_key(split, name, decides),
            )
    for name, split in encoded.items():
        truncated = sum(split["truncated"])
        turns = [(row, n) for row, n in zip(split["row"], split["turns"], strict=True) if n > 1]
        if turns:
            task.notes.append(
                f"{name}: {len(set(turns)):,} conversations trained turn by turn ({len(turns):,} examples, "
                "each assistant turn on the conversation up to it: the chat template renders answered "
                "turns otherwise, e.g. without their reasoning)"
            )
        split = split.remove_columns("turns")
        if name != "test":
            kept = split.filter(lambda targets: targets > 0, input_columns="targets", desc=f"targets {name}")
            if len(kept) == 0:
                raise ConfigError(
                    f"{source_of(config, name)}: no row has a target token left within --max_length "
                    f"{config.max_length}; raise --max_length"
                )
            task.counts[name] = {"rows": len(kept), "truncated": truncated, "dropped": len(split) - len(kept)}
            split = kept.remove_columns("row")  # only predictions need their row back
        else:
            task.counts[name] = {"rows": len(split), "truncated": truncated, "dropped": 0}
        encoded[name] = split
    return encoded


def source_of(config, split: str) -> str:
    files = {"train": config.train_file, "validation": config.validation_file, "test": config.test_file}
    return files.get(split) or f"{config.dataset_name}:{split}"


def _key(split: Dataset, name: str, decides: tuple) -> str:
    """datasets' cache key for one split's encoding: its rows, what decides the tokens, and the code."""
    parts = (split._fingerprint, name, decides, _code_digest())
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


@functools.cache
def _code_digest() -> str:
    here = Path(__file__)  # this module and what it calls to encode
    modules = ("data.py", "rows.py", "conversations.py", "headers.py")
    code = b"".join(here.with_name(name).read_bytes() for name in modules)
    return hashlib.sha256(code).hexdigest()

"""Generation for causal-LM runs: greedy completions of prompts, batched and left-padded, each row once on
any number of processes: the validation rows' at each evaluation, against their references as
eval_exact_match (--predict_with_generate), and --test_file's as predictions.jsonl (--do_predict). Both decode
by the model's generation config, which the export writes as generation_config.json, so that
`pipeline("text-generation")` answers as predictions.jsonl does.

A row's prompt (and reference): a conversation's messages before its last assistant turn, with the chat
template's generation prompt (that turn's content); a test conversation that does not end with an
assistant turn is the prompt whole, one that does has that turn generated anew (so --test_file may be the
validation file). A string prompt, tokenized as training does (the completion); a prompt of messages, with
the generation prompt (the completion's first assistant message). A prompt of more than --max_length
tokens keeps its last --max_length."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from accelerate.utils import DistributedType
from torch.utils.data import DataLoader, Dataset
from transformers import GenerationConfig

from finetune.config.resolved import eval_batch_size
from finetune.data.batching import bucket, resolve_pad_to_multiple_of
from finetune.errors import ConfigError
from finetune.families.causal_lm.conversations import (
    TEMPLATE_FIX,
    appended_tokens,
    end_of_turn,
    refuse_unwritten_tools,
    render_chat,
    row_tools,
)
from finetune.families.causal_lm.headers import refuse_trained_header
from finetune.families.causal_lm.rows import (
    check_messages,
    check_rows,
    check_string,
    refusal,
    struct_columns,
    unpadded,
)
from finetune.training.evaluation import EvaluationAbandoned, progress, without_autocast

FLAG = "--predict_with_generate"
PROMPTS = "_prompts"
"""Appended to an evaluation split's name for its prompts' split and loader (`validation_prompts`)."""
PROMPT_FIX = "give each row a `messages` list (the conversation so far) or a `prompt`"


def check_generation(config, task, splits: dict) -> None:
    """--predict_with_generate's refusals once the rows are read: it compares with references, which
    plain text has none of, at evaluations, which a run without validation rows has none of."""
    if not config.predict_with_generate:
        return
    if task.format == "text":  # the flag and the fix read from the message (ConfigError)
        raise ConfigError(
            f"{FLAG} compares generated completions with references, and plain-text rows (a `text` column) "
            f"have none; drop {FLAG}, or give rows with `messages`, or `prompt` and `completion`"
        )
    if "validation" not in splits:
        raise ConfigError(
            f"{FLAG} generates at each evaluation, and this run has none; give --validation_file (and "
            f"--eval_strategy steps or epoch), or drop {FLAG}"
        )


def check_prompts(split, source: str) -> str:
    """The format of a file of prompts to complete (--test_file): `messages` before `prompt` (strings, or
    lists of messages: the file's first row decides, as for training); every row checked, the first bad one
    refused naming it. Returns the format's name as the task line writes it (data.FORMAT_WORDS)."""
    fmt = _test_format(split)
    if fmt is None:
        columns = ", ".join(split.column_names) or "none"
        message = f"{source} has no prompt to complete (its columns: {columns}); {PROMPT_FIX}"
        raise ConfigError(message, flag="--test_file", fix=PROMPT_FIX)
    if fmt == "messages":
        check_rows(split, "messages", source)
    else:
        check = check_messages if fmt == "conversational_prompt_completion" else check_string
        for number, prompt in enumerate(split["prompt"]):
            check(prompt, "prompt", number, source)
    return fmt


def _test_format(split) -> str | None:
    """A prompt file's format by its columns and first row; None without a prompt column."""
    if "messages" in split.column_names:
        return "messages"
    if "prompt" not in split.column_names:
        return None
    first = split[0]["prompt"] if len(split) else None
    return "conversational_prompt_completion" if isinstance(first, list) else "prompt_completion"


def prepare_generation(model, tokenizer, config) -> None:
    """The model's decoding, set before training so that every export writes it (save_pretrained writes
    `model.generation_config` as generation_config.json) and this run's generations use the same one:
    greedy, with the key/value cache, at most --generation_max_new_tokens, stopping at the EOS or the
    chat template's end-of-turn token, padding with the pad token. The checkpoint's own sampling
    settings are not kept: greedy is what evaluation and predictions measure."""
    positions = getattr(model.config, "max_position_embeddings", None)
    room = config.max_length + config.generation_max_new_tokens
    if (config.predict_with_generate or config.do_predict) and positions is not None and room > positions:
        raise ConfigError(
            f"--max_length {config.max_length} plus --generation_max_new_tokens "
            f"{config.generation_max_new_tokens} exceed the model's {positions} positions; lower either"
        )
    before = getattr(model, "generation_config", None)
    stops = [tokenizer.eos_token_id, *end_of_turn(tokenizer), *_ids(getattr(before, "eos_token_id", None))]
    stops = list(dict.fromkeys(stops))
    bos = getattr(before, "bos_token_id", None)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id if bos is None else bos,
        eos_token_id=stops if len(stops) > 1 else stops[0],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
        num_beams=1,
        use_cache=True,
        max_new_tokens=config.generation_max_new_tokens,
    )


def _ids(value) -> list[int]:
    return [] if value is None else [value] if isinstance(value, int) else list(value)


@dataclass
class Prompts(Dataset):
    """A split's prompts as token ids with their row numbers (in the file, from 0), the references of an
    evaluation split, and the tokenizer that reads the generated tokens back."""

    rows: list[dict]
    references: list[str | None]
    tokenizer: object
    truncated: int
    """How many prompts kept only their last --max_length tokens."""

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return self.rows[index]


def encode_prompts(task, splits: dict, tokenizer, config, sources: dict) -> dict[str, Prompts]:
    """The prompt splits: `test` (--do_predict) and `validation_prompts` (--predict_with_generate), each
    row's prompt encoded as the module docstring says; a row that gives no prompt is refused, naming it.
    The test split's rows are counted on the task line."""
    encoded = {}
    if "test" in splits:  # checked by check_prompts as the rows were read
        fmt = _test_format(splits["test"])
        test = _encode(splits["test"], fmt, tokenizer, config.max_length, sources["test"], False)
        encoded["test"] = test
        task.counts["test"] = {"rows": len(test), "truncated": test.truncated, "dropped": 0}
    if config.predict_with_generate and "validation" in splits:
        source = sources["validation"]
        encoded["validation" + PROMPTS] = _encode(
            splits["validation"], task.format, tokenizer, config.max_length, source, True
        )
    return encoded


def _encode(split, fmt: str, tokenizer, max_length: int, source: str, references: bool) -> Prompts:
    rows, refs, truncated, appended = [], [], 0, appended_tokens(tokenizer)
    structs = struct_columns(split.features)
    for number, row in enumerate(split):
        row = unpadded(row, structs)
        refuse = functools.partial(refusal, source, number)  # (what, fix): the row's one-line error
        if fmt == "prompt_completion":  # as training tokenizes a prompt: with the tokenizer's BOS, no EOS
            ids, reference = tokenizer(row["prompt"])["input_ids"], row.get("completion")
            ids = ids[: len(ids) - len(appended)]
        else:
            messages, reference = _prompt_messages(row, fmt, references, refuse)
            text = _render(messages, tokenizer, refuse, row_tools(row, refuse))
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise refuse("has an empty prompt, nothing to generate from", "give it a prompt, or drop the row")
        truncated += len(ids) > max_length
        rows.append({"input_ids": ids[-max_length:], "row": number})
        refs.append(reference if references else None)
    return Prompts(rows, refs, tokenizer, truncated)


def _prompt_messages(row: dict, fmt: str, evaluated: bool, refuse) -> tuple[list[dict], str | None]:
    """A conversation's prompt messages and, for evaluation, its reference (see the module docstring)."""
    if fmt == "conversational_prompt_completion":
        completion = row.get("completion") or []
        replies = [m["content"] for m in completion if m.get("role") == "assistant"]
        if evaluated and not replies:
            what = "has no assistant message in its completion to compare with"
            raise refuse(what, f"add one, or drop {FLAG}")
        return row["prompt"], replies[0] if replies else None
    messages = row["messages"]
    if evaluated:
        # The last turn trained on: one of weight 0 is context the model was not taught to write.
        targets = (i for i, m in enumerate(messages) if m["role"] == "assistant" and m.get("weight") != 0)
        last = max(targets, default=None)
        if last is None:
            raise refuse("has no assistant turn to compare with", f"add one, or drop {FLAG}")
    else:
        last = len(messages) - 1 if messages[-1]["role"] == "assistant" else len(messages)
    if last == 0:
        raise refuse("has no message before the assistant turn to generate", "begin it with a user turn")
    return messages[:last], messages[last]["content"] if last < len(messages) else None


def _render(messages: list[dict], tokenizer, refuse, tools: list | None) -> str:
    """The messages with the generation prompt, by the chat template (null fields dropped, and the row's
    tools, as training's)."""
    if not getattr(tokenizer, "chat_template", None):
        raise refuse("is a conversation, but the tokenizer has no chat template", TEMPLATE_FIX)
    rendered = render_chat(tokenizer, messages, tools, True, refuse, fix=TEMPLATE_FIX)
    refuse_unwritten_tools(tokenizer, messages, tools, rendered, True, refuse)  # as training refuses them
    reply = {"role": "assistant", "content": "-"}  # a placeholder: the header is what it is written after
    refuse_trained_header(tokenizer, [*messages, reply], len(messages), tools, refuse, trains=False)
    return rendered


def left_padded(features: list[dict], pad_token_id: int, multiple: int = 1) -> dict[str, torch.Tensor]:
    """Prompts padded on the left to the longest rounded up to `multiple`, so that every row's generation
    starts at the batch's last column; `row`: each row's number."""
    width = bucket(max(len(f["input_ids"]) for f in features), multiple, None)
    input_ids = torch.full((len(features), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(features), width), dtype=torch.long)
    for i, feature in enumerate(features):
        input_ids[i, width - len(feature["input_ids"]) :] = torch.tensor(feature["input_ids"])
        mask[i, width - len(feature["input_ids"]) :] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "row": torch.tensor([f["row"] for f in features])}


def prompt_loaders(prompts: dict[str, Prompts], pad_token_id: int, config, on_gpu: bool) -> dict:
    """One loader per prompt split, sorted by length (little padding; rows carry their numbers back)."""
    multiple = int(resolve_pad_to_multiple_of(config.pad_to_multiple_of, on_gpu))
    loaders = {}
    for name, split in prompts.items():
        lengths = [len(row["input_ids"]) for row in split.rows]
        loaders[name] = DataLoader(
            split,
            batch_size=eval_batch_size(config, "cuda" if on_gpu else "cpu"),
            sampler=sorted(range(len(lengths)), key=lengths.__getitem__),
            collate_fn=functools.partial(left_padded, pad_token_id=pad_token_id, multiple=multiple),
            pin_memory=on_gpu,
            # Starting an iteration draws a seed: from its own generator, not the global RNG dropout uses,
            # so an evaluation (or one abandoned and redone on resume) leaves training as it was.
            generator=torch.Generator().manual_seed(config.seed),
        )
    return loaders


def generate(accelerator, model, loader, should_stop=None, desc: str = "generate") -> list[str]:
    """Collective: the completion of every row of `loader`'s prompts, in row order. Each rank generates its
    shard greedily by the model's generation config; the new tokens, padded to --generation_max_new_tokens,
    are gathered with their row numbers (gather_for_metrics drops the rows Accelerate repeats to even the
    shards), then cut at the first EOS or end-of-turn token and decoded without special tokens.
    `should_stop` is asked before every batch, as evaluation asks it."""
    model = accelerator.unwrap_model(model, keep_torch_compile=False)
    config = model.generation_config
    # FSDP gathers each layer's weights per forward: every rank must take as many steps.
    synced = accelerator.distributed_type == DistributedType.FSDP and accelerator.num_processes > 1
    model.eval()
    rows, tokens = [], []
    with torch.no_grad(), without_autocast(model), progress(accelerator, loader, desc) as batches:
        for batch in batches:
            if should_stop is not None and should_stop():  # every rank, at the same batch
                model.train()
                raise EvaluationAbandoned
            prompt = batch["input_ids"]
            out = model.generate(input_ids=prompt, attention_mask=batch["attention_mask"], synced_gpus=synced)
            new = out[:, prompt.shape[1] :]
            new = F.pad(new, (0, config.max_new_tokens - new.shape[1]), value=config.pad_token_id)
            row, new = accelerator.gather_for_metrics((batch["row"], new))
            rows.append(row)
            tokens.append(new)
    model.train()
    rows, tokens = torch.cat(rows).cpu(), torch.cat(tokens).cpu()
    order = rows.argsort()
    if not torch.equal(rows[order], torch.arange(len(loader.dataset))):
        raise RuntimeError(f"generated {len(rows)} rows ({rows.unique().numel()}) of {len(loader.dataset)}")
    stops, tokenizer = set(_ids(config.eos_token_id)), loader.dataset.tokenizer
    completions = []
    for ids in tokens[order].tolist():
        end = next((i for i, token in enumerate(ids) if token in stops), len(ids))
        completions.append(tokenizer.decode(ids[:end], skip_special_tokens=True))
    return completions


def exact_match(completions: list[str], references: list[str]) -> float:
    """The share of completions equal to their reference, both stripped and case-folded."""
    pairs = zip(completions, references, strict=True)
    same = [completion.strip().casefold() == reference.strip().casefold() for completion, reference in pairs]
    return sum(same) / max(len(same), 1)


def with_exact_match(evaluate, accelerator):
    """`evaluate` (the family's loss over the scored splits), and each split's eval_exact_match."""

    def evaluated(model, eval_loaders: dict, should_stop=None) -> dict:
        """Collective: the loss's metrics, then each split's completions against their references."""
        scored = {name: loader for name, loader in eval_loaders.items() if not name.endswith(PROMPTS)}
        results = evaluate(model, scored, should_stop)
        for name, loader in eval_loaders.items():
            if name.endswith(PROMPTS):
                split = name.removesuffix(PROMPTS)
                prefix = "eval" if split == "validation" else f"eval_{split}"
                completions = generate(accelerator, model, loader, should_stop)
                results[f"{prefix}_exact_match"] = exact_match(completions, loader.dataset.references)
        return results

    return evaluated


def predict_completions(accelerator, model, loader) -> list[dict]:
    """Collective: predictions.jsonl's lines, {"row", "completion"}, in input order."""
    completions = generate(accelerator, model, loader, desc="predict")  # every row once, checked
    return [{"row": row, "completion": completion} for row, completion in enumerate(completions)]

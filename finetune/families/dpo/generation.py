"""A DPO run's generation, by the SFT family's code (causal_lm/generation.py): --do_predict completes
--test_file's prompts (data.py `test_prompts` reads them, pairs' shared starts too), and
--predict_with_generate completes each validation pair's prompt at every evaluation, compared with its
chosen completion as eval_exact_match (a conversational pair's: its first assistant message), as SFT
compares a row's with its reference."""

from __future__ import annotations

from types import SimpleNamespace

from datasets import Dataset

from finetune.families.causal_lm.generation import encode_prompts
from finetune.families.causal_lm.rows import struct_columns, unpadded
from finetune.families.dpo.formats import explicit_pair


def prompt_splits(task, splits: dict, tokenizer, config) -> dict:
    """The prompt splits generation reads: `test` (--do_predict) and `validation_prompts`
    (--predict_with_generate, the validation pairs' prompts and chosen completions), encoded as SFT
    encodes its prompts; the test prompts counted on the task line."""
    wanted = {"test": splits["test"]} if "test" in splits else {}
    if config.predict_with_generate and "validation" in splits:
        wanted["validation"] = chosen_completions(splits["validation"], task.format)
    conversational = task.format.endswith("conversational")
    # SFT's format names for the same rows: a pair's prompt and chosen completion are SFT's prompt and
    # completion. The counts are the task's own, so the test prompts land on its task line.
    as_sft = SimpleNamespace(
        format="conversational_prompt_completion" if conversational else "prompt_completion",
        counts=task.counts,
    )
    return encode_prompts(as_sft, wanted, tokenizer, config, task.sources)


def chosen_completions(split: Dataset, fmt: str) -> Dataset:
    """Each checked pair as SFT's prompt and completion (the chosen one), its tools kept."""
    structs = struct_columns(split.features)
    rows = []
    for row in split:
        row = unpadded(row, structs)  # Arrow's padding nulls, which a template would render
        prompt, chosen, _ = explicit_pair(row, fmt)
        tools = {"tools": row["tools"]} if "tools" in row else {}
        rows.append({"prompt": prompt, "completion": chosen, **tools})
    return Dataset.from_list(rows)

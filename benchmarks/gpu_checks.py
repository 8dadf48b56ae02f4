"""Issue #35's CUDA-only numerics, in seconds: on fresh random batches of real MNLI pairs, BERT-base's
shape (random weights, dropout off so both sides compute the same function),

- `--padding_free varlen` (torch's varlen kernel on packed real tokens, bf16 or fp16 only) against the
  padded model in bf16 autocast and against a float64 reference: the logits and every parameter's gradient;
- bf16 autocast and TF32 against a float64 reference of the padded model: logits, loss and gradients.

Each figure is ||x - reference|| / ||reference|| (for gradients the largest over parameters, and the norm
over all of them). From the repository root, after benchmarks/gpu_setup.sh:

    python3 benchmarks/gpu_checks.py MODEL_DIR MNLI_DIR OUT_JSON
"""

from __future__ import annotations

import json
import random
import sys
from contextlib import nullcontext
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

sys.path.insert(0, ".")
from finetune.data.batching import PadCollator, VarlenCollator  # noqa: E402
from finetune.speed.attention import use_sync_free_masks, use_varlen_attention  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: a smoke test of the script only


def main(model_dir: str, data_dir: str, out_json: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with open(f"{data_dir}/validation_matched.jsonl") as lines:
        rows = [json.loads(line) for line in lines]
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    results = {"device": device, "torch": torch.__version__, "batches": []}
    for seed in (1, 2, 3):  # fresh rows and fresh weights each time
        random.seed(seed)
        picked = random.sample(rows, 64)
        encoded = tokenizer([r["premise"] for r in picked], [r["hypothesis"] for r in picked],
                            truncation=True, max_length=128)  # fmt: skip
        columns = ("input_ids", "token_type_ids", "attention_mask")  # the toolkit's tokenized columns
        features = [
            {**{c: encoded[c][i] for c in columns}, "labels": r["label"]} for i, r in enumerate(picked)
        ]
        padded = PadCollator(tokenizer, 8, 128)(features)
        packed = VarlenCollator(tokenizer, 32, 128)(features)
        reference = run(model_dir, padded, seed, torch.float64, varlen=False)
        fp32 = run(model_dir, padded, seed, torch.float32, varlen=False)
        entry = {
            "seed": seed,
            "tf32_vs_fp64": compare(fp32, reference),
            "bf16_vs_fp64": compare(run(model_dir, padded, seed, torch.float32, False, bf16=True), reference),
            # torch's CUDA varlen kernel takes bf16/fp16 only: compared in bf16, against the padded model in
            # bf16 and against the float64 reference (on CPU the reference kernel runs fp32 too).
            "varlen_bf16_vs_padded_bf16": compare(
                run(model_dir, packed, seed, torch.float32, True, bf16=True),
                run(model_dir, padded, seed, torch.float32, False, bf16=True),
            ),
            "varlen_bf16_vs_fp64": compare(
                run(model_dir, packed, seed, torch.float32, True, bf16=True), reference
            ),
        }
        results["batches"].append(entry)
        print(json.dumps(entry), flush=True)
    Path(out_json).write_text(json.dumps(results, indent=2))


def run(model_dir, batch, seed, dtype, varlen, bf16=False) -> dict:
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=3)
    torch.manual_seed(seed)
    with torch.no_grad():  # fresh weights per seed (drawn in fp32 whatever the dtype): any valid input
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    model = model.to(DEVICE, dtype)
    (use_varlen_attention if varlen else use_sync_free_masks)(model)
    model.eval()  # no dropout: both sides compute the same function
    batch = {k: v.to(DEVICE) if torch.is_tensor(v) else v for k, v in batch.items()}
    labels = batch.pop("labels")
    with torch.autocast(DEVICE, dtype=torch.bfloat16) if bf16 else nullcontext():
        logits = model(**batch).logits
    loss = torch.nn.functional.cross_entropy(logits.double(), labels)
    loss.backward()
    grads = {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}
    return {"logits": logits.double().detach(), "loss": loss.detach(), "grads": grads}


def compare(got: dict, reference: dict) -> dict:
    def rel(a, b):
        return float((a - b).norm() / b.norm().clamp_min(1e-30))

    # Parameters whose true gradient is zero (attention keys' biases: softmax ignores a constant) only
    # show rounding: left out.
    largest = max(g.norm() for g in reference["grads"].values())
    kept = [n for n, g in reference["grads"].items() if g.norm() > 1e-6 * largest]
    per_parameter = {n: rel(got["grads"][n], reference["grads"][n]) for n in kept}
    everything = rel(
        torch.cat([got["grads"][n].flatten() for n in per_parameter]),
        torch.cat([reference["grads"][n].flatten() for n in per_parameter]),
    )
    worst = max(per_parameter, key=per_parameter.get)
    return {
        "logits": figure(rel(got["logits"], reference["logits"])),
        "loss": figure(rel(got["loss"], reference["loss"])),
        "grads_all": figure(everything),
        "grads_worst": figure(per_parameter[worst]),
        "grads_worst_parameter": worst,
        "nonfinite": not all(torch.isfinite(g).all() for g in got["grads"].values()),
    }


def figure(value: float) -> float:
    return float(f"{value:.3g}")


if __name__ == "__main__":
    main(*sys.argv[1:4])

"""Issue #45's CUDA path, in about a minute: `--packing` through torch's own varlen kernel (sdpa in bf16, no
flash-attn package), on SmolLM2-135M's shape (a Llama, 9 query heads over 3 key/value heads; random
weights) and random documents of 32 to 1,024 tokens packed into 2,048:

- the kernel against its reference (`reference_causal_varlen_attention`, the same bf16 inputs), with and
  without a sliding window: ||kernel - reference|| / ||reference||;
- a packed micro-batch in bf16 autocast, through the kernel and through the block-causal mask, against
  its documents run alone (sdpa, bf16 autocast): the summed loss and every gradient, relative;
- a training step's time and peak memory over the same documents: packed through the kernel, packed
  through the mask, and unpacked (the documents as padded rows, 8 to a micro-batch).

With `--runs TOKENIZER_DIR` (a ChatML tokenizer: benchmarks/gpu_prepare.sh writes .gpu/chatml), instead:
the same model shape trained end to end on generated chats, `--packing` and not, in bf16: which attention
each run resolved (train_config.json), its losses and speed (results.json).

From the repository root (after benchmarks/gpu_setup.sh on a lent GPU; on a CPU, a small smoke run of the
script in fp32, where the kernel's reference stands in for it):

    python3 benchmarks/gpu_sft.py OUT_JSON [--layers 30] [--runs TOKENIZER_DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, ".")
from finetune.families.causal_lm.batches import CausalLmCollator  # noqa: E402
from finetune.families.causal_lm.conversations import IGNORE  # noqa: E402
from finetune.families.causal_lm.packing import (  # noqa: E402
    PackedAttention,
    PackedCollator,
    forward_inputs,
    pack_rows,
    packed_attention,
)
from finetune.speed.attention import (  # noqa: E402
    causal_varlen_attention,
    reference_causal_varlen_attention,
    use_causal_varlen_attention,
)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
CAPACITY = 2048 if CUDA else 256


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_json")
    parser.add_argument("--layers", type=int, default=30 if CUDA else 2)
    parser.add_argument("--runs", metavar="TOKENIZER_DIR", help="whole runs, packed and not (see above)")
    args = parser.parse_args()
    device = torch.cuda.get_device_name() if CUDA else "cpu (smoke run)"
    results = {"device": device, "torch": torch.__version__, "capacity_tokens": CAPACITY}
    if args.runs:
        results["runs"] = whole_runs(args.runs, args.layers)
        Path(args.out_json).write_text(json.dumps(results, indent=2))
        return
    results["kernel_vs_reference"] = kernel_vs_reference()
    print(json.dumps(results["kernel_vs_reference"]), flush=True)
    config = smollm2_shape(49152 if CUDA else 1000, args.layers)
    rows = documents(config.vocab_size, 64 if CUDA else 16, 32, CAPACITY // 2)
    packed, _ = pack_rows(Dataset.from_list(rows), CAPACITY, seed=0)
    features = [
        {k: packed[i][k] for k in ("input_ids", "labels", "document_lengths")} for i in range(len(packed))
    ]
    pad = 0
    varlen_batch = PackedCollator(CausalLmCollator(pad, 8, CAPACITY), True, CAPACITY)(features)
    mask_batch = PackedCollator(CausalLmCollator(pad, 8, CAPACITY), False, CAPACITY)(features)
    results["documents"], results["packs"] = len(rows), len(packed)
    results["tokens"] = sum(r["length"] for r in rows)

    torch.manual_seed(0)
    plain = LlamaForCausalLM(config).to(DEVICE)
    kernel = LlamaForCausalLM(config).to(DEVICE)
    kernel.load_state_dict(plain.state_dict())
    plan = packed_attention(kernel, CAPACITY, DEVICE, half=CUDA)
    results["plan"] = {"varlen": plan.varlen, "torch_kernel": plan.torch_kernel}
    kernel_plan = PackedAttention(varlen=True, torch_kernel=True)
    use_causal_varlen_attention(kernel)
    mask_plan = PackedAttention(varlen=False)

    alone = loss_and_grads(plain, lambda m: alone_loss(m, varlen_batch))
    results["packed_vs_alone"] = {
        "kernel": compare(loss_and_grads(kernel, lambda m: packed_loss(m, varlen_batch, kernel_plan)), alone),
        "mask": compare(loss_and_grads(plain, lambda m: packed_loss(m, mask_batch, mask_plan)), alone),
    }
    print(json.dumps(results["packed_vs_alone"]), flush=True)

    unpacked = [CausalLmCollator(pad, 8, CAPACITY)(rows[i : i + 8]) for i in range(0, len(rows), 8)]
    results["step"] = {
        "packed_kernel": timed(kernel, lambda m: packed_loss(m, varlen_batch, kernel_plan)),
        "packed_mask": timed(plain, lambda m: packed_loss(m, mask_batch, mask_plan)),
        "unpacked": timed(plain, lambda m: sum(padded_loss(m, b) for b in unpacked)),
    }
    print(json.dumps(results["step"]), flush=True)
    Path(args.out_json).write_text(json.dumps(results, indent=2))


def smollm2_shape(vocab: int, layers: int) -> LlamaConfig:
    if not CUDA:  # the smoke run's
        return LlamaConfig(
            vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa",
        )  # fmt: skip
    return LlamaConfig(
        vocab_size=vocab, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=CAPACITY,
        tie_word_embeddings=True, attn_implementation="sdpa",
    )  # fmt: skip


def whole_runs(tokenizer_dir: str, layers: int) -> dict:
    """`python -m finetune --task_type causal_lm` on generated chats, packed and not: what each resolved
    and measured."""
    import subprocess
    import tempfile

    from transformers import AutoTokenizer

    from finetune.demo_sft import conversations

    work = Path(tempfile.mkdtemp(prefix="gpu_sft_"))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = smollm2_shape(len(tokenizer), layers)
    config.pad_token_id = config.eos_token_id = config.bos_token_id = tokenizer.eos_token_id
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(work / "model")
    tokenizer.save_pretrained(work / "model")
    for split, count, seed in (("train", 2000 if CUDA else 64, 0), ("validation", 200 if CUDA else 16, 1)):
        lines = (json.dumps(row) for row in conversations(count, seed))
        (work / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    runs = {}
    for name, extra in (("packed", ["--packing"]), ("unpacked", [])):
        out = work / name
        command = [sys.executable, "-m", "finetune", "--task_type", "causal_lm", "--model_name_or_path",
                   str(work / "model"), "--train_file", str(work / "train.jsonl"), "--validation_file",
                   str(work / "validation.jsonl"), "--output_dir", str(out), "--max_length", "512",
                   "--per_device_train_batch_size", "8", "--learning_rate", "1e-3", "--num_train_epochs", "1",
                   "--mixed_precision", "bf16" if CUDA else "no", "--report_to", "none", "--save_plots",
                   "false", *extra]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            runs[name] = {"exit": done.returncode, "stderr": done.stderr[-2000:]}
            continue
        resolved = json.loads((out / "train_config.json").read_text())["resolved"]
        results = json.loads((out / "results.json").read_text())
        losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").open() if '"loss"' in line]
        runs[name] = {
            "attn_implementation": resolved["attn_implementation"],
            "first_losses": [round(x, 4) for x in losses[:3]], "last_loss": round(losses[-1], 4),
            **{k: results.get(k) for k in ("eval_loss", "global_step", "train_samples_per_second",
                                           "train_tokens_per_second", "train_runtime_s", "mixed_precision")},
        }  # fmt: skip
        print(name, json.dumps(runs[name]), flush=True)
    return runs


def documents(vocab: int, count: int, shortest: int, longest: int) -> list[dict]:
    rng = random.Random(0)
    rows = []
    for _ in range(count):
        length = rng.randint(shortest, longest)
        ids = [rng.randrange(5, vocab) for _ in range(length)]
        prompt = rng.randint(1, length // 2)  # a prompt, then its completion's targets
        rows.append({"input_ids": ids, "labels": [IGNORE] * prompt + ids[prompt:], "length": length})
    return rows


def kernel_vs_reference() -> dict:
    """The attention function alone: queries [tokens, 9 heads, 64] over 3 key/value heads."""
    generator = torch.Generator().manual_seed(0)
    lengths = [300, 1, 77, 1024, 500, 146] if CUDA else [30, 1, 7, 40]
    bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    tokens = bounds[-1].item()
    dtype = torch.bfloat16 if CUDA else torch.float32
    q, k, v = (
        torch.randn(1, heads, tokens, 64, generator=generator).to(DEVICE, dtype) for heads in (9, 3, 3)
    )
    figures = {}
    for window in (None, 64):
        got, _ = causal_varlen_attention(
            None, q, k, v, None, scaling=0.125, sliding_window=window, cu_seq_lens_q=bounds.to(DEVICE),
            cu_seq_lens_k=bounds.to(DEVICE), max_length_q=max(lengths), max_length_k=max(lengths),
        )  # fmt: skip
        left = window - 1 if window else -1
        reference = reference_causal_varlen_attention(
            *(t[0].transpose(0, 1).float() for t in (q, k, v)), bounds.to(DEVICE), 0.125, left
        )
        figures[f"window_{window}"] = relative(got[0].float(), reference)
    return figures


def autocast():
    return torch.autocast("cuda", dtype=torch.bfloat16) if CUDA else nullcontext()


def on_device(batch: dict) -> dict:
    return {k: v.to(DEVICE) if torch.is_tensor(v) else v for k, v in batch.items()}


def packed_loss(model, batch: dict, plan: PackedAttention) -> torch.Tensor:
    batch = on_device(batch)
    with autocast():
        logits = model(**forward_inputs(batch, plan)).logits
    return F.cross_entropy(
        logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=IGNORE, reduction="sum"
    )


def alone_loss(model, varlen_batch: dict) -> torch.Tensor:
    batch = on_device(varlen_batch)
    bounds = batch["cu_seq_lens_q"].tolist()
    total = 0.0
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        with autocast():
            logits = model(input_ids=batch["input_ids"][:, start:end]).logits[0]
        labels = batch["labels"][0, start:end]
        total = total + F.cross_entropy(logits.float(), labels, ignore_index=IGNORE, reduction="sum")
    return total


def padded_loss(model, batch: dict) -> torch.Tensor:
    batch = on_device(batch)
    with autocast():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return F.cross_entropy(
        logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=IGNORE, reduction="sum"
    )


def loss_and_grads(model, loss_of) -> dict:
    model.zero_grad(set_to_none=True)
    loss = loss_of(model)
    loss.backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"loss": loss.detach().float(), "grads": grads}


def compare(got: dict, reference: dict) -> dict:
    per_parameter = {n: relative(got["grads"][n], g) for n, g in reference["grads"].items() if g.norm() > 0}
    worst = max(per_parameter, key=per_parameter.get)
    return {"loss": relative(got["loss"], reference["loss"]), "grads_worst": per_parameter[worst],
            "grads_worst_parameter": worst}  # fmt: skip


def timed(model, loss_of, repeats: int = 5) -> dict:
    """Median seconds of forward and backward over the documents, and peak memory (CUDA)."""
    seconds = []
    if CUDA:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    for attempt in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        loss_of(model).backward()
        if CUDA:
            torch.cuda.synchronize()
        if attempt:  # the first warms up
            seconds.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if CUDA else None
    return {"step_s": round(sorted(seconds)[len(seconds) // 2], 4), "peak_gib": peak and round(peak, 2)}


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(f"{float((a - b).norm() / b.norm().clamp_min(1e-30)):.3g}")


if __name__ == "__main__":
    main()

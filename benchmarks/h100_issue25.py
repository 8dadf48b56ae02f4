"""Issue #25 on a GPU, in one command: ms per BERT-base training step, host waits and CPU-vs-CUDA time
per step for padded (multiples of 8, today's CUDA default), buckets of 32, buckets + torch.compile
(default and reduce-overhead), and --padding_free varlen (eager and compiled). docs/benchmarks.md says
whether it has been run and what it found. From the repository root, after benchmarks/h100_setup.sh:

    python3 benchmarks/h100_issue25.py /tmp/bert-base <mnli folder> <output folder> [steps]

Writes <output folder>/issue25.json. Each variant uses the loop's own pieces (collators, attention
paths, compile settings, the device-side NaN guard of fused AdamW): a step is forward, loss, backward,
clipping, the guarded AdamW step. `host_syncs` counts the synchronizing CUDA calls torch reports in
sync-debug mode over the timed steps (0 is the goal); `cpu_ms`/`cuda_ms` per step come from
torch.profiler (self CPU time of every op against CUDA kernel time): a step bound by launching kernels
shows cpu_ms >= cuda_ms.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

sys.path.insert(0, ".")
from finetune.data.batching import LengthGroupedSampler, PadCollator, VarlenCollator  # noqa: E402
from finetune.data.tasks import GLUE_TASKS  # noqa: E402
from finetune.model.optimizer import build_optimizer  # noqa: E402
from finetune.speed.attention import use_sync_free_masks, use_varlen_attention  # noqa: E402
from finetune.training.evaluation import loss_sum  # noqa: E402

VARIANTS = {  # name: (pad_to_multiple_of, varlen, torch.compile mode or None)
    "padded_8_eager": (8, False, None),
    "buckets_32_eager": (32, False, None),
    "buckets_32_compile_default": (32, False, "default"),
    "buckets_32_compile_reduce_overhead": (32, False, "reduce-overhead"),
    "varlen_32_eager": (32, True, None),
    "varlen_32_compile_default": (32, True, "default"),
}


def main(model_dir: str, data_dir: str, out: str, steps: int = 100, batch_size: int = 32) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with open(f"{data_dir}/train.jsonl") as lines:
        rows = [json.loads(line) for line in lines][:8192]
    encoded = tokenizer([r["premise"] for r in rows], [r["hypothesis"] for r in rows], truncation=True,
                        max_length=128)  # fmt: skip
    features = [
        {"input_ids": ids, "token_type_ids": types, "labels": row["label"]}
        for ids, types, row in zip(encoded["input_ids"], encoded["token_type_ids"], rows, strict=True)
    ]
    order = list(LengthGroupedSampler([len(f["input_ids"]) for f in features], batch_size, seed=0))
    groups = [order[s : s + batch_size] for s in range(0, len(order) - batch_size + 1, batch_size)]
    results = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "steps": steps}
    for name, (multiple, varlen, mode) in VARIANTS.items():
        if mode is not None and device.type != "cuda":
            continue  # inductor on CPU takes minutes and is not what this measures
        results[name] = measure(model_dir, tokenizer, features, groups, device, multiple, varlen, mode, steps)
        print(name, results[name], flush=True)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "issue25.json").write_text(json.dumps(results, indent=2))


def measure(model_dir, tokenizer, features, groups, device, multiple, varlen, mode, steps) -> dict:
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=3).to(device)
    if varlen:
        use_varlen_attention(model)
        collate = VarlenCollator(tokenizer, multiple, 128)
    else:
        use_sync_free_masks(model)
        collate = PadCollator(tokenizer, multiple, 128)
    model.train()
    optimizer = build_optimizer(model, 1e-5, 0.01)
    task = GLUE_TASKS["mnli"]
    first_nonfinite = torch.zeros((), dtype=torch.int64, device=device)

    def forward_loss(batch, labels):
        return loss_sum(model(**batch).logits, labels, task)

    compiled = torch.compile(forward_loss, mode=mode, dynamic=False) if mode else forward_loss
    batches = [collate([features[i] for i in group]) for group in groups]
    batches = [{k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in b.items()}
               for b in batches]  # fmt: skip
    shapes = {tuple(b["input_ids"].shape) for b in batches}

    def step(index: int, batch: dict):
        batch = dict(batch)
        labels = batch.pop("labels")
        (compiled(batch, labels) / labels.shape[0]).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        nonfinite = ~torch.isfinite(norm)
        first_nonfinite.copy_(torch.where(nonfinite & (first_nonfinite == 0), index + 1, first_nonfinite))
        optimizer.found_inf = nonfinite.float()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    compile_tic = time.perf_counter()
    for i, batch in enumerate(batches[: max(40, len(shapes) * 3)]):  # every shape compiled, warm
        step(i, batch)
    synchronize(device)
    warmup_s = time.perf_counter() - compile_tic
    timed = [batches[i % len(batches)] for i in range(steps)]
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tic = time.perf_counter()
        for i, batch in enumerate(timed):
            step(i, batch)
        synchronize(device)
        step_ms = (time.perf_counter() - tic) * 1000 / steps
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode("default")
    host_syncs = sum("synchroniz" in str(w.message) for w in caught)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiled = timed[:20]
    with torch.profiler.profile(activities=activities) as profile:
        for i, batch in enumerate(profiled):
            step(i, batch)
        synchronize(device)
    events = profile.key_averages()
    cpu_ms = sum(e.self_cpu_time_total for e in events) / 1000 / len(profiled)
    cuda_ms = sum(getattr(e, "self_device_time_total", 0) for e in events) / 1000 / len(profiled)
    return {
        "ms_per_step": round(step_ms, 3),
        "warmup_s": round(warmup_s, 1),
        "distinct_shapes": len(shapes),
        "host_syncs": host_syncs,
        "cpu_ms_per_step": round(cpu_ms, 3),
        "cuda_ms_per_step": round(cuda_ms, 3),
        "first_nonfinite_step": int(first_nonfinite),
        "compile_cache_hits": torch._dynamo.utils.counters["inductor"]["fxgraph_cache_hit"],
    }


def synchronize(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], *(int(a) for a in sys.argv[4:5]))

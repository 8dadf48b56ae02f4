"""Issue #35 on a GPU, in one command: ms per BERT-base training step for each step variant, with host
waits, CPU-vs-CUDA time, the top kernels and useful-token MFU; then evaluation of the validation rows at
several evaluation batches. From the repository root, after benchmarks/gpu_setup.sh:

    python3 benchmarks/gpu_steps.py MODEL_DIR MNLI_DIR OUT_JSON [--budget_s 200]

Variants run in the order below and are skipped once --budget_s is spent, so the most telling come
first. Each uses the loop's own pieces (collators, attention paths, bf16 autocast as Accelerate applies
it, static-shape compile as `finetune.speed.compile` sets it up, the fused AdamW's device-side NaN guard):
a step is forward, loss, backward, clipping, the guarded AdamW step. `host_syncs` counts the
synchronizing CUDA calls torch reports in sync-debug mode over the timed steps (0 is the goal);
`cpu_ms`/`cuda_ms` per step come from torch.profiler (self CPU time of every op against kernel time): a
step bound by launching kernels shows cpu_ms >= cuda_ms. The JSON is rewritten after every variant.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

sys.path.insert(0, ".")
from finetune.data.batching import LengthGroupedSampler, PadCollator, VarlenCollator  # noqa: E402
from finetune.data.tasks import GLUE_TASKS  # noqa: E402
from finetune.families.sequence_classification.evaluation import loss_sum  # noqa: E402
from finetune.families.sequence_classification.graphed_step import graph_inputs, graphed_steps  # noqa: E402
from finetune.model.flops import non_embedding_parameters  # noqa: E402
from finetune.model.optimizer import build_optimizer  # noqa: E402
from finetune.speed.attention import use_sync_free_masks, use_varlen_attention  # noqa: E402

# name: (batch, pad_to_multiple_of, varlen, torch.compile mode, "graphs" (the toolkit's --cuda_graphs) or
# None); most telling first.
# Eager variants take seconds, compiled ones about a minute and a half each (H200, 2026-11-26): eager first.
VARIANTS = {
    "b32_padded_8_eager": (32, 8, False, None),  # the CUDA default
    "b32_varlen_eager": (32, 32, True, None),
    "b32_buckets_32_eager": (32, 32, False, None),
    "b256_padded_8_eager": (256, 8, False, None),
    "b256_varlen_eager": (256, 32, True, None),
    "b32_padded_8_graphs": (32, 8, False, "graphs"),  # --cuda_graphs: eager kernels replayed, no compile
    "b32_buckets_32_graphs": (32, 32, False, "graphs"),
    "b256_padded_8_graphs": (256, 8, False, "graphs"),
    "b32_buckets_32_reduce_overhead": (32, 32, False, "reduce-overhead"),
    "b256_buckets_32_reduce_overhead": (256, 32, False, "reduce-overhead"),
    "b32_buckets_32_compile_default": (32, 32, False, "default"),
}
EVAL_BATCHES = (64, 256, 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("data_dir")
    parser.add_argument("out_json")
    parser.add_argument("--steps", type=int, default=100, help="timed steps at batch 32 (fewer at larger)")
    parser.add_argument("--budget_s", type=float, default=200.0, help="no variant starts after this")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rows", type=int, default=None, help="the first rows of each split only")
    args = parser.parse_args()
    started = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: a smoke test only
    torch.backends.cuda.matmul.allow_tf32 = True
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    train = encode(tokenizer, f"{args.data_dir}/train.jsonl")[: args.rows]
    validation = encode(tokenizer, f"{args.data_dir}/validation_matched.jsonl")[: args.rows]
    with torch.device("meta"):  # shapes only
        shape = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(args.model_dir))
    results = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "non_embedding_parameters": non_embedding_parameters(shape),
        "bf16_matmul_peak_tflops": round(matmul_peak_tflops(device), 1),
        "variants": {},
    }
    out = Path(args.out_json)
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.variants.split(","):
        if time.perf_counter() - started > args.budget_s:
            results["variants"][name] = {"skipped": "out of --budget_s"}
            continue
        batch, multiple, varlen, mode = VARIANTS[name]
        if mode and device.type == "cpu":  # graphs: CUDA only
            continue  # inductor on CPU takes minutes and is not what this measures
        steps = args.steps if batch <= 32 else max(20, args.steps * 32 // batch * 2)
        try:
            measured = measure(args.model_dir, tokenizer, train, device, batch, multiple, varlen, mode, steps)
            flops_per_token = 6 * results["non_embedding_parameters"]
            tflops = measured["real_tokens_per_s"] * flops_per_token / 1e12
            measured["useful_tflops"] = round(tflops, 1)
            measured["mfu"] = round(tflops / results["bf16_matmul_peak_tflops"], 4)
        except Exception as error:  # one variant failing says so and leaves the others measured
            measured = {"error": f"{type(error).__name__}: {str(error)[:600]}"}
        results["variants"][name] = measured
        print(name, {k: v for k, v in measured.items() if k != "top_kernels"}, flush=True)
        out.write_text(json.dumps(results, indent=2))
    if time.perf_counter() - started < args.budget_s + 60:
        results["evaluation"] = evaluation(args.model_dir, tokenizer, validation, device)
        print("evaluation", results["evaluation"], flush=True)
    out.write_text(json.dumps(results, indent=2))


def encode(tokenizer, path: str) -> list[dict]:
    with open(path) as lines:
        rows = [json.loads(line) for line in lines]
    encoded = tokenizer([r["premise"] for r in rows], [r["hypothesis"] for r in rows], truncation=True,
                        max_length=128)  # fmt: skip
    # The toolkit's tokenized columns: without attention_mask the padded model would attend to padding.
    columns = ("input_ids", "token_type_ids", "attention_mask")
    return [{**{c: encoded[c][i] for c in columns}, "labels": row["label"]} for i, row in enumerate(rows)]


def matmul_peak_tflops(device, size: int = 8192, repeats: int = 20) -> float:
    """bf16 matrix product on random data, timed after warm-up: this card's ceiling."""
    size, repeats = (size, repeats) if device.type == "cuda" else (512, 3)
    a, b = (torch.randn(size, size, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    synchronize(device)
    tic = time.perf_counter()
    for _ in range(repeats):
        a @ b
    synchronize(device)
    return 2 * size**3 * repeats / (time.perf_counter() - tic) / 1e12


def synchronize(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def load_model(model_dir, device, varlen: bool):
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=3).to(device)
    if varlen:
        use_varlen_attention(model)
    else:
        use_sync_free_masks(model)
    return model


def collator(tokenizer, multiple: int, varlen: bool):
    return VarlenCollator(tokenizer, multiple, 128) if varlen else PadCollator(tokenizer, multiple, 128)


def measure(model_dir, tokenizer, features, device, batch_size, multiple, varlen, mode, steps) -> dict:
    torch._dynamo.reset()
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 24)
    model = load_model(model_dir, device, varlen)
    model.train()
    collate = collator(tokenizer, multiple, varlen)
    optimizer = build_optimizer(model, 1e-5, 0.01)
    task = GLUE_TASKS["mnli"]
    first_nonfinite = torch.zeros((), dtype=torch.int64, device=device)

    def forward_loss(batch, labels):
        with torch.autocast(device.type, dtype=torch.bfloat16):  # what Accelerate's bf16 wraps forward in
            logits = model(**batch).logits
        return loss_sum(logits, labels, task)

    compiling = mode not in (None, "graphs")
    compiled = torch.compile(forward_loss, mode=mode, dynamic=False) if compiling else forward_loss
    graphs = None
    if mode == "graphs":  # as the toolkit runs it: Accelerate's bf16 autocast around forward
        model.forward = torch.autocast(device.type, dtype=torch.bfloat16)(model.forward)
        accelerator = SimpleNamespace(backward=lambda loss: loss.backward(), is_main_process=True)
        graphed = SimpleNamespace(cuda_graphs="true", per_device_train_batch_size=batch_size)
        graphs = graphed_steps(graphed, graphed, accelerator, model, task)  # strict: "true" as asked
    order = list(LengthGroupedSampler([len(f["input_ids"]) for f in features], batch_size, seed=0))
    groups = [order[s : s + batch_size] for s in range(0, len(order) - batch_size + 1, batch_size)]
    batches = [collate([features[i] for i in group]) for group in groups]
    real_tokens = [sum(len(features[i]["input_ids"]) for i in group) for group in groups]
    batches = [{k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in b.items()}
               for b in batches]  # fmt: skip
    shapes = {tuple(b["input_ids"].shape) for b in batches}

    def step(index: int, batch: dict):
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        batch = dict(batch)
        labels = batch.pop("labels")
        if graphs is not None:
            graphs.forward_backward(graph_inputs(batch, labels, None))
        else:
            (compiled(batch, labels) / labels.shape[0]).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        nonfinite = ~torch.isfinite(norm)
        first_nonfinite.copy_(torch.where(nonfinite & (first_nonfinite == 0), index + 1, first_nonfinite))
        optimizer.found_inf = nonfinite.float()
        optimizer.step()
        if graphs is None:
            optimizer.zero_grad(set_to_none=True)

    # Every shape met (compiled, CUDA graphs recorded) before timing: the longest batches first.
    by_shape = {}
    for i, b in enumerate(batches):
        by_shape.setdefault(tuple(b["input_ids"].shape), i)
    warm = list(by_shape.values()) * 3 if mode else list(range(min(len(batches), 20)))
    tic = time.perf_counter()
    for n, i in enumerate(warm[:60]):
        step(n, batches[i])
    synchronize(device)
    warmup_s = time.perf_counter() - tic
    timed = [i % len(batches) for i in range(steps)]
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode("warn")
    rounds_ms = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):  # three rounds over the same steps: the median, and the spread
            tic = time.perf_counter()
            for n, i in enumerate(timed):
                step(n, batches[i])
            synchronize(device)
            rounds_ms.append((time.perf_counter() - tic) * 1000 / steps)
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode("default")
    host_syncs = sum("synchroniz" in str(w.message) for w in caught) // 3
    profiled = timed[:20]
    activities = [torch.profiler.ProfilerActivity.CPU]
    activities += [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []
    with torch.profiler.profile(activities=activities) as profile:
        for n, i in enumerate(profiled):
            step(n, batches[i])
        synchronize(device)
    events = profile.key_averages()
    cpu_ms = sum(e.self_cpu_time_total for e in events) / 1000 / len(profiled)
    cuda_ms = sum(getattr(e, "self_device_time_total", 0) for e in events) / 1000 / len(profiled)
    top = sorted(events, key=lambda e: getattr(e, "self_device_time_total", 0), reverse=True)[:8]
    ms = statistics.median(rounds_ms)
    tokens_per_step = sum(real_tokens[i] for i in timed) / steps
    return {
        "batch": batch_size,
        "ms_per_step": round(ms, 3),
        "ms_per_step_rounds": [round(r, 3) for r in rounds_ms],
        "samples_per_s": round(batch_size * 1000 / ms, 1),
        "real_tokens_per_s": round(tokens_per_step * 1000 / ms),
        "padded_tokens_per_step": round(sum(batches[i]["input_ids"].numel() for i in timed) / steps),
        "real_tokens_per_step": round(tokens_per_step),
        "warmup_s": round(warmup_s, 1),
        "distinct_shapes": len(shapes),
        "host_syncs_per_round": host_syncs,
        "cpu_ms_per_step": round(cpu_ms, 3),
        "cuda_ms_per_step": round(cuda_ms, 3),
        "first_nonfinite_step": int(first_nonfinite),
        "peak_gpu_mb": round(torch.cuda.max_memory_allocated() / 2**20) if device.type == "cuda" else None,
        "top_kernels": [
            {"name": e.key[:90], "ms_per_step": round(getattr(e, "self_device_time_total", 0) / 1000 / 20, 3)}
            for e in top
        ],
    }


def evaluation(model_dir, tokenizer, features, device) -> dict:
    """Seconds to evaluate every validation row (sorted by length, as the toolkit's loader does),
    collation and copies included, at each evaluation batch; bf16 autocast, padded to 8, and varlen."""
    order = sorted(range(len(features)), key=lambda i: len(features[i]["input_ids"]))
    timings = {}
    for varlen in (False, True):
        model = load_model(model_dir, device, varlen).eval()
        collate = collator(tokenizer, 32 if varlen else 8, varlen)
        for batch_size in EVAL_BATCHES:
            runs = []
            for _ in range(2):  # the first meets new shapes; the second is what a later evaluation costs
                synchronize(device)
                tic = time.perf_counter()
                with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16):
                    outputs = []
                    for s in range(0, len(order), batch_size):
                        batch = collate([features[i] for i in order[s : s + batch_size]])
                        batch.pop("labels")
                        batch = {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v
                                 for k, v in batch.items()}  # fmt: skip
                        outputs.append(model(**batch).logits.float())
                    torch.cat(outputs).cpu()
                runs.append(round(time.perf_counter() - tic, 3))
            timings[f"{'varlen' if varlen else 'padded_8'}_batch_{batch_size}_s"] = runs
    return {"rows": len(features), **timings}


if __name__ == "__main__":
    main()

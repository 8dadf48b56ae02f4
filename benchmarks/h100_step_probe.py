"""The H100 step probe of 2026-11-24 (docs/results/h100/step_probe.json): ms per BERT-base training
step under variants, on the same length-grouped batches. Run from the repository root after
benchmarks/gpu_setup.sh:

    python3 benchmarks/h100_step_probe.py /tmp/bert-base <mnli folder> <output folder>
"""

import json
import math
import sys
import time

import torch
import torch.nn.functional as F
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

sys.path.insert(0, ".")
from finetune.data.batching import LengthGroupedSampler  # noqa: E402
from finetune.model.flops import non_embedding_parameters  # noqa: E402
from finetune.model.optimizer import build_optimizer  # noqa: E402
from finetune.speed.padding_free import use_padding_free  # noqa: E402

model_dir, data_dir, out = sys.argv[1], sys.argv[2], sys.argv[3]
torch.backends.cuda.matmul.allow_tf32 = True
tok = AutoTokenizer.from_pretrained(model_dir)
with open(f"{data_dir}/train.jsonl") as lines:
    rows = [json.loads(line) for line in lines][:8192]
enc = tok([r["premise"] for r in rows], [r["hypothesis"] for r in rows], truncation=True, max_length=128)
feats = [
    {
        "input_ids": enc["input_ids"][i],
        "token_type_ids": enc["token_type_ids"][i],
        "attention_mask": enc["attention_mask"][i],
        "labels": rows[i]["label"],
    }
    for i in range(len(rows))
]
lengths = [len(f["input_ids"]) for f in feats]
collate = DataCollatorWithPadding(tok, pad_to_multiple_of=8)


def batches(bs):
    order = list(LengthGroupedSampler(lengths, bs, seed=0))
    return [collate([feats[i] for i in order[s : s + bs]]) for s in range(0, len(order) - bs + 1, bs)]


results = []


def run(name, bs=32, compile_kw=None, sync=True, padding_free=False, steps=100, warm_steps=20):
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=3).cuda()
    if padding_free:
        use_padding_free(model)
    model.train()
    opt = build_optimizer(model, 1e-5, 0.01)
    fwd = torch.compile(model, **compile_kw) if compile_kw is not None else model
    bl = [{k: v.cuda(non_blocking=True) for k, v in b.items()} for b in batches(bs)]
    n = 6 * non_embedding_parameters(model)

    def step(b):
        inp = {k: v for k, v in b.items() if k != "labels"}
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = fwd(**inp).logits
        F.cross_entropy(logits.float(), b["labels"]).backward()
        g = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if sync and not math.isfinite(g):
            raise RuntimeError
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    first = []
    seen = set()
    for b in bl[:warm_steps]:  # warm-up: compile, shapes
        s0 = time.perf_counter()
        step(b)
        torch.cuda.synchronize()
        shape = tuple(b["input_ids"].shape)
        first.append((shape[1], shape not in seen, round((time.perf_counter() - s0) * 1e3, 1)))
        seen.add(shape)
    warm = time.perf_counter() - t0
    timed = bl[20 : 20 + steps]
    t0 = time.perf_counter()
    for b in timed:
        step(b)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / len(timed)
    real = sum(int(b["attention_mask"].sum()) for b in timed) / len(timed)
    r = {
        "name": name,
        "batch": bs,
        "ms_step": dt * 1e3,
        "samples_s": bs / dt,
        "real_tokens_s": real / dt,
        "tflops": n * real / dt / 1e12,
        "warmup_s": warm,
        "first": first,
    }
    results.append(r)
    print(json.dumps(r), flush=True)
    torch.cuda.empty_cache()


run("eager", warm_steps=100)
run("eager_again", warm_steps=30)
run("eager_nosync", sync=False)
run("eager_padding_free", padding_free=True)
run("eager_b128", bs=128, steps=25)
run("compile_dynamic", compile_kw={"dynamic": True}, warm_steps=100)
with open(f"{out}/probe.json", "w") as f:
    json.dump(results, f, indent=1)

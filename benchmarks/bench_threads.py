"""`make bench-threads`: torch's intra-op threads on cores that other jobs keep busy.

A new user on a shared 2-core machine saw the same 10 MiniLM steps take 171.8 s with torch's default
threads and 12.1 s with OMP_NUM_THREADS=1 while other jobs ran (#60). Which thread count to choose is
measured here: the same short MNLI run (MiniLM, --max_train_steps, no evaluation) as a whole process,
with 0, 1 and 2 neighbours (each a CPU-bound Python loop, as another job's training is), once with the
product's own choice (OMP_NUM_THREADS unset: a thread per free core, finetune/speed/threads.py) and once
with each thread count from torch's default (one per core this process may use) down to one.
Rounds alternate the order of the thread counts, so a drift of the machine favours neither.

Printed per (neighbours, threads): the median training seconds (results.json's train_runtime_s) and
whole-process seconds, the threads the run had, and each count's ratio against torch's default at the
same neighbours.

    python -m benchmarks.bench_threads [--steps 8] [--repeats 2] [--neighbours 0,1,2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench import SHARED_MNLI, _packaged_minilm

REPO = Path(__file__).resolve().parents[1]
BUSY_LOOP = "while True: pass"


def run_once(args, threads: int | None) -> dict:
    """One whole training process; `threads` None: the product's choice (OMP_NUM_THREADS unset)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    env["HF_HUB_OFFLINE"] = "1"
    with tempfile.TemporaryDirectory() as out:
        command = [
            sys.executable, "-m", "finetune", "--model_name_or_path", args.model,
            "--train_file", str(Path(args.data_dir) / "train.jsonl"),
            "--validation_file", str(Path(args.data_dir) / "validation_matched.jsonl"),
            "--output_dir", out, "--report_to", "none", "--eval_strategy", "no",
            "--max_train_steps", str(args.steps), "--per_device_train_batch_size", "16",
            "--max_train_samples", "2000", "--max_eval_samples", "16", "--logging_steps", "1000",
            "--save_plots", "false",
        ]  # fmt: skip
        started = time.perf_counter()
        done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True)
        whole_s = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"the run failed ({done.returncode}):\n{done.stderr[-2000:]}")
        results = json.loads((Path(out) / "results.json").read_text())
    return {
        "train_s": results["train_runtime_s"],
        "whole_s": whole_s,
        "threads": results.get("torch_threads"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--neighbours", default="0,1,2")
    parser.add_argument("--data_dir", default=str(SHARED_MNLI))
    parser.add_argument("--model", default=None, help="default: the packaged MiniLM")
    args = parser.parse_args()
    args.model = args.model or _packaged_minilm()
    cores = len(os.sched_getaffinity(0))
    choices = [None, *range(cores, 0, -1)]  # the product's choice, then torch's default (one per core) down
    figures: dict = {}
    for neighbours in [int(n) for n in args.neighbours.split(",")]:
        busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(neighbours)]
        try:
            time.sleep(2.0 if busy else 0.0)  # the loops running before the first run starts
            for round_ in range(args.repeats):
                for threads in choices if round_ % 2 == 0 else choices[::-1]:
                    measured = run_once(args, threads)
                    figures.setdefault((neighbours, threads), []).append(measured)
                    print(f"neighbours={neighbours} threads={threads or 'auto'}: {measured}", flush=True)
        finally:
            for process in busy:
                process.kill()
                process.wait()
    print(f"\n{cores} cores; {args.steps} steps of MiniLM on MNLI, batch 16; medians of {args.repeats}")
    print(f"neighbours  threads   train_s  whole_s  train vs {cores} threads (torch's default)")
    summary = []
    for (neighbours, threads), runs in figures.items():
        train_s = statistics.median(r["train_s"] for r in runs)
        whole_s = statistics.median(r["whole_s"] for r in runs)
        default = statistics.median(r["train_s"] for r in figures[(neighbours, cores)])
        ratio = train_s / default
        had = sorted({r["threads"] for r in runs})
        shown = threads or f"auto (ran {','.join(map(str, had))})"
        summary.append({"neighbours": neighbours, "threads": shown, "train_s": train_s, "whole_s": whole_s,
                        "train_vs_torch_default": ratio})  # fmt: skip
        print(f"{neighbours:>10}  {shown:>7}  {train_s:8.1f}  {whole_s:7.1f}  {ratio:6.2f}x")
    print(json.dumps({"cores": cores, "steps": args.steps, "repeats": args.repeats, "runs": summary}))


if __name__ == "__main__":
    main()
